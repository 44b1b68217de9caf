import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls py_cancellable for 200 responses through BLS, reads COUNT of them, cancels the rest
    (ResponseIterator.cancel()) and reads on to the final response. Answers SEEN, the INDEX values
    read before the cancel, and AFTER, what came after it: each INDEX, -1 for a response without
    one (the final flag sent alone)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            call = pb_utils.InferenceRequest(model_name="py_cancellable", requested_output_names=["INDEX"],
                                             inputs=[pb_utils.Tensor("COUNT", np.array([200], np.int32))])
            stream = call.exec(decoupled=True)
            seen, after = [], []
            for response in stream:
                index = pb_utils.get_output_tensor_by_name(response, "INDEX")
                value = -1 if index is None else int(index.as_numpy()[0])
                (after if len(seen) == wanted else seen).append(value)
                if len(seen) == wanted and not after:
                    stream.cancel()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.int32)),
                                                         pb_utils.Tensor("AFTER", np.array(after, np.int32))]))
        return responses
