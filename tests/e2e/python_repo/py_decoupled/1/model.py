import json
import os
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends COUNT responses (INDEX 0..COUNT-1) then the final flag; odd counts from a thread.
    COUNT -1: one response, then execute returns [] (a decoupled model must return None);
    COUNT -2: one response, then execute returns None without the final flag;
    COUNT -3: execute raises before any response;
    COUNT -4: a thread sends INDEX 0 while execute waits (up to 20 s) for the file the request's
    'release' parameter names, then INDEX 1 if it came (0 if not), then the final flag."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if count == -3:
                raise ValueError("COUNT -3 asks for an error")
            if count == -4:
                thread = threading.Thread(target=sender.send, args=(
                    pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([0], np.int32))]),))
                thread.start()
                thread.join()
                release = json.loads(request.parameters())["release"]
                deadline = time.monotonic() + 20
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
                released = np.array([int(os.path.exists(release))], np.int32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", released)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
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
