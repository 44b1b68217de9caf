"""What one client's large compressed answers cost the gateway's other clients.

One client asks an identity model (Python backend, two instances) for 16 MB answers with
``Accept-Encoding: gzip``, back to back; another sends 16-byte requests one after another on its
own connection. Prints the small requests' latency and how many of each were served. The
gateway compresses a body of 128 KiB or more on a thread, so the small requests keep being
answered while a large answer is compressed; on the event loop, each compression (about
0.5 s for 16 MB here) would hold them all up.

    python -m bench.compressed_neighbours [--seconds 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.harness import TritiumServer, save, table
from tests.models import PYTHON_IDENTITY

CONFIG = '''\
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
'''


def repository(root: Path) -> Path:
    (root / "identity" / "1").mkdir(parents=True)
    (root / "identity" / "1" / "model.py").write_text(PYTHON_IDENTITY)
    (root / "identity" / "config.pbtxt").write_text(CONFIG)
    return root


def post(connection: http.client.HTTPConnection, body: bytes, headers: dict) -> None:
    connection.request("POST", "/v2/models/identity/infer", body, {"Inference-Header-Content-Length": "0", **headers})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")


def one_round(url: str, seconds: float) -> dict:
    host, port = url.rsplit(":", 1)
    large = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32).tobytes()
    small = np.ones(4, np.float32).tobytes()
    stop = time.monotonic() + seconds
    large_answers = [0]

    def fetch_large() -> None:
        connection = http.client.HTTPConnection(host, int(port))
        while time.monotonic() < stop:
            post(connection, large, {"Accept-Encoding": "gzip"})
            large_answers[0] += 1

    thread = threading.Thread(target=fetch_large)
    thread.start()
    connection, latencies = http.client.HTTPConnection(host, int(port)), []
    while time.monotonic() < stop:
        start = time.perf_counter()
        post(connection, small, {})
        latencies.append(time.perf_counter() - start)
    thread.join()
    ms = np.array(latencies) * 1000
    return {"large answers": large_answers[0], "small requests": len(ms), "p50 ms": float(np.percentile(ms, 50)),
            "p99 ms": float(np.percentile(ms, 99)), "max ms": float(ms.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, TritiumServer(repository(Path(folder))) as server:
        rounds = [one_round(server.url, args.seconds) for _ in range(args.rounds)]
    save("compressed_neighbours", rounds)
    keys = list(rounds[0])
    print(table(["round", *keys], [[number + 1, *(round(r[k], 1) for k in keys)] for number, r in enumerate(rounds)]))


if __name__ == "__main__":
    main()
