"""CONTROL requests from gateways (model table, statistics, status, index, load, unload, log
settings, trace settings, shared memory regions), each answered with one CONTROL_REPLY; owns the
log settings, the trace settings (broker/tracing.py) and the registry's shared memory regions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tritium.broker.lifecycle import ModelLifecycle
from tritium.broker.membership import Membership
from tritium.broker.registry import Registry, VersionState
from tritium.broker.tracing import BrokerTracing
from tritium import logs
from tritium.errors import AlreadyExists, InternalError, InvalidArgument, TritiumError
from tritium.logs import LogSettings
from tritium.protocol import (ChangeLogSettings, ControlArgs, ControlReply, IndexQuery, LoadModel, ModelsQuery,
                              RegisterRegion, SharedMemoryRegion, StatsQuery, StatusQuery, TraceDone,
                              TraceSettingsQuery, UnloadModel, UnregisterRegion)
from tritium.protocol import Control as ControlRequest
from tritium.protocol import LogSettings as LogSettingsMessage

log = logging.getLogger(__name__)

Send = Callable[[list], None]


class Control:
    def __init__(self, registry: Registry, membership: Membership, lifecycle: ModelLifecycle,
                 send_frontend: Send, send_backend: Send, push_models_if_changed: Callable[[], None],
                 log_settings: LogSettings) -> None:
        self.registry = registry
        self.membership = membership
        self.lifecycle = lifecycle
        self._send_frontend = send_frontend
        self._send_backend = send_backend
        self._push_models_if_changed = push_models_if_changed
        self.log_settings = log_settings
        self.tracing = BrokerTracing()

    def handle(self, peer: bytes, request: ControlRequest, send: Send | None = None) -> None:
        """Carry out ``request`` and answer ``peer`` with ``send`` (the frontend's: a gateway's or
        ``serve``'s; the backend's: a model's, on its BLS socket)."""
        rid = request.rid
        send = send or self._send_frontend

        def reply(result) -> None:
            self._push_models_if_changed()  # a client told "loaded" must find the model at once
            if isinstance(result, TritiumError):
                message = ControlReply(rid, error=result)
            else:
                message = ControlReply(rid, result)
            send([peer, message.encode()])

        args = request.args
        try:
            if isinstance(args, LoadModel):  # answered when the load is done, which may take a while
                self.lifecycle.load(args.model, args.parameters, reply)
            else:
                reply(self._control(args))
        except TritiumError as exc:
            reply(exc)
        except Exception as exc:   # an unexpected failure still answers the asker
            log.exception("control operation %r failed", args.op.value)
            reply(InternalError(f"control operation '{args.op.value}' failed: {exc}"))

    def _control(self, args: ControlArgs):
        if isinstance(args, ModelsQuery):
            return self.registry.table()
        if isinstance(args, StatsQuery):
            return self._stats(args.model, args.version)
        if isinstance(args, StatusQuery):
            return {"loading_done": self.registry.loading_done(), "ready": self.registry.server_ready(),
                    "failures": self._failures(), "repository_errors": list(self.lifecycle.repository_errors)}
        if isinstance(args, IndexQuery):
            return self.lifecycle.index(args.ready)
        if isinstance(args, UnloadModel):
            self.lifecycle.unload(args.model, args.unload_dependents)
            return {}
        if isinstance(args, ChangeLogSettings):
            return self._change_log_settings(args.changes)
        if isinstance(args, (TraceSettingsQuery, TraceDone)):
            return self._trace(args)
        if isinstance(args, RegisterRegion):
            return self._register_region(args)
        if isinstance(args, UnregisterRegion):
            self._unregister_region(args.name)
            return {}
        raise InvalidArgument(f"unknown control operation '{args.op.value}'")

    # -- log settings ---------------------------------------------------------------------

    def _change_log_settings(self, changes: dict) -> dict:
        """Triton's logging extension: the new settings reach every process."""
        settings = self.log_settings.updated(changes)
        if settings != self.log_settings:
            self.log_settings = settings
            logs.apply(settings)
            log.info("log settings changed: %s", settings.as_dict())
            for gateway in self.membership.gateways:
                self._send_frontend([gateway, self.log_settings_message()])
            for peer in [*self.registry.agents, *self.registry.instances]:
                self._send_backend([peer, self.log_settings_message()])
        return settings.as_dict()

    def log_settings_message(self) -> bytes:
        return LogSettingsMessage(self.log_settings.as_dict()).encode()

    # -- trace settings ---------------------------------------------------------------------

    def _trace(self, args: TraceSettingsQuery | TraceDone) -> dict | None:
        """Triton's trace extension; gateways get changed settings with the model table."""
        answer = None   # trace_done answers nothing
        if isinstance(args, TraceSettingsQuery):
            answer = self.tracing.settings(args)
        else:
            self.tracing.done(args)
        if self.tracing.revision != (self.registry.trace_settings or {}).get("revision", -1):
            self.registry.trace_settings = self.tracing.as_wire()
            self.membership.changed()
        return answer

    # -- shared memory regions ------------------------------------------------------------

    def _register_region(self, args: RegisterRegion) -> dict:
        """Record a client's shared memory region (the gateway checked it maps)."""
        name = args.name
        if not name:
            raise InvalidArgument("a shared memory region needs a name")
        if name in self.registry.shared_memory:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self.registry.shared_memory[name] = SharedMemoryRegion(name, args.key, args.offset, args.byte_size)
        self.membership.changed()
        return {}

    def _unregister_region(self, name: str | None) -> None:
        if name is None:
            self.registry.shared_memory.clear()
        else:
            self.registry.shared_memory.pop(name, None)  # unknown names succeed, as in Triton
        self.membership.changed()

    # -- statistics and status ------------------------------------------------------------

    def _failures(self) -> list[str]:
        failures = []
        for record in self.registry.models.values():
            if record.error:
                failures.append(f"{record.name}: {record.error}")
            for number, error in record.version_errors.items():
                failures.append(f"{record.name} version {number}: {error}")
            for number, version in record.versions.items():
                if version.state == VersionState.UNAVAILABLE:
                    failures.append(f"{record.name} version {number}: {version.reason}")
        return failures

    def _stats(self, model: str | None, version: int | None) -> list[dict]:
        if model is None:   # by name, then version, as Triton lists them
            serving = sorted((v for v in self.registry.versions.values() if v.state == VersionState.READY),
                             key=lambda v: (v.name, v.version))
            return [v.stats.as_dict(v.name, v.version) for v in serving]
        record = self.registry.models.get(model)
        ready = {n: v for n, v in (record.versions.items() if record else []) if v.state == VersionState.READY}
        if not ready:
            raise InvalidArgument(f"requested model '{model}' is not available")
        if version is not None:
            if version not in ready:
                raise InvalidArgument(f"requested model version is not available for model '{model}'")
            return [ready[version].stats.as_dict(model, version)]
        return [v.stats.as_dict(model, n) for n, v in sorted(ready.items())]
