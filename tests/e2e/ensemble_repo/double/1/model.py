import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 X."""

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", values * 2)]))
        return responses
