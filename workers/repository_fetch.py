"""The worker agent's model repositories, those in buckets (S3, GCS, Azure) fetched off its loop.

A folder repository is read where it is. A repository in a bucket is read through this host's
mirror of it (repo/cloud_mirror.py): before a load's instances first start on this host, the model's folder is
fetched and a snapshot of it taken (hard links), which that load's instances run from, so
that later fetches (the broker's polls in the shared mirror, the next load) never change the
files under a running version. The fetch may download gigabytes, so it runs on a thread while
the loop goes on heartbeating and supervising; the broker's loads, scalings and unloads that
arrive meanwhile wait behind it and are handled in the order they came, so an unload never
overtakes the load it follows. Its other messages (heartbeats, resets, refusals, log
settings) are handled at once.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from tritium.protocol import Assign, Assignment, Scale, Unassign
from tritium.repo import ModelRepository
from tritium.repo.names import name_problem

log = logging.getLogger(__name__)
_HELD = (Assign, Scale, Unassign)   # the messages that keep their order behind a fetch


# What a fetch thread hands the loop: model -> its failure (None: fetched), and the snapshots
# it took, (model, epoch) -> folder (None: the model is in a folder repository).
FetchOutcome = tuple[dict[str, str | None], dict[tuple[str, int], Path | None]]


class RepositoryFetcher:
    def __init__(self, locations: tuple[str, ...]) -> None:
        self._repository = ModelRepository(locations)
        self.roots: tuple[Path, ...] = self._repository.roots
        self._held: deque = deque()   # messages waiting behind a fetch, in arrival order
        self._running: Future[FetchOutcome] | None = None
        self._abandoned: list[Future[FetchOutcome]] = []   # fetches a reset or a drain stopped waiting for
        self._fetched: object = None    # the held message whose models are fetched
        self._failures: dict[str, str] = {}   # model -> why its last fetch failed
        self._snapshots: dict[tuple[str, int], Path | None] = {}   # (model, epoch) -> the folder its instances run from
        self._retired: set[Path] = set()   # snapshots of no load any more, removed once no instance runs from them
        self._boot: int | None = None   # the broker process whose epochs ``_snapshots`` holds
        self._areas: dict[str, SnapshotArea] = {}   # bucket location -> this agent's snapshots in its mirror
        self._areas_lock = threading.Lock()   # fetch threads make areas; the loop closes them
        self._closed = False
        self.draining = False   # set by the agent: loads are refused, so nothing is fetched for them
        self.wake_fd: int | None = None   # readable when a fetch is done: the loop polls it
        if self._repository.remote:
            self._wake_read, self._wake_write = socket.socketpair()
            self._wake_read.setblocking(False)
            self.wake_fd = self._wake_read.fileno()

    def arrived(self, message) -> list:
        """The messages to handle now, in order, ``message`` last if nothing waits for a fetch."""
        if self.wake_fd is None or not isinstance(message, _HELD):
            return [message]
        self._held.append(message)
        return self._release()

    def completed(self) -> list:
        """On the loop, once ``wake_fd`` is readable: the messages the finished fetch held back."""
        try:
            self._wake_read.recv(64)
        except BlockingIOError:
            pass
        for done in [future for future in self._abandoned if future.done()]:   # nobody waits for their snapshots
            self._abandoned.remove(done)
            self._retired.update(path for path in done.result()[1].values() if path is not None)
        if self._running is None or not self._running.done():
            return []
        failures, snapshots = self._running.result()
        self._running = None
        for model, failure in failures.items():
            if failure is None:
                self._failures.pop(model, None)
            else:
                self._failures[model] = failure
        self._snapshots.update(snapshots)
        return self._release()

    def broker_is(self, boot: int | None) -> None:
        """The broker process that speaks now (a heartbeat's or a reset's boot): epochs are per
        broker process, so another one's loads are fetched again (the snapshots of what it adopts
        stay until no instance runs from them)."""
        if boot is None:
            return
        if self._boot is not None and boot != self._boot:
            self._retired.update(path for path in self._snapshots.values() if path is not None)
            self._snapshots.clear()
        self._boot = boot

    def reset(self) -> list:
        """The broker forgot this host, or another broker process answers: its held unloads, to
        handle now; its held loads and scalings are dropped (the broker that answers the new
        HELLO sends its own), and a fetch running for them is not waited for."""
        unloads = [message for message in self._held if isinstance(message, Unassign)]
        self._held.clear()
        self._abandon()
        return unloads

    def start_draining(self) -> list:
        """The host drains: every held message, to handle now (the agent refuses the loads), and
        nothing is fetched from now on."""
        self.draining = True
        held = list(self._held)
        self._held.clear()
        self._abandon()
        return held

    def model_dir(self, assignment: Assignment) -> Path | None:
        """The snapshot the load's instances run from; None when the model is read from a
        folder repository. Raises LookupError, saying why, when it could not be fetched."""
        key = (assignment.model, assignment.epoch)
        if key in self._snapshots or self.wake_fd is None:
            return self._snapshots.get(key)
        failure = self._failures.get(assignment.model)
        raise LookupError(failure or f"model '{assignment.model}' was not fetched")

    def release(self, epoch: int) -> None:
        """A load was unloaded: its snapshots go once its instances have stopped (``collect``)."""
        for key in [key for key in self._snapshots if key[1] == epoch]:
            snapshot = self._snapshots.pop(key)
            if snapshot is not None:
                self._retired.add(snapshot)

    def collect(self, in_use: set[Path]) -> None:
        """Remove the retired snapshots no instance runs from (``in_use``: the instances' folders)."""
        for snapshot in self._retired - in_use:
            shutil.rmtree(snapshot.parent, ignore_errors=True)
            self._retired.discard(snapshot)

    def close(self) -> None:
        """The agent stops: a fetch under way ends soon, and the snapshots it took go (its
        instances have stopped)."""
        self._repository.stop_fetching()
        with self._areas_lock:
            self._closed = True
            areas = list(self._areas.values())
        for area in areas:
            area.close()

    def _abandon(self) -> None:
        if self._running is not None:
            self._abandoned.append(self._running)
        self._running = None
        self._fetched = None

    def _release(self) -> list:
        ready = []
        while self._held and self._running is None:
            message = self._held[0]
            assignments = self._to_fetch(message) if message is not self._fetched else []
            if assignments:
                self._fetched = message
                done: Future[FetchOutcome] = Future()
                self._running = done
                # A daemon thread: an agent told to stop does not wait for a download to end.
                threading.Thread(target=self._fetch, args=(assignments, done), name="repository-fetch", daemon=True).start()
                break
            ready.append(self._held.popleft())
        return ready

    def _to_fetch(self, message) -> list[Assignment]:
        """The loads the message starts instances of from the repository, not yet fetched here."""
        if isinstance(message, Assign):
            assignments = [*message.models, *(scaled.assignment for scaled in message.scale)]
        elif isinstance(message, Scale):
            assignments = [message.assignment]
        else:
            return []
        if self.draining:   # the agent refuses them: nothing to fetch, nothing to hold up
            return []
        return [a for a in assignments if not a.files and (a.model, a.epoch) not in self._snapshots]

    def _fetch(self, assignments: list[Assignment], done: Future[FetchOutcome]) -> None:
        """(On the fetch thread.) Fetch each model's folder and take its load's snapshot; the
        loop takes the outcome (``completed``). Always answers, whatever fails."""
        failures: dict[str, str | None] = {}
        snapshots: dict[tuple[str, int], Path | None] = {}
        try:
            for assignment in assignments:
                failures[assignment.model], snapshot = self._fetch_one(assignment)
                if failures[assignment.model] is None:
                    snapshots[(assignment.model, assignment.epoch)] = snapshot
        finally:
            for assignment in assignments:
                failures.setdefault(assignment.model, "the fetch stopped before this model")
            done.set_result((failures, snapshots))
            self._wake_write.send(b"\0")

    def _fetch_one(self, assignment: Assignment) -> tuple[str | None, Path | None]:
        """(failure, snapshot): the snapshot is None for a model in a folder repository."""
        model = assignment.model
        problem = name_problem(model)
        if problem is not None:
            return f"cannot place model '{model}': {problem}", None
        try:
            failure = self._repository.fetch(model)
            if failure is not None and not assignment.adopt:
                log.error("cannot fetch model %s: %s", model, failure)
                return failure, None
            if failure is not None:   # its running instances are kept: start any others from the last copy
                log.error("cannot fetch model %s, using the copy fetched before: %s", model, failure)
            return None, self._snapshot(model)
        except Exception as exc:  # a bug of ours, or the disk: this load fails, not the agent
            log.exception("fetching model %s failed", model)
            return repr(exc), None   # (the agent says which model could not be fetched)

    def _snapshot(self, model: str) -> Path | None:
        for location, mirror in self._repository.mirrors.items():
            if (mirror.root / model).is_dir():
                with self._areas_lock:
                    if self._closed:
                        raise RuntimeError("the agent is stopping")
                    area = self._areas.get(location) or self._areas.setdefault(location, SnapshotArea(mirror.snapshots))
                return mirror.snapshot(model, area.new_folder() / model)
        return None


class SnapshotArea:
    """This agent's folder of snapshots in one mirror. It holds a lock on it while it lives,
    so that an agent (of this host, or of another container sharing the mount) can tell an
    abandoned area (its agent was killed) from one in use, and remove it."""

    def __init__(self, snapshots: Path) -> None:
        snapshots.mkdir(exist_ok=True)
        _remove_abandoned(snapshots)
        self.folder = Path(tempfile.mkdtemp(prefix=_AREA_PREFIX, dir=snapshots))
        self._lock = open(self.folder / _AREA_LOCK, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def new_folder(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.folder))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self._lock.close()


_AREA_PREFIX, _AREA_LOCK = "agent-", ".lock"
_AREA_GRACE_S = 60   # an area this young may be one whose agent has not taken its lock yet


def _remove_abandoned(snapshots: Path) -> None:
    for area in snapshots.glob(f"{_AREA_PREFIX}*"):
        try:
            if time.time() - area.stat().st_mtime < _AREA_GRACE_S:
                continue
            with open(area / _AREA_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # raises while its agent lives
        except OSError:
            continue
        shutil.rmtree(area, ignore_errors=True)
