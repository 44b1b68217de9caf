"""Sleeps DELAY_MS milliseconds, then answers how long it slept.

With one instance and a plain ``dynamic_batching { }``, the requests that come meanwhile
wait in the broker's queue (the common queue, with no policy).
"""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(float(delay.max()) / 1000)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("WAITED_MS", delay)]))
        return answers
