"""Answers with the pid of the process that ran the request, after DELAY_MS milliseconds.

The reliability tests use it to see which instance (and so which worker host) served
each request, and to keep requests in flight while a process is killed or stopped.
"""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        delays = [pb_utils.get_input_tensor_by_name(r, "DELAY_MS").as_numpy() for r in requests]
        time.sleep(max(float(d.max()) for d in delays) / 1000)
        pid = np.int64(os.getpid())
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.full(d.shape, pid, dtype=np.int64))])
                for d in delays]
