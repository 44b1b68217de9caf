import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams py_decoupled's responses through BLS: SEEN, every INDEX it saw; OUTPUTS, how many
    output tensors each response had (the last, the flags-only final one, has none); REPLAYED, how
    many a second loop over the same iterator gave."""

    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            call = pb_utils.InferenceRequest(model_name="py_decoupled", requested_output_names=["INDEX"],
                                             inputs=[pb_utils.Tensor("COUNT", count)])
            answers = call.exec(decoupled=True)
            stream = list(answers)
            replayed = len(list(answers))   # a loop after the final response replays them, as in Triton
            seen = [int(pb_utils.get_output_tensor_by_name(r, "INDEX").as_numpy()[0])
                    for r in stream if len(r.output_tensors()) > 0]   # as Triton's own examples check
            outputs = [len(r.output_tensors()) for r in stream]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.int32)),
                                                         pb_utils.Tensor("OUTPUTS", np.array(outputs, np.int32)),
                                                         pb_utils.Tensor("REPLAYED", np.array([replayed], np.int32))]))
        return responses
