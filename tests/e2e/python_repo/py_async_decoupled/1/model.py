import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    """Decoupled, ``async def execute``. MODE 0: wait (up to 5 s) for a later request's MODE 1,
    then answer 1 if it came while this execute waited, 0 if not; MODE 1: tell the waiting
    request, answer 2; MODE 3: answer 3, then raise."""

    def initialize(self, args):
        self.told = None

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:
                self.told = asyncio.Event()
                try:
                    await asyncio.wait_for(self.told.wait(), 5)
                    sender.send(response(1), FINAL)
                except asyncio.TimeoutError:
                    sender.send(response(0), FINAL)
            elif mode == 3:
                sender.send(response(3))
                raise ValueError("boom after one response")
            else:
                if self.told is not None:
                    self.told.set()
                sender.send(response(2), FINAL)
        return None
