"""Building the request a perf run repeats, from the model's metadata and config."""

from __future__ import annotations

import http.client
import json

import numpy as np
import orjson

from tritium import datatypes
from tritium.perf.loadgen import Workload


def get_json(host: str, port: int, path: str, method: str = "GET", body: bytes | None = None):
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status} {data[:300]!r}")
        return json.loads(data) if data else None
    finally:
        connection.close()


def _tensor_data(datatype: str, shape: list[int], random: bool, rng) -> np.ndarray:
    count = int(np.prod(shape)) if shape else 1
    dt = datatypes.from_name(datatype)
    if dt is None:
        raise ValueError(f"the model's metadata names datatype '{datatype}', which is not a KServe v2 datatype")
    if dt.is_bytes:
        return np.array([b"x" * 16] * count, dtype=np.object_).reshape(shape)
    if dt.numpy is None:
        return np.zeros(count * dt.itemsize, dtype=np.uint8)
    if random and dt.numpy.kind == "f":
        return rng.standard_normal(count).astype(dt.numpy).reshape(shape)
    if random and dt.numpy.kind in "iu":
        return rng.integers(0, 100, count).astype(dt.numpy).reshape(shape)
    return np.zeros(shape, dtype=dt.numpy)


def _serialize(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in array.reshape(-1))
    return array.tobytes()


def build_workload(host: str, port: int, model: str, version: str = "", batch_size: int = 1,
                   shapes: dict[str, list[int]] | None = None, random_data: bool = True,
                   binary: bool = True) -> tuple[Workload, dict]:
    """The HTTP request for one inference, and the model's metadata."""
    base = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    metadata = get_json(host, port, base)
    config = get_json(host, port, base + "/config")
    batching = int(config.get("max_batch_size", 0)) > 0
    rng = np.random.default_rng(0)
    inputs, payloads = [], []
    for tensor in metadata["inputs"]:
        shape = list((shapes or {}).get(tensor["name"]) or tensor["shape"][1 if batching else 0:])
        if -1 in shape:
            raise ValueError(f"input '{tensor['name']}' has a variable dimension; give --shape "
                             f"{tensor['name']}:d1,d2,...")
        full = ([batch_size] if batching else []) + shape
        array = _tensor_data(tensor["datatype"], full, random_data, rng)
        entry = {"name": tensor["name"], "datatype": tensor["datatype"], "shape": full}
        if binary:
            payload = _serialize(tensor["datatype"], array)
            entry["parameters"] = {"binary_data_size": len(payload)}
            payloads.append(payload)
        else:
            entry["data"] = [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
        inputs.append(entry)
    document = {"inputs": inputs}
    if binary:
        document["outputs"] = [{"name": o["name"], "parameters": {"binary_data": True}}
                               for o in metadata["outputs"]]
    header = orjson.dumps(document)
    body = header + b"".join(payloads)
    head = [f"POST {base}/infer HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive",
            f"Content-Length: {len(body)}"]
    if binary:
        head.append(f"Inference-Header-Content-Length: {len(header)}")
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    return Workload(host, port, request), metadata
