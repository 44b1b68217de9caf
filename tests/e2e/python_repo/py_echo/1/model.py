import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers its input IN as OUT."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
