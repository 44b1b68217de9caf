"""Returns X as PROBS (labelled classes), X * 10 as RAW (integers), X as HALF (FP16) and X > 0.5 as
FLAG (BOOL): classification tests."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PROBS", x), pb_utils.Tensor("RAW", (x * 10).astype(np.int32)),
                 pb_utils.Tensor("HALF", x.astype(np.float16)), pb_utils.Tensor("FLAG", x > 0.5)]))
        return responses
