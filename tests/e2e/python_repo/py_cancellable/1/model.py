import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams INDEX 0..COUNT-1 from a thread, one every 50 ms, stopping early once its client
    cancels (``is_cancelled()``); a negative COUNT streams -COUNT from inside execute. COUNT 0
    answers, once, with how many streams stopped early."""

    def initialize(self, args):
        self.stopped = 0

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if count == 0:
                sender.send(self._response(self.stopped), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif count < 0:
                self._stream(request, sender, -count)
            else:
                threading.Thread(target=self._stream, args=(request, sender, count)).start()
        return None

    def _stream(self, request, sender, count):
        for index in range(count):
            if request.is_cancelled() and sender.is_cancelled():
                self.stopped += 1
                break
            sender.send(self._response(index))
            time.sleep(0.05)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _response(value):
        return pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([value], np.int32))])
