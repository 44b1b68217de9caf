"""The blocking client: ``connect(url)`` -> ``Client``."""

from __future__ import annotations

import queue
from typing import Any, Iterator, Mapping

import numpy as np
from tritonclient.utils import InferenceServerException

from tritium.client.tensors import (Endpoint, InferenceError, Signature, build_inputs, outputs_of,
                                    stream_response)


def connect(url: str = "localhost:8000", *, protocol: str | None = None, timeout_s: float = 60.0) -> "Client":
    """A client of the server at ``url`` (``host:port``, ``http://host:port`` or ``grpc://host:port``)."""
    return Client(Endpoint.parse(url, protocol), timeout_s)


class Client:
    """One connection to a server; use it in a ``with`` block or call ``close()``."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.protocol = endpoint.protocol
        if endpoint.protocol == "grpc":
            import tritonclient.grpc as module
            self._client = module.InferenceServerClient(endpoint.address)
        else:
            import tritonclient.http as module
            self._client = module.InferenceServerClient(endpoint.address, connection_timeout=timeout_s,
                                                        network_timeout=timeout_s)
        self._module = module
        self._signatures: dict[tuple[str, str], Signature] = {}

    def infer(self, model: str, tensors: Mapping[str, Any] | None = None, *, version: str = "",
              **named: Any) -> dict[str, np.ndarray]:
        """Run ``model`` once: inputs by name (a mapping, keywords, or both), outputs by name."""
        inputs = self._inputs(model, version, {**(tensors or {}), **named})
        try:
            result = self._client.infer(model, inputs, model_version=version)
        except InferenceServerException as error:
            raise InferenceError.of(error) from None
        return outputs_of(result)

    def stream(self, model: str, tensors: Mapping[str, Any] | None = None, *, version: str = "",
               **named: Any) -> Iterator[dict[str, np.ndarray]]:
        """Run a decoupled ``model`` once and yield each response's outputs as it comes (gRPC only)."""
        if self.protocol != "grpc":
            raise ValueError("streaming needs gRPC: connect to grpc://host:port")
        inputs = self._inputs(model, version, {**(tensors or {}), **named})
        responses: queue.Queue = queue.Queue()
        self._client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            self._client.async_stream_infer(model, inputs, model_version=version, enable_empty_final_response=True)
            while True:
                outputs, final = stream_response(*responses.get())
                if outputs:
                    yield outputs
                if final:
                    return
        finally:
            self._client.stop_stream(cancel_requests=True)

    def is_ready(self, model: str | None = None) -> bool:
        """Whether the server (or ``model``) is ready."""
        try:
            return self._client.is_model_ready(model) if model else self._client.is_server_ready()
        except InferenceServerException as error:
            raise InferenceError.of(error) from None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _inputs(self, model: str, version: str, tensors: Mapping[str, Any]) -> list:
        return build_inputs(self._module, self._signature(model, version), tensors, model)

    def _signature(self, model: str, version: str) -> Signature:
        key = (model, version)
        if key not in self._signatures:
            try:
                metadata = self._client.get_model_metadata(model, version, **self._json_option())
            except InferenceServerException as error:
                raise InferenceError.of(error) from None
            self._signatures[key] = Signature.of(metadata)
        return self._signatures[key]

    def _json_option(self) -> dict:
        return {"as_json": True} if self.protocol == "grpc" else {}
