import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """async execute: six calls to the same model at once, which its batcher may run as one batch."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="py_add_sub", requested_output_names=["OUTPUT0"],
                                               inputs=[pb_utils.Tensor("INPUT0", a * k), pb_utils.Tensor("INPUT1", a)])
                     for k in range(6)]
            answers = await asyncio.gather(*(call.async_exec() for call in calls))
            sums = [pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy() for answer in answers]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUMS", np.concatenate(sums))]))
        return responses
