import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls the model named in MODEL (an add_sub) with A and A, and returns its OUTPUT0."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0].decode()
            call = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"calling {target} failed: {answer.error().message()}")))
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
