"""A short client for tritium (and Triton): numpy arrays in, a dict of numpy arrays out.

    import numpy as np
    import tritium.client

    with tritium.client.connect("localhost:8000") as client:          # grpc://localhost:8001 for gRPC
        out = client.infer("add_sub", INPUT0=np.ones((1, 16), np.float32), INPUT1=...)
        out["OUTPUT0"]

It is a thin layer over tritonclient: the same requests on the wire, one call per inference.
docs/client.md describes it.
"""

from tritium.client.aio import AsyncClient, connect_async
from tritium.client.sync import Client, connect
from tritium.client.tensors import InferenceError

__all__ = ["AsyncClient", "Client", "InferenceError", "connect", "connect_async"]
