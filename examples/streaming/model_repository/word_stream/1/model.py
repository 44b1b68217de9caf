"""Triton Python backend model, decoupled: sends each word of TEXT as its own response."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            for index, word in enumerate(text.split()):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("WORD", np.array([word], dtype=object)),
                    pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
