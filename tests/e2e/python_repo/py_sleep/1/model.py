import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps as long as it is asked (one request at a time), then says how long."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds.reshape(-1)[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT", seconds)]))
        return responses
