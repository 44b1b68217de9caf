import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SUM = Y + Z and DIFF = Z - Y; a negative Y fails the request (and only it)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            y = pb_utils.get_input_tensor_by_name(request, "Y").as_numpy()
            z = pb_utils.get_input_tensor_by_name(request, "Z").as_numpy()
            if (y < 0).any():
                error = pb_utils.TritonError("combine refuses negative values", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", y + z),
                                                         pb_utils.Tensor("DIFF", z - y)]))
        return responses
