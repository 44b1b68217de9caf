"""Sleeps SECONDS in libc's sleep called through ctypes.PyDLL, which keeps Python's GIL for the
whole call: the instance's heartbeat thread cannot run meanwhile."""

import ctypes

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.libc = ctypes.PyDLL(None)

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            self.libc.sleep(int(seconds[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seconds)]))
        return responses
