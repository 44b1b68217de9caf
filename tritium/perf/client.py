"""Talking to the server for a perf run, over HTTP or gRPC, through tritonclient's async clients.

``Session.open`` checks the server and the model first, so that a stopped server or an
unknown model is one clear error rather than a failure per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritium.perf import inputs
from tritium.perf.errors import PerfError, ServerUnreachable, UnknownModel
from tritium.perf.settings import PerfSettings


@dataclass(frozen=True)
class ModelInfo:
    metadata: dict
    config: dict
    extensions: tuple[str, ...]

    @property
    def batching(self) -> bool:
        return int(self.config.get("max_batch_size", 0) or 0) > 0

    @property
    def is_sequence(self) -> bool:
        return "sequence_batching" in self.config

    @property
    def is_decoupled(self) -> bool:
        return bool(self.config.get("model_transaction_policy", {}).get("decoupled"))


@dataclass(frozen=True)
class Prepared:
    """One request's tensors, built once and sent many times."""

    inputs: tuple
    outputs: tuple


def _modules(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as sync_module
        import tritonclient.grpc.aio as async_module
    else:
        import tritonclient.http as sync_module
        import tritonclient.http.aio as async_module
    return sync_module, async_module


def server_message(exc: BaseException) -> str:
    """The server's own words for a failed call, on one line."""
    from tritonclient.utils import InferenceServerException

    text = exc.message() if isinstance(exc, InferenceServerException) else str(exc) or type(exc).__name__
    return " ".join(str(text).split())


class Session:
    """An async client bound to one model; ``infer`` raises on any failed request."""

    def __init__(self, settings: PerfSettings, client, info: ModelInfo) -> None:
        self.settings = settings
        self.client = client
        # statistics and shared memory calls get their own connection: behind a full pool of
        # inference requests they could wait for as long as the load lasts
        self.control = _modules(settings.protocol)[1].InferenceServerClient(settings.url)
        self.info = info
        self._sync, _ = _modules(settings.protocol)
        self._regions: list = []
        self._registrations: list[tuple[str, str, int]] = []

    @classmethod
    async def open(cls, settings: PerfSettings, connections: int = 64) -> "Session":
        _, aio = _modules(settings.protocol)
        if settings.protocol == "grpc":
            client = aio.InferenceServerClient(settings.url)
        else:
            client = aio.InferenceServerClient(settings.url, conn_limit=connections,
                                               conn_timeout=settings.request_timeout_s)
        try:
            info = await cls._model_info(client, settings)
        except BaseException:
            await client.close()
            raise
        return cls(settings, client, info)

    @staticmethod
    async def _model_info(client, settings: PerfSettings) -> ModelInfo:
        try:
            live = await client.is_server_live()
            server = await client.get_server_metadata(**_as_json(settings))
        except Exception as exc:  # refused, reset, DNS, timeouts: all mean the same to the user
            raise ServerUnreachable(f"{settings.protocol}://{settings.url}", server_message(exc)) from None
        if not live:
            raise ServerUnreachable(f"{settings.protocol}://{settings.url}", "the server is not live")
        try:
            metadata = await client.get_model_metadata(settings.model, settings.version, **_as_json(settings))
            config = await client.get_model_config(settings.model, settings.version, **_as_json(settings))
            ready = await client.is_model_ready(settings.model, settings.version)
        except Exception as exc:
            raise UnknownModel(settings.model, server_message(exc)) from None
        if not ready:
            raise UnknownModel(settings.model, "the model is not ready")
        config = config.get("config", config)
        extensions = tuple(server.get("extensions", ()))
        return ModelInfo(metadata, config, extensions)

    def prepare(self, step: inputs.Step, index: int) -> Prepared:
        """InferInput objects for ``step``; with system shared memory, the data goes into a region."""
        built = []
        for name, array in step.items():
            datatype = next(t["datatype"] for t in self.info.metadata["inputs"] if t["name"] == name)
            tensor = self._sync.InferInput(name, list(array.shape), datatype)
            if self.settings.shared_memory == "system":
                self._to_region(tensor, name, array, index)
            elif self.settings.protocol == "http":
                tensor.set_data_from_numpy(array, binary_data=self.settings.binary_tensors)
            else:
                tensor.set_data_from_numpy(array)
            built.append(tensor)
        if self.settings.protocol == "http":
            outputs = tuple(self._sync.InferRequestedOutput(o["name"], binary_data=self.settings.binary_tensors)
                            for o in self.info.metadata["outputs"])
        else:
            outputs = tuple(self._sync.InferRequestedOutput(o["name"]) for o in self.info.metadata["outputs"])
        return Prepared(tuple(built), outputs)

    def _to_region(self, tensor, name: str, array: np.ndarray, index: int) -> None:
        import tritonclient.utils.shared_memory as shm
        from tritonclient.utils import serialize_byte_tensor

        data = serialize_byte_tensor(array).item() if array.dtype == np.object_ else array.tobytes()
        region = f"tritium_perf_{self.settings.model}_{name}_{index}"
        handle = shm.create_shared_memory_region(region, "/" + region, max(1, len(data)))
        self._regions.append((region, handle))
        shm.set_shared_memory_region(handle, [np.frombuffer(data, dtype=np.uint8)])
        self._registrations.append((region, "/" + region, max(1, len(data))))
        tensor.set_shared_memory(region, len(data))

    async def register_regions(self) -> None:
        for region, key, size in self._registrations:
            try:
                await self.control.register_system_shared_memory(region, key, size)
            except Exception as exc:
                raise PerfError(f"--shared-memory system: the server refused region '{region}': "
                                f"{server_message(exc)}") from None

    async def infer(self, request: Prepared, sequence_id: int = 0, start: bool = False,
                    end: bool = False) -> None:
        await self.client.infer(self.settings.model, list(request.inputs), model_version=self.settings.version,
                                outputs=list(request.outputs), sequence_id=sequence_id,
                                sequence_start=start, sequence_end=end, headers=self._headers)

    @property
    def _headers(self) -> dict | None:
        # aiohttp offers "gzip, deflate" on every request unless told otherwise, and the server
        # would then compress each answer; perf_analyzer offers no encoding, so neither does this.
        # A new dict each time: tritonclient writes the request's header lengths into it.
        return {"Accept-Encoding": "identity"} if self.settings.protocol == "http" else None

    async def statistics(self) -> dict | None:
        """This model's entry of the statistics extension, counts as integers (None if not offered)."""
        if "statistics" not in self.info.extensions and self.settings.protocol == "http":
            return None
        try:
            stats = await self.control.get_inference_statistics(self.settings.model, self.settings.version,
                                                               **_as_json(self.settings))
        except Exception:
            return None
        entries = stats.get("model_stats", [])
        return _as_numbers(entries[0]) if entries else None

    async def close(self) -> None:
        import tritonclient.utils.shared_memory as shm

        for region, handle in self._regions:
            try:
                await self.control.unregister_system_shared_memory(region)
            except Exception:
                pass  # the server may already be gone; the region is ours to free all the same
            shm.destroy_shared_memory_region(handle)
        self._regions.clear()
        await self.client.close()
        await self.control.close()


def _as_json(settings: PerfSettings) -> dict:
    return {"as_json": True} if settings.protocol == "grpc" else {}


def _as_numbers(value):
    """gRPC's JSON form writes 64-bit counters as strings; the statistics deltas need numbers."""
    if isinstance(value, dict):
        return {k: _as_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_numbers(v) for v in value]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value
