"""Throughput against instance count: a model that takes 10 ms per execution, 1, 2, 4 and 8 instances.

The model (Python backend, no batching) sleeps 10 ms per request, so one instance serves at
most 100 requests/s and N instances should serve N times that: what falls short is the
cost of spreading requests over instances (the broker's dispatch, the messages). Each
count gets its own server; perf_analyzer drives it at concurrency 2N over HTTP. Reports
each count's throughput and its ratio to N times the single instance's.

    python -m bench.instance_scaling [--counts 1 2 4 8] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.harness import TritiumServer, bar_charts, save, table
from bench.versus_triton import perf_analyzer

MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(0.010)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''


def repository(root: Path, count: int) -> Path:
    model = root / "add_sub"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    (model / "config.pbtxt").write_text(f'''
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: {count} }} ]
''')
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "instance_scaling.png")
    args = parser.parse_args()
    results = {}
    for count in args.counts:
        with tempfile.TemporaryDirectory() as folder:
            with TritiumServer(repository(Path(folder), count), ready_timeout_s=120) as server:
                results[count] = perf_analyzer(server.url, "http", 2 * count, args.window_ms)
        print(f"{count} instance(s): {results[count]['throughput']:.0f} infer/s", flush=True)
    single = results[args.counts[0]]["throughput"] / args.counts[0]
    rows = [[count, round(r["throughput"]), f"{r['throughput'] / (single * count):.2f}", round(r["p50_us"] / 1000, 1)]
            for count, r in results.items()]
    save("instance_scaling", results)
    print(table(["instances", "infer/s", "ratio to N x one", "p50 ms"], rows))
    bar_charts(args.plot, [([str(count) for count in results],
                            {"measured": [r["throughput"] for r in results.values()],
                             "N x one instance": [single * count for count in results]},
                            "infer/s (perf_analyzer, concurrency 2N)", "N instances of a 10 ms model")])
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
