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
from tritium.protocol import Control as ControlRequest
from tritium.protocol import ControlOp, ControlReply, SharedMemoryRegion
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

    def handle(self, peer: bytes, request: ControlRequest) -> None:
        rid = request.rid

        def reply(result) -> None:
            self._push_models_if_changed()  # a client told "loaded" must find the model at once
            if isinstance(result, TritiumError):
                message = ControlReply(rid, error=result)
            else:
                message = ControlReply(rid, result)
            self._send_frontend([peer, message.encode()])

        op, args = request.op, request.args or {}
        try:
            if op is ControlOp.LOAD:  # answered when the load is done, which may take a while
                self.lifecycle.load(_model_name(args), args.get("parameters") or {}, reply)
            else:
                reply(self._control(op, args))
        except TritiumError as exc:
            reply(exc)
        except Exception as exc:   # an unexpected failure still answers the asker
            log.exception("control operation %r failed", op.value)
            reply(InternalError(f"control operation '{op.value}' failed: {exc}"))

    def _control(self, op: ControlOp, args: dict):
        if op is ControlOp.MODELS:
            return self.registry.table()
        if op is ControlOp.STATS:
            return self._stats(args.get("model"), args.get("version"))
        if op is ControlOp.STATUS:
            return {"loading_done": self.registry.loading_done(), "ready": self.registry.server_ready(),
                    "failures": self._failures(), "repository_errors": list(self.lifecycle.repository_errors)}
        if op is ControlOp.INDEX:
            return self.lifecycle.index(bool(args.get("ready")))
        if op is ControlOp.UNLOAD:
            self.lifecycle.unload(_model_name(args), bool(args.get("unload_dependents")))
            return {}
        if op is ControlOp.LOG_SETTINGS:
            return self._change_log_settings(args.get("changes") or {})
        if op is ControlOp.TRACE_SETTINGS or op is ControlOp.TRACE_DONE:
            return self._trace(op, args)
        if op is ControlOp.SHM_REGISTER:
            return self._register_region(args)
        if op is ControlOp.SHM_UNREGISTER:
            self._unregister_region(args.get("name"))
            return {}
        raise InvalidArgument(f"unknown control operation '{op.value}'")

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

    def _trace(self, op: ControlOp, args: dict) -> dict | None:
        """Triton's trace extension; gateways get changed settings with the model table."""
        answer = None   # trace_done answers nothing
        if op is ControlOp.TRACE_SETTINGS:
            answer = self.tracing.settings(args)
        else:
            self.tracing.done(args)
        if self.tracing.revision != (self.registry.trace_settings or {}).get("revision", -1):
            self.registry.trace_settings = self.tracing.as_wire()
            self.membership.changed()
        return answer

    # -- shared memory regions ------------------------------------------------------------

    def _register_region(self, args: dict) -> dict:
        """Record a client's shared memory region (the gateway checked it maps)."""
        name = args.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument("a shared memory region needs a name")
        if name in self.registry.shared_memory:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self.registry.shared_memory[name] = SharedMemoryRegion(name, str(args["key"]), int(args["offset"]),
                                                               int(args["byte_size"]))
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
        if model is None:
            return [v.stats.as_dict(v.name, v.version) for v in self.registry.versions.values()
                    if v.state == VersionState.READY]
        record = self.registry.models.get(model)
        ready = {n: v for n, v in (record.versions.items() if record else []) if v.state == VersionState.READY}
        if not ready:
            raise InvalidArgument(f"requested model '{model}' is not available")
        if version is not None:
            if version not in ready:
                raise InvalidArgument(f"requested model version is not available for model '{model}'")
            return [ready[version].stats.as_dict(model, version)]
        return [v.stats.as_dict(model, n) for n, v in sorted(ready.items())]


def _model_name(args: dict) -> str:
    name = args.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a model name is required")
    return name
