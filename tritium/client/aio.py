"""The asyncio client: ``connect_async(url)`` -> ``AsyncClient``, the same calls awaited."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Mapping

import numpy as np
from tritonclient.utils import InferenceServerException

from tritium.client.tensors import Endpoint, InferenceError, Signature, build_inputs, outputs_of, stream_response


def connect_async(url: str = "localhost:8000", *, protocol: str | None = None,
                  timeout_s: float = 60.0) -> "AsyncClient":
    """An asyncio client of the server at ``url``; use it in ``async with`` or await ``close()``."""
    return AsyncClient(Endpoint.parse(url, protocol), timeout_s)


class AsyncClient:
    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.protocol = endpoint.protocol
        self._address = endpoint.address
        if endpoint.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
            self._client = aio.InferenceServerClient(endpoint.address)
        else:
            import tritonclient.http as module
            import tritonclient.http.aio as aio
            self._client = aio.InferenceServerClient(endpoint.address, conn_timeout=timeout_s)
        self._module = module
        self._signatures: dict[tuple[str, str], Signature] = {}

    async def infer(self, model: str, tensors: Mapping[str, Any] | None = None, *, version: str = "",
                    **named: Any) -> dict[str, np.ndarray]:
        """Run ``model`` once: inputs by name (a mapping, keywords, or both), outputs by name."""
        inputs = await self._inputs(model, version, {**(tensors or {}), **named})
        try:
            result = await self._client.infer(model, inputs, model_version=version)
        except InferenceServerException as error:
            raise InferenceError.of(error) from None
        return outputs_of(result)

    async def stream(self, model: str, tensors: Mapping[str, Any] | None = None, *, version: str = "",
                     **named: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        """Run a decoupled ``model`` once and yield each response's outputs as it comes (gRPC only)."""
        if self.protocol != "grpc":
            raise ValueError("streaming needs gRPC: connect to grpc://host:port")
        inputs = await self._inputs(model, version, {**(tensors or {}), **named})
        # tritonclient's asyncio stream cannot ask for the final-response flag, without which the
        # end of a decoupled model's answer is unknown: its threaded stream can, on its own connection.
        import tritonclient.grpc as grpcclient

        loop = asyncio.get_running_loop()
        responses: asyncio.Queue = asyncio.Queue()
        streamer = grpcclient.InferenceServerClient(self._address)
        streamer.start_stream(callback=lambda result, error: loop.call_soon_threadsafe(responses.put_nowait,
                                                                                     (result, error)))
        try:
            streamer.async_stream_infer(model, inputs, model_version=version, enable_empty_final_response=True)
            while True:
                outputs, final = stream_response(*await responses.get())
                if outputs:
                    yield outputs
                if final:
                    return
        finally:
            await asyncio.to_thread(streamer.stop_stream, cancel_requests=True)
            streamer.close()

    async def is_ready(self, model: str | None = None) -> bool:
        """Whether the server (or ``model``) is ready."""
        try:
            return await (self._client.is_model_ready(model) if model else self._client.is_server_ready())
        except InferenceServerException as error:
            raise InferenceError.of(error) from None

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _inputs(self, model: str, version: str, tensors: Mapping[str, Any]) -> list:
        key = (model, version)
        if key not in self._signatures:
            options = {"as_json": True} if self.protocol == "grpc" else {}
            try:
                metadata = await self._client.get_model_metadata(model, version, **options)
            except InferenceServerException as error:
                raise InferenceError.of(error) from None
            self._signatures[key] = Signature.of(metadata)
        return build_inputs(self._module, self._signatures[key], tensors, model)
