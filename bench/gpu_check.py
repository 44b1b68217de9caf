"""GPU check: ONNX and TorchScript models with KIND_GPU instances really run on GPU 0.

Serves an ONNX add_sub and a TorchScript add_sub, each with one KIND_GPU instance on
GPU 0, and proves they run there: the results are right; onnxruntime's active providers
(logged by the instance) include CUDA; torch loaded the model on cuda:0; and
``nvidia-smi`` lists both instance processes among those holding GPU memory. Needs a
host with an NVIDIA GPU and ``pip install ".[gpu]"`` (onnxruntime-gpu, a CUDA torch).

    python -m bench.gpu_check        # exit status 0 when every check passes, 2 without a GPU
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import save
from examples import models
from tests.servers import TritiumServer, instance_processes

CONFIG = """{platform}
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }}, {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "{out0}", data_type: TYPE_FP32, dims: [ 16 ] }}, {{ name: "{out1}", data_type: TYPE_FP32, dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_GPU, count: 1, gpus: [ 0 ] }} ]
"""


def build(repo: Path) -> None:
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
            return INPUT0 + INPUT1, INPUT0 - INPUT1

    models.add_sub(repo / "onnx_gpu" / "1" / "model.onnx")
    (repo / "onnx_gpu" / "config.pbtxt").write_text(
        CONFIG.format(platform='platform: "onnxruntime_onnx"', out0="OUTPUT0", out1="OUTPUT1"))
    (repo / "torch_gpu" / "1").mkdir(parents=True)
    torch.jit.script(AddSub()).save(str(repo / "torch_gpu" / "1" / "model.pt"))
    (repo / "torch_gpu" / "config.pbtxt").write_text(
        CONFIG.format(platform='platform: "pytorch_libtorch"', out0="OUTPUT__0", out1="OUTPUT__1"))


def gpu_processes() -> dict[int, str]:
    query = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True)
    found = {}
    for line in query.stdout.splitlines():
        pid, _, memory = line.partition(",")
        if pid.strip().isdigit():
            found[int(pid)] = memory.strip()
    return found


def main() -> int:
    if shutil.which("nvidia-smi") is None:
        print("no NVIDIA GPU on this host (nvidia-smi not found): nothing to check")
        return 2
    import tritonclient.http as httpclient

    checks = {}
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        build(repo)
        with TritiumServer(repo, ready_timeout_s=300) as server:
            client = httpclient.InferenceServerClient(server.url)
            a = np.arange(32, dtype=np.float32).reshape(2, 16)
            b = np.ones((2, 16), dtype=np.float32)
            for model, out0 in (("onnx_gpu", "OUTPUT0"), ("torch_gpu", "OUTPUT__0")):
                inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                checks[f"{model}: correct result"] = bool(np.array_equal(client.infer(model, inputs).as_numpy(out0), a + b))
            logs = server.logs()
            checks["onnx_gpu: onnxruntime providers include CUDA"] = (
                "instance onnx_gpu_0_0 loaded" in logs and "'CUDAExecutionProvider'" in logs)
            checks["torch_gpu: model loaded on cuda:0"] = "on cuda:0" in logs
            holders = gpu_processes()
            for process in instance_processes():
                model = process["env"].get("TRITIUM_MODEL", "").split("/")[0]
                if model in ("onnx_gpu", "torch_gpu"):
                    checks[f"{model}: pinned to CUDA_VISIBLE_DEVICES=0"] = process["env"].get("CUDA_VISIBLE_DEVICES") == "0"
                    checks[f"{model}: instance process holds GPU memory ({holders.get(process['pid'], 'none')})"] = (
                        process["pid"] in holders)
    save("gpu_check", checks)
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {check}")
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
