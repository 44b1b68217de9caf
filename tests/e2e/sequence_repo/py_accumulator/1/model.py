"""A stateful Python model written for Triton's sequence batcher: a running sum per sequence.

OUTPUT is the sum of INPUT over the sequence so far, kept by CORRID (START begins a new
sum, END forgets it); a request that is not READY (padding) changes nothing. CONTROLS
echoes, as JSON, the control tensors the request received, its correlation id, flags
and parameters, and the correlation ids of every request of the same execute call. A
negative INPUT makes the model sleep that many seconds first (tests kill it meanwhile).
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CONTROLS = ("START", "END", "READY", "CORRID")


def _plain(value):
    return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        seen = [self._controls(request) for request in requests]
        batch = [controls["CORRID"][2][0] if controls["READY"][2][0] else None for controls in seen]
        return [self._step(request, controls, batch) for request, controls in zip(requests, seen)]

    @staticmethod
    def _controls(request):
        found = {}
        for name in CONTROLS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                array = tensor.as_numpy()
                found[name] = [str(array.dtype), list(array.shape), [_plain(v) for v in array.reshape(-1)]]
        return found

    def _step(self, request, controls, batch):
        values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
        value = float(values.reshape(-1)[0])
        total = 0.0
        if controls["READY"][2][0]:
            if value < 0:
                time.sleep(-value)
            key = controls["CORRID"][2][0]
            total = (0.0 if controls["START"][2][0] else self.sums.get(key, 0.0)) + value
            self.sums[key] = total
            if controls["END"][2][0]:
                del self.sums[key]
        echo = json.dumps({"controls": controls, "correlation_id": _plain(request.correlation_id()),
                           "flags": request.flags(), "parameters": json.loads(request.parameters()),
                           "batch": batch})
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT", np.full(values.shape, total, dtype=np.float32)),
            pb_utils.Tensor("CONTROLS", np.array([echo.encode()], dtype=np.object_).reshape(values.shape))])
