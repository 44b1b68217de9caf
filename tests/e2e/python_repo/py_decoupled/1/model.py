import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends COUNT responses (INDEX 0..COUNT-1) then the final flag; odd counts from a thread.
    COUNT -1: one response, then execute returns [] (a decoupled model must return None);
    COUNT -2: one response, then execute returns None without the final flag;
    COUNT -3: execute raises before any response."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if count == -3:
                raise ValueError("COUNT -3 asks for an error")
            if count < 0:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([0], np.int32))]))
                return [] if count == -1 else None
            if count % 2:
                threading.Thread(target=self._answer, args=(sender, count)).start()
            else:
                self._answer(sender, count)
        return None

    @staticmethod
    def _answer(sender, count):
        for index in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
