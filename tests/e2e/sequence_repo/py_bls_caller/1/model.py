"""A model without state of its own that runs its caller's sequence on py_accumulator (BLS).

It passes on the correlation id and START/END flags its request came with, as Triton's
``pb_utils.InferenceRequest(correlation_id=..., flags=...)`` allows.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="py_accumulator", inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                requested_output_names=["OUTPUT"], correlation_id=request.correlation_id(),
                flags=request.flags()).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.get_output_tensor_by_name(answer, "OUTPUT")]))
        return responses
