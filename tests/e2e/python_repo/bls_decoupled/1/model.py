import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams py_decoupled's responses through BLS and returns every INDEX it saw."""

    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            call = pb_utils.InferenceRequest(model_name="py_decoupled", requested_output_names=["INDEX"],
                                             inputs=[pb_utils.Tensor("COUNT", count)])
            seen = [int(pb_utils.get_output_tensor_by_name(r, "INDEX").as_numpy()[0])
                    for r in call.exec(decoupled=True)]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.int32))]))
        return responses
