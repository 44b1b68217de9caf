import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends py_echo IN, 2 x IN and 3 x IN (three calls in flight at once) and answers the sum of
    what comes back: large inputs, each call's own."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name="py_echo", requested_output_names=["OUT"],
                                               inputs=[pb_utils.Tensor("IN", a * np.float32(k))]) for k in (1, 2, 3)]
            answers = await asyncio.gather(*(call.async_exec() for call in calls))
            one, two, three = (pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy() for answer in answers)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", one + two + three)]))
        return responses
