"""A Python accumulator that keeps nothing itself: its running sum is implicit state.

OUTPUT = INPUT + INPUT_STATE (INPUT alone on START), and OUTPUT_STATE = OUTPUT, which the
server feeds back as INPUT_STATE of the sequence's next request.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = (value + np.where(start != 0, 0, state)).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("OUTPUT_STATE", total)]))
        return responses
