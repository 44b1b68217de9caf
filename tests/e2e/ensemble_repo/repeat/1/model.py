import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: X[0, 0] responses, Y = X + i for i = 0, 1, ..., then the final flag."""

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            for i in range(int(values[0, 0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", values + i)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
