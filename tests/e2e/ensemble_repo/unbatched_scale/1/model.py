import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """U = 10 T, whatever T's shape (the model does not batch)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "T").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("U", values * 10)]))
        return responses
