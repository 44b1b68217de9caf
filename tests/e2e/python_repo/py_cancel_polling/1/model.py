import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Not decoupled: works COUNT steps of 10 ms inside execute, stopping early once its client
    cancels (``request.is_cancelled()``), and answers INDEX, the steps done. COUNT 0 answers
    how many executions stopped early."""

    def initialize(self, args):
        self.stopped = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            done = self.stopped if count == 0 else self._work(request, count)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([done], np.int32))]))
        return responses

    def _work(self, request, count):
        for step in range(count):
            if request.is_cancelled():
                self.stopped += 1
                return step
            time.sleep(0.01)
        return count
