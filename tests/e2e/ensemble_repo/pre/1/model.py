import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """X = IN + 1."""

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("X", values + 1)]))
        return responses
