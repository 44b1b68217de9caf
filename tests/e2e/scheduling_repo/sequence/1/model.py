"""A stateful model's stand-in: sleeps DELAY_MS milliseconds, then answers how long it slept.

One instance with one sequence slot: a second sequence waits in the backlog until the
first ends (or is cancelled).
"""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        (request,) = requests
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
        time.sleep(float(delay.max()) / 1000)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WAITED_MS", delay)])]
