"""Y = 2 * X after the config's ``delay_ms``; a negative X fails the request (a BACKEND failure)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(parameters.get("delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        time.sleep(self.delay_s)   # one execution takes this long, whatever its batch size
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("X must not be negative")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (2 * x).astype(np.float32))]))
        return responses
