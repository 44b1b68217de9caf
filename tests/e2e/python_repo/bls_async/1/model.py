import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """async execute: asks an ONNX and a Python add_sub at the same time, with async_exec."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            calls = [pb_utils.InferenceRequest(model_name=name, requested_output_names=["OUTPUT1"],
                                               inputs=[pb_utils.Tensor("INPUT0", a * 3), pb_utils.Tensor("INPUT1", a)])
                     for name in ("onnx_add_sub", "py_add_sub")]
            onnx_answer, python_answer = await asyncio.gather(*(c.async_exec() for c in calls))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("FROM_ONNX", pb_utils.get_output_tensor_by_name(onnx_answer, "OUTPUT1").as_numpy()),
                pb_utils.Tensor("FROM_PYTHON", pb_utils.get_output_tensor_by_name(python_answer, "OUTPUT1").as_numpy())]))
        return responses
