"""Returns X as PROBS (labelled classes) and X * 10 as RAW (integers): classification tests."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PROBS", x), pb_utils.Tensor("RAW", (x * 10).astype(np.int32))]))
        return responses
