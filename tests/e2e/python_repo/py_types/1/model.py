import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BYTES are upper-cased, numbers change, booleans flip: each type goes both ways."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "IN_BYTES").as_numpy()
            numbers = pb_utils.get_input_tensor_by_name(request, "IN_INT32").as_numpy()
            flags = pb_utils.get_input_tensor_by_name(request, "IN_BOOL").as_numpy()
            halves = pb_utils.get_input_tensor_by_name(request, "IN_FP16").as_numpy()
            big = pb_utils.get_input_tensor_by_name(request, "IN_UINT64").as_numpy()
            numbers += 1  # inputs are writable, as in Triton
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT_BYTES", np.array([t.upper() for t in text], dtype=np.object_)),
                pb_utils.Tensor("OUT_INT32", numbers),
                pb_utils.Tensor("OUT_BOOL", ~flags),
                pb_utils.Tensor("OUT_FP16", halves * 2),
                pb_utils.Tensor("OUT_UINT64", big - 1),
            ]))
        return responses
