"""A Python model calling another through BLS, served by tritium and by real Triton.

``caller`` (Python, add_sub's config: ``max_batch_size: 64``, ``dynamic_batching {}``, two CPU instances) answers
each request by asking the Python add_sub for it with ``pb_utils.InferenceRequest(...).exec()``
(business logic scripting) and returning its outputs; in its async variant, ``caller_async``
(``async def execute``), it sends all of a batch's requests at once with ``async_exec`` and
``asyncio.gather``. add_sub is the Python add_sub of bench/versus_triton.py. Both servers serve the same repository;
perf_analyzer drives each over HTTP at concurrency 16, the servers alternating round by round.
Writes ``bench/out/bls_versus_triton.json`` and the plot (docs/bls_versus_triton.png).

    python -m bench.bls_versus_triton [--rounds 3] [--window-ms 3000]
"""

from __future__ import annotations

from pathlib import Path

from bench.serving_overhead import CONFIG, python_repository
from bench.versus_triton import models_versus_triton

MODELS = ("caller", "caller_async")
CONCURRENCY = 16
CALLER = '''
import triton_python_backend_utils as pb_utils

NAMES = ("OUTPUT0", "OUTPUT1")


def inner_request(request):
    inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
    return pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=list(NAMES), inputs=inputs)


def outer_response(answer):
    if answer.has_error():
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message()))
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.get_output_tensor_by_name(answer, n) for n in NAMES])


class TritonPythonModel:
'''
SYNC_EXECUTE = '''    def execute(self, requests):
        return [outer_response(inner_request(request).exec()) for request in requests]
'''
ASYNC_EXECUTE = '''    async def execute(self, requests):
        import asyncio
        answers = await asyncio.gather(*(inner_request(request).async_exec() for request in requests))
        return [outer_response(answer) for answer in answers]
'''


def repository(root: Path) -> Path:
    python_repository(root)
    for model, execute in zip(MODELS, (SYNC_EXECUTE, ASYNC_EXECUTE)):
        (root / model / "1").mkdir(parents=True)
        (root / model / "1" / "model.py").write_text(CALLER + execute)
        (root / model / "config.pbtxt").write_text('backend: "python"\n' + CONFIG)
    return root


def main() -> None:
    models_versus_triton("bls_versus_triton", __doc__, repository, MODELS, ("http",), CONCURRENCY, "BLS")


if __name__ == "__main__":
    main()
