import json
import os
import sys

import numpy as np

import metrics   # its own metrics.py, beside this file
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers with the args initialize received and the request's id, parameters and timeout."""

    def initialize(self, args):
        self.args = dict(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            seen = {"request_id": request.request_id(), "parameters": json.loads(request.parameters()),
                    "requested": sorted(request.requested_output_names()), "pid": os.getpid(),
                    "timeout": request.timeout(), "argv": sys.argv, "own_module": metrics.OWNER,
                    "model_dir": pb_utils.get_model_dir()}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=np.object_)),
                pb_utils.Tensor("ENV", np.array([json.dumps(seen).encode()], dtype=np.object_))]))
        return responses
