"""Asks py_add_sub for i + i in N processes forked by a multiprocessing pool (one BLS call each),
and answers the sums: each forked process makes its calls on a socket of its own."""

import multiprocessing

import numpy as np
import triton_python_backend_utils as pb_utils


def add_to_itself(i: int) -> float:
    value = np.full((1, 16), i, np.float32)
    request = pb_utils.InferenceRequest(
        model_name="py_add_sub", requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", value), pb_utils.Tensor("INPUT1", value)])
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return float(pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()[0][0])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            with multiprocessing.get_context("fork").Pool(n) as pool:
                sums = pool.map(add_to_itself, range(1, 2 * n + 1))
            sums.append(add_to_itself(100))   # and the instance's own client still works after
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUMS", np.array(sums, np.float32))]))
        return responses
