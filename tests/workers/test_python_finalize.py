"""PythonInstance.finalize with and without the model's event loop: the model's finalize always
runs, and the loop, once made, stops (before a sync finalize, as Triton's stub stops it)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tritium.workers.backends.python_backend import PythonInstance


class Model:
    def __init__(self, kind: str) -> None:
        self.finalized_with_loop_running: list[bool] = []
        self.instance: PythonInstance | None = None
        if kind == "sync":
            self.finalize = self._sync
        elif kind == "async":
            self.finalize = self._async

    def _sync(self) -> None:
        self.finalized_with_loop_running.append(self._loop_running())

    async def _async(self) -> None:
        await asyncio.sleep(0)
        self.finalized_with_loop_running.append(self._loop_running())

    def _loop_running(self) -> bool:
        thread = self.instance._loop_thread
        return thread is not None and thread.is_alive()


def instance_of(model: Model, with_loop: bool) -> PythonInstance:
    """An instance around ``model``, as far as finalize needs one (no model files loaded)."""
    instance = PythonInstance.__new__(PythonInstance)
    instance.model = model
    instance._loop, instance._loop_thread, instance._loop_made = None, None, threading.Lock()
    model.instance = instance
    if with_loop:
        instance._run(asyncio.sleep(0))   # a coroutine made the loop
    return instance


@pytest.mark.parametrize("kind, with_loop, running", [
    ("sync", False, [False]), ("sync", True, [False]), ("async", False, [True]), ("async", True, [True]),
    ("none", True, []), ("none", False, []),
])
def test_finalize_runs_the_models_and_stops_the_loop(kind, with_loop, running):
    model = Model(kind)
    instance = instance_of(model, with_loop)
    instance.finalize()
    assert model.finalized_with_loop_running == running
    if instance._loop_thread is not None:
        instance._loop_thread.join(5)
        assert not instance._loop_thread.is_alive()
