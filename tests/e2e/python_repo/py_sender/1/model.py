import gc
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    """Not decoupled, answering through its response sender (Triton 24.06+).
    MODE: 0 send with FINAL, return None; 1 send from a thread later; 2 send twice;
    3 FINAL alone; 4 send, return [None]; 5 send, return a response too; 6 send, then FINAL
    alone; 7 return [response] (no sender); 8 return 5; 9 return two responses; 10 return None,
    never asking for the sender; 11 ask for the sender, send nothing, return None; 12 send, then
    raise; 13 return None, the request kept only by a reference cycle; 14 collect garbage,
    return a response; 15 return [5]; 16 return [a Tensor]; 17 send with flags 7."""

    def execute(self, requests):
        returned = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            returned.append(None)
            if mode == 10:
                continue
            if mode == 13:
                cycle = [request]
                cycle.append(cycle)
                continue
            if mode == 14:
                gc.collect()
                return [response(24) for _ in requests]
            sender = request.get_response_sender()
            if mode == 0:
                sender.send(response(10), FINAL)
            elif mode == 1:
                def later(sender=sender):
                    time.sleep(0.3)
                    sender.send(response(11), FINAL)
                threading.Thread(target=later).start()
            elif mode == 2:
                sender.send(response(12))
                sender.send(response(12), FINAL)
            elif mode == 3:
                sender.send(flags=FINAL)
            elif mode == 4:
                sender.send(response(14), FINAL)
                return [None for _ in requests]
            elif mode == 5:
                sender.send(response(15), FINAL)
                return [response(55) for _ in requests]
            elif mode == 6:
                sender.send(response(16))
                sender.send(flags=FINAL)
            elif mode == 7:
                return [response(17) for _ in requests]
            elif mode == 8:
                return 5
            elif mode == 15:
                return [5]
            elif mode == 16:
                return [pb_utils.Tensor("OUT", np.array([16], np.int32))]
            elif mode == 17:
                sender.send(response(17), flags=7)
            elif mode == 12:
                sender.send(response(22), FINAL)
                raise ValueError("after sending")
            elif mode == 9:
                return [response(19), response(19)]
        return None
