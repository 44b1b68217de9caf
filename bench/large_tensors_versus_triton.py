"""Large tensors, served by tritium and by real Triton: an image model's 600 KB input.

Two Python models of the shape of an image model (``max_batch_size: 64``, ``dynamic_batching
{}``, two CPU instances), whose input is one FP32 image of 3 x 224 x 224 (602,112 bytes):
``classify`` answers with three numbers (a classifier's shape: the large tensor travels one
way), ``denoise`` with an image of the same size (a filter's or a segmenter's: it travels
both ways). Both servers serve the same repository; perf_analyzer drives each model over
HTTP and over gRPC at concurrency 16, the servers alternating round by round. This is where
the cost per byte shows: each process a tensor crosses reads and writes it. Writes
``bench/out/large_tensors_versus_triton.json`` and the plot (docs/large_tensors_versus_triton.png).

    python -m bench.large_tensors_versus_triton [--rounds 3] [--window-ms 3000]
"""

from __future__ import annotations

from pathlib import Path

from bench.versus_triton import models_versus_triton

MODELS = ("classify", "denoise")
PROTOCOLS = ("http", "grpc")
CONCURRENCY = 16
CONFIG = """backend: "python"
max_batch_size: 64
input [ { name: "PIXELS", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ DIMS ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 2 } ]
"""
MODEL_PY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", OUTPUT)]))
        return responses
'''
SHAPES = {"classify": ("3", "pixels[:, :, 0, 0]"), "denoise": ("3, 224, 224", "pixels")}


def repository(root: Path) -> Path:
    for model, (dims, output) in SHAPES.items():
        (root / model / "1").mkdir(parents=True)
        (root / model / "1" / "model.py").write_text(MODEL_PY.replace("OUTPUT", output))
        (root / model / "config.pbtxt").write_text(CONFIG.replace("DIMS", dims))
    return root


def main() -> None:
    models_versus_triton("large_tensors_versus_triton", __doc__, repository, MODELS, PROTOCOLS, CONCURRENCY,
                         "600 KB image input")


if __name__ == "__main__":
    main()
