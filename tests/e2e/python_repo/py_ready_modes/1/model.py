import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """is_ready() as the last request's MODE says: 0 True; 1 a string (not a boolean); 2 True
    after 6 s (past Triton's 5 s wait). WAS: the instance's process id, to see it was not restarted."""

    def initialize(self, args):
        self.mode = 0

    def is_ready(self):
        if self.mode == 1:
            return "ready"
        if self.mode == 2:
            time.sleep(6)
        return True

    def execute(self, requests):
        responses = []
        for request in requests:
            self.mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WAS", np.array([os.getpid()], np.int32))]))
        return responses
