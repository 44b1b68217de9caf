"""Poll mode (``--model-control-mode=poll``): every ``poll_seconds``, load what was added or
changed in the model repository and unload what was removed from it; owns which models'
folders went away.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tritium.broker.registry import Registry
from tritium.repo import ModelRepository

if TYPE_CHECKING:
    from tritium.broker.ensemble_loading import EnsembleLoader, LoadSteps
    from tritium.broker.lifecycle import LoadInProgress
    from tritium.broker.model_reads import ModelReader

log = logging.getLogger(__name__)


class RepositoryPoller:
    def __init__(self, registry: Registry, repository: ModelRepository, loads: dict[str, LoadInProgress],
                 steps: LoadSteps, reader: ModelReader, ensembles: EnsembleLoader, poll_seconds: float,
                 enabled: bool) -> None:
        self.registry = registry
        self.repository = repository
        self._loads = loads   # the lifecycle's loads in progress: a model loading now is left alone
        self._steps = steps
        self._reader = reader
        self._ensembles = ensembles
        self._poll_seconds = poll_seconds
        self._enabled = enabled
        self._next_poll = time.monotonic() + poll_seconds
        self.removed: set[str] = set()   # models whose folder went away
        self._fetching = False   # a bucket repository's fetch for the next poll is running

    def poll_due(self) -> bool:
        return self._enabled and not self._fetching and time.monotonic() >= self._next_poll

    def poll(self) -> None:
        """Load what was added or changed on disk, unload what was removed; never stop polling.
        A bucket repository's mirror is fetched first, on the reader's threads."""
        self._next_poll = time.monotonic() + self._poll_seconds
        if self.repository.remote:
            self._fetching = True
            self._reader.run_later(self.repository.fetch, self._poll_fetched)
            return
        self._poll_now()

    def _poll_fetched(self, failure: str | None) -> None:
        self._fetching = False
        self._next_poll = time.monotonic() + self._poll_seconds
        if failure is not None:   # its copy stays as last fetched: nothing of it is unloaded
            log.error("polling the model repository: %s; its copy is read as last fetched", failure)
        self._poll_now()

    def _poll_now(self) -> None:
        try:
            self._poll_repository()
        except Exception:  # the next poll tries again, as Triton's does
            log.exception("polling the model repository failed; polling goes on")

    def _poll_repository(self) -> None:
        # A folder found in several repositories is not unique: Triton's poll neither loads it nor
        # keeps what was loaded of it (its index says so: lifecycle.index).
        on_disk = {name for name, folders in self.repository.discover()[0].items() if len(folders) == 1}
        for name in sorted(on_disk):
            if name in self._loads:
                continue
            record = self.registry.models.get(name)
            if record is None or record.fingerprint != self._reader.fingerprint(name):
                log.info("repository change: (re)loading model %s", name)
                self.removed.discard(name)
                self._steps.schedule_read(name, None, None, None)
        for name, record in list(self.registry.models.items()):
            if name not in on_disk and name not in self.removed and name not in self._loads:
                self.removed.add(name)
                self._ensembles.forget_dependent(name)   # (a refused ensemble is not tried again either)
                record.fingerprint = ()   # the same folder moved back in is a new load
                if record.rejected:   # nothing of it serves (a duplicate since the start, say): nothing to unload
                    continue
                log.info("repository change: model %s was removed, or is in several repositories now; unloading it",
                         name)
                self._steps.unload_now(name)
