"""Counts its executions: the first one after warmup reports how many ran before it."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        return [pb_utils.InferenceResponse([pb_utils.Tensor("EXECUTIONS", np.array([[self.executions]], dtype=np.int64))])
                for _ in requests]
