import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """An async model streaming py_decoupled through ``await async_exec(decoupled=True)``. SEEN: the
    INDEX of each response; YIELDED: whether the event loop ran something else while the call
    waited for its first response; IN_INITIALIZE: what a BLS call made in initialize raised."""

    def initialize(self, args):
        try:
            pb_utils.InferenceRequest(model_name="py_decoupled", requested_output_names=["INDEX"],
                                      inputs=[pb_utils.Tensor("COUNT", np.array([1], np.int32))]).exec(decoupled=True)
            self.in_initialize = "allowed"
        except pb_utils.TritonModelException as exc:
            self.in_initialize = exc.message()

    async def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            call = pb_utils.InferenceRequest(model_name="py_decoupled", requested_output_names=["INDEX"],
                                             inputs=[pb_utils.Tensor("COUNT", count)])
            ran = asyncio.Event()
            asyncio.get_running_loop().call_soon(ran.set)
            stream = await call.async_exec(decoupled=True)
            yielded = ran.is_set()
            seen = [int(pb_utils.get_output_tensor_by_name(r, "INDEX").as_numpy()[0])
                    for r in stream if len(r.output_tensors()) > 0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SEEN", np.array(seen, np.int32)),
                pb_utils.Tensor("YIELDED", np.array([yielded])),
                pb_utils.Tensor("IN_INITIALIZE", np.array([self.in_initialize.encode()], np.object_))]))
        return responses
