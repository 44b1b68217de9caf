import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Three calls to py_sleep at once, 0.5 s each: the third waits in its queue behind the other
    two, with the request's timeout (microseconds, InferenceRequest's timeout=) as its limit.
    Answers what became of each call."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            timeout = int(pb_utils.get_input_tensor_by_name(request, "TIMEOUT_US").as_numpy()[0])
            calls = [pb_utils.InferenceRequest(model_name="py_sleep", requested_output_names=["SLEPT"],
                                               inputs=[pb_utils.Tensor("SECONDS", np.array([[0.5]], np.float32))],
                                               timeout=timeout if index == 2 else 0)
                     for index in range(3)]
            answers = []
            for call in calls:   # in order, so the third is the one queued behind the others
                answers.append(asyncio.ensure_future(call.async_exec()))
                await asyncio.sleep(0.05)
            outcomes = [answer.error().message() if answer.has_error() else "ok" for answer in await asyncio.gather(*answers)]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTCOMES", np.array(outcomes, dtype=np.object_))]))
        return responses
