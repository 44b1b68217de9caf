"""A decoupled model streaming its answers, served by tritium and by real Triton.

A Python model in the shape of a token generator: a decoupled model (``model_transaction_policy
{ decoupled: true }``, two CPU instances) that answers each request with ``--responses``
responses of one INT32 each, sent one by one through its response sender from inside
``execute``, then the final flag. Both servers serve it from one repository; perf_analyzer
drives each over a gRPC stream (``--streaming``) at concurrency 1 and 16, the servers
alternating round by round. Reported per scenario and server: responses per second (the
figure that counts for streaming), requests per second, and perf_analyzer's median latency.
Then, one request at a time on one stream (tritonclient, 30 requests after 5 of warm-up), the
median time from sending a request to its first and to its last response: how soon a client
sees the first token, and how soon the whole answer. Writes
``bench/out/decoupled_versus_triton.json`` and the plot (docs/decoupled_versus_triton.png).

    python -m bench.decoupled_versus_triton [--rounds 3] [--window-ms 3000] [--responses 32]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench.harness import ROOT, alternating_rounds, bar_charts, compared, save, table, tritium_and_triton
from bench.versus_triton import perf_analyzer

MODEL = "tokens"
CONCURRENCIES = (1, 16)
CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "TOKEN", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 2 } ]
"""
MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([index], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return root


def response_times(grpc_url: str, responses: int, requests: int = 30, warmup: int = 5) -> tuple[float, float]:
    """Median microseconds from sending a request to its first and to its last response."""
    client = grpcclient.InferenceServerClient(grpc_url)
    arrivals: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrivals.put((time.perf_counter(), error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([responses], np.int32))
    firsts, lasts = [], []
    try:
        for number in range(warmup + requests):
            sent = time.perf_counter()
            client.async_stream_infer(MODEL, [count])
            times = []
            for _ in range(responses):
                arrived, error = arrivals.get(timeout=30)
                if error is not None:
                    raise RuntimeError(f"{grpc_url}: {error}")
                times.append((arrived - sent) * 1e6)
            if number >= warmup:
                firsts.append(times[0])
                lasts.append(times[-1])
    finally:
        client.stop_stream()
        client.close()
    return statistics.median(firsts), statistics.median(lasts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--responses", type=int, default=32, help="responses the model sends per request")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "decoupled_versus_triton.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = repository(Path(folder) / "repo")
        data = Path(folder) / "count.json"
        data.write_text(json.dumps({"data": [{"COUNT": [args.responses]}]}))
        stream = ("--streaming", "--input-data", str(data))
        with tritium_and_triton(repo) as servers:
            rounds = alternating_rounds(
                servers, {f"grpc stream c={c}": partial(lambda server, c: perf_analyzer(
                    server.grpc_url, "grpc", c, args.window_ms, stream, model=MODEL), c=c) for c in CONCURRENCIES},
                args.rounds, lambda f: f"{f['responses_per_s']:7.0f} responses/s, {f['throughput']:6.0f} requests/s, "
                                       f"p50 {f['p50_us']:6.0f} us")
            timings = {name: response_times(server.grpc_url, args.responses) for name, server in servers.items()}
    rows = [[scenario, round(theirs["responses_per_s"]), round(ours["responses_per_s"]),
             f"{ours['responses_per_s'] / theirs['responses_per_s']:.2f}",
             round(theirs["p50_us"]), round(ours["p50_us"]), f"{ours['p50_us'] / theirs['p50_us']:.2f}"]
            for scenario, ours, theirs in compared(rounds, ("responses_per_s", "throughput", "p50_us"))]
    save("decoupled_versus_triton", {"responses_per_request": args.responses, "rounds": rounds, "rows": rows,
                                     "first_and_last_response_us": timings})
    print(table(["scenario", "Triton responses/s", "tritium responses/s", "ratio", "Triton p50 us",
                 "tritium p50 us", "p50 ratio"], rows))
    print(table(["one request at a time", "Triton us", "tritium us"],
                [["first response", round(timings["triton"][0]), round(timings["tritium"][0])],
                 [f"last response (of {args.responses})", round(timings["triton"][1]), round(timings["tritium"][1])]]))
    labels = [row[0] for row in rows]
    bar_charts(args.plot, [
        (labels, {"Triton": [row[1] for row in rows], "tritium": [row[2] for row in rows]}, "responses/s",
         f"{args.responses} responses per request"),
        (["first", "last"], {"Triton": list(timings["triton"]), "tritium": list(timings["tritium"])}, "us",
         "one request: its responses arrive"),
    ], size=(9, 4))
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
