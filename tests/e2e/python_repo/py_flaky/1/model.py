import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """is_ready() answers what the last request asked it to: a model whose readiness changes."""

    def initialize(self, args):
        self.ready = True

    def is_ready(self):
        return self.ready

    def execute(self, requests):
        responses = []
        for request in requests:
            was = self.ready
            self.ready = bool(pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WAS", np.array([was]))]))
        return responses
