"""The worker agent's model repositories, S3 ones fetched off its loop.

A folder repository is read where it is. An S3 repository is read through this host's mirror
of it (repo/s3.py), and a model's folder is fetched before its instances start: the fetch may
download gigabytes, so it runs on a thread while the loop goes on heartbeating and supervising.
The broker's messages that arrive meanwhile wait behind the one being fetched for and are
handled in the order they came, so an unload never overtakes the load it follows.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tritium.protocol import Assign, Scale
from tritium.repo import ModelRepository

log = logging.getLogger(__name__)


class RepositoryFetcher:
    def __init__(self, locations: tuple[str, ...]) -> None:
        self.locations = locations
        self._repository = ModelRepository(locations)
        self.roots: tuple[Path, ...] = self._repository.roots
        self._held: deque = deque()   # messages waiting behind a fetch, in arrival order
        self._running: Future | None = None
        self._fetched: object = None    # the held message whose models are fetched
        self._failures: dict[str, str] = {}   # model -> why its last fetch failed
        self._pool: ThreadPoolExecutor | None = None
        self.wake_fd: int | None = None   # readable when a fetch is done: the loop polls it
        if self._repository.remote:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="s3-fetch")
            self._wake_read, self._wake_write = socket.socketpair()
            self._wake_read.setblocking(False)
            self.wake_fd = self._wake_read.fileno()

    def arrived(self, message) -> list:
        """The messages to handle now, in order, ``message`` last if nothing waits for a fetch."""
        if self._pool is None:
            return [message]
        self._held.append(message)
        return self._release()

    def completed(self) -> list:
        """On the loop, once ``wake_fd`` is readable: the messages the finished fetch held back."""
        try:
            self._wake_read.recv(64)
        except BlockingIOError:
            pass
        if self._running is None or not self._running.done():
            return []
        self._failures.update(self._running.result())
        self._failures = {model: why for model, why in self._failures.items() if why is not None}
        self._running = None
        return self._release()

    def failure(self, model: str) -> str | None:
        """Why the model's folder could not be fetched the last time, or None."""
        return self._failures.get(model)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _release(self) -> list:
        ready = []
        while self._held and self._running is None:
            message = self._held[0]
            models = _models_placed_by(message) if message is not self._fetched else set()
            if models:
                self._fetched = message
                self._running = self._pool.submit(self._fetch, models)
                self._running.add_done_callback(lambda _: self._wake_write.send(b"\0"))
                break
            ready.append(self._held.popleft())
        return ready

    def _fetch(self, models: set[str]) -> dict[str, str | None]:
        """(On the fetch thread.) Each model's failure, or None once its folder is in step."""
        failures = {}
        for model in sorted(models):
            failures[model] = self._repository.fetch(model)
            if failures[model] is not None:
                log.error("cannot fetch model %s: %s", model, failures[model])
        return failures


def _models_placed_by(message) -> set[str]:
    """The models whose instances the message starts from the repository (not from shipped files)."""
    if isinstance(message, Assign):
        assignments = [*message.models, *(scaled.assignment for scaled in message.scale)]
    elif isinstance(message, Scale):
        assignments = [message.assignment]
    else:
        return set()
    return {assignment.model for assignment in assignments if not assignment.files}
