import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls py_cancellable for 200 responses through BLS, reads COUNT of them, cancels the rest
    (ResponseIterator.cancel()) and answers the INDEX values it read."""

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            call = pb_utils.InferenceRequest(model_name="py_cancellable", requested_output_names=["INDEX"],
                                             inputs=[pb_utils.Tensor("COUNT", np.array([200], np.int32))])
            stream = call.exec(decoupled=True)
            seen = []
            for response in stream:
                seen.append(int(pb_utils.get_output_tensor_by_name(response, "INDEX").as_numpy()[0]))
                if len(seen) == wanted:
                    stream.cancel()
                    break
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.int32))]))
        return responses
