"""Triton's trace extension, the broker's part: the one copy of the settings every gateway
samples with (pushed to them in the model table), the trace count, and the trace file.

Gateways seed the settings with their startup flags (the first to connect wins: a
deployment's gateways share one configuration), ask for and change them with CONTROL
``trace_settings``, and report each finished trace with CONTROL ``trace_done``.
"""

from __future__ import annotations

import logging

from tritium.protocol import TraceDone, TraceSettingsQuery
from tritium.tracing.settings import TraceSettings, TraceSettingsStore
from tritium.tracing.triton_file import TraceFile

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0   # how long the broker's exit waits for the last trace file


class BrokerTracing:
    def __init__(self) -> None:
        self.store: TraceSettingsStore | None = None
        self.file = TraceFile()

    def settings(self, args: TraceSettingsQuery) -> dict:
        """CONTROL ``trace_settings``: seed (``startup``), change (``changes``) and read the
        settings of ``model`` (None: the global ones), answered as Triton writes them."""
        store = self._seed(args.startup)
        model, changes = args.model, args.changes
        if changes:
            before = store.effective(model)
            settings = store.update(model, changes)
            if settings.file != before.file or settings.log_frequency != before.log_frequency:
                self.file.flush()
            log.info("trace settings%s changed: %s", f" of model '{model}'" if model else "", settings.as_triton())
        return store.effective(model).as_triton()

    def done(self, args: TraceDone) -> None:
        """CONTROL ``trace_done``: one trace was taken (and, in triton mode, its tree to write)."""
        store = self._seed(args.startup)
        model = args.model
        settings = store.effective(model)
        if args.tree is not None and settings.file:
            self.file.add(settings.file, settings.log_frequency, args.tree)
        if store.took_one(model):
            self.file.flush(indexed=True)   # the count ran out: what was taken is written, as Triton does

    def _seed(self, startup: dict | None) -> TraceSettingsStore:
        """The store; the first gateway to speak (to this broker process: a restarted one starts
        over) gives the startup settings."""
        if self.store is None:
            self.store = TraceSettingsStore(TraceSettings.from_wire(startup or {}))
        return self.store

    @property
    def revision(self) -> int:
        return self.store.revision if self.store is not None else -1

    def as_wire(self) -> dict | None:
        return None if self.store is None else self.store.as_wire()

    def close(self) -> None:
        """Write what is left; a file that cannot be written in CLOSE_TIMEOUT_S (a pipe nobody
        reads) does not hold up the broker's exit."""
        self.file.flush()
        if not self.file.wait(CLOSE_TIMEOUT_S):
            log.warning("the trace file is still being written after %.0f s; stopping without it", CLOSE_TIMEOUT_S)
