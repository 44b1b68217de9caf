"""Upper-cases text_input and says how long it was; echoes the 'suffix' parameter: generate tests."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            suffix = json.loads(request.parameters()).get("suffix", "")
            out = text.decode().upper() + str(suffix)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([out.encode()], dtype=np.object_)),
                pb_utils.Tensor("length", np.array([len(text)], dtype=np.int32)),
            ]))
        return responses
