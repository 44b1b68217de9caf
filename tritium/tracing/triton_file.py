"""Triton's trace file: a JSON array of records, one per model name and one per timestamp.

Each traced request is a tree (an ensemble's steps are its children). Records are
numbered when they are written, so that traces from several gateways share one count:
a request's id, then its steps' ids, each step with ``parent_id``. A step's records come
before its parent's, as a step ends first. With ``log_frequency`` N, every N traces go to
``FILE.<index>``; with 0, everything goes to ``FILE`` when tracing stops.

Files are written by a thread of their own, in the order they were made: a slow disk, a
pipe nobody reads or a large tensor to format holds up that thread, never the broker's loop
that serves requests.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

import orjson

from tritium.tracing.stamps import INFER_RESPONSE_COMPLETE, QUEUE_START
from tritium.tracing.tensors import TENSOR_BACKEND_OUTPUT, TENSOR_QUEUE_INPUT, formatted

log = logging.getLogger(__name__)

_FRONT_END = ("HTTP_", "GRPC_")
MAX_UNWRITTEN = 64   # files waiting for the writer thread before new ones are dropped


def trace_records(tree: dict, ids, parent_id: int | None = None) -> list[dict]:
    """The file's records for one request and its steps, numbered from ``ids``."""
    own_id = next(ids)
    inputs = [{"id": own_id, "activity": TENSOR_QUEUE_INPUT, "tensor": tensor}
              for tensor in formatted(tree.get("inputs", ()), tree["m"])]
    outputs = [{"id": own_id, "activity": TENSOR_BACKEND_OUTPUT, "tensor": tensor}
               for tensor in formatted(tree.get("outputs", ()), tree["m"])]
    steps = [dict(step, stamps=False) for step in tree.get("steps") or ()] if tree.get("stamps") is False \
        else tree.get("steps") or ()
    children = [record for step in steps for record in trace_records(step, ids, own_id)]
    if tree.get("stamps") is False:   # trace level TENSORS alone: the tensors, its steps' first
        return children + inputs + outputs
    model = {"id": own_id, "model_name": tree["m"], "model_version": tree["v"]}
    if tree.get("rid"):   # the client's request id, when it gave one
        model["request_id"] = tree["rid"]
    if parent_id is not None:
        model["parent_id"] = parent_id
    stamps = sorted(tree["ts"], key=lambda stamp: stamp[1])
    own = [{"id": own_id, "timestamps": [{"name": stamp[0], "ns": stamp[1]}]} for stamp in stamps]
    received = sum(1 for _ in itertools.takewhile(lambda stamp: stamp[0].startswith(_FRONT_END), stamps))
    own.insert(received, model)   # after the front end's receive stamps, as Triton writes it
    if inputs or outputs:
        # As Triton: the inputs after QUEUE_START, the outputs before INFER_RESPONSE_COMPLETE, or
        # right after the inputs for a step or a BLS call, which has no INFER_RESPONSE_COMPLETE.
        queued = _after(own, QUEUE_START)
        own[queued:queued] = inputs
        complete = _after(own, INFER_RESPONSE_COMPLETE, queued + len(inputs) + 1) - 1
        own[complete:complete] = outputs
    return children + own


def _after(records: list[dict], stamp: str, otherwise: int | None = None) -> int:
    """The index just after the record of ``stamp`` (``otherwise`` when there is none: the end)."""
    for index, record in enumerate(records):
        if "timestamps" in record and record["timestamps"][0]["name"] == stamp:
            return index + 1
    return len(records) if otherwise is None else otherwise


class TraceFile:
    """Collects finished traces and writes them as Triton does."""

    def __init__(self) -> None:
        self._traces = 0   # taken since the last file
        self._index = 0
        self._path = ""
        self._writer = _Writer()

    def add(self, path: str, log_frequency: int, tree: dict) -> None:
        if path != self._path:
            self.flush()
            self._path, self._index = path, 0
        self._writer.take(tree)
        self._traces += 1
        if log_frequency and self._traces >= log_frequency:
            self.flush(indexed=True)

    def flush(self, indexed: bool | None = None) -> None:
        """Write what was collected: to ``FILE.<index>`` (``indexed``, or a file already split), else ``FILE``."""
        if not self._traces or not self._path:
            return
        if indexed is None:
            indexed = self._index > 0
        target = f"{self._path}.{self._index}" if indexed else self._path
        if indexed:
            self._index += 1
        self._writer.write(target)
        self._traces = 0

    def wait(self, timeout_s: float) -> bool:
        """Whether every file flushed so far is written, waiting up to ``timeout_s`` for it."""
        return self._writer.wait(timeout_s)


class _Writer:
    """One thread that makes the traces' records as they come (numbered in the order taken,
    tensors formatted), off the broker's loop, and writes the files it is given, in order;
    started with the first trace. Records are made as traces come, not when a file is due, so
    that stopping has only the last file to write."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        # ("tree", a trace) or ("file", its path; "" when dropped), in the order given
        self._work: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._records: list[dict] = []   # of the traces taken since the last file (the thread's own)
        self._unwritten = 0
        self._written = threading.Condition()
        self._thread: threading.Thread | None = None

    def take(self, tree: dict) -> None:
        with self._written:
            if self._unwritten >= MAX_UNWRITTEN:
                return   # the thread is stuck: the trace goes with its file, which write() drops
        self._start()
        self._work.put(("tree", tree))

    def write(self, target: str) -> None:
        with self._written:
            if self._unwritten >= MAX_UNWRITTEN:   # the thread is stuck: keep the broker's memory bounded
                log.error("the trace file writer is %d files behind; %s is dropped", self._unwritten, target)
                target = ""
            else:
                self._unwritten += 1
        self._start()
        self._work.put(("file", target))

    def wait(self, timeout_s: float) -> bool:
        with self._written:
            return self._written.wait_for(lambda: self._unwritten == 0, timeout_s)

    def _start(self) -> None:
        if self._thread is None:   # a daemon: one stuck on a pipe does not keep the process alive
            self._thread = threading.Thread(target=self._run, name="trace-file", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            kind, item = self._work.get()
            if kind == "tree":
                self._make_records(item)
                continue
            records, self._records = self._records, []
            if not item:
                continue   # dropped, its traces with it
            try:
                _write_whole(Path(item), orjson.dumps(records))
            except OSError as exc:
                log.error("cannot write the trace file %s: %s", item, exc)
            except Exception:   # (a record orjson cannot write): the thread goes on with the next file
                log.exception("cannot write the trace file %s", item)
            finally:
                with self._written:
                    self._unwritten -= 1
                    self._written.notify_all()

    def _make_records(self, tree: dict) -> None:
        try:
            self._records.extend(trace_records(tree, self._ids))
        except Exception:   # a malformed trace from a peer costs itself, not the file or the thread
            log.exception("a trace of model '%s' could not be written",
                          tree.get("m", "?") if isinstance(tree, dict) else "?")


def _write_whole(path: Path, data: bytes) -> None:
    """A reader sees the whole file or none of it: written beside the file under a hidden name,
    then renamed over it. Where that cannot be (a pipe or a device, a folder this process may not
    write, a file mounted on its own), written in place, as before."""
    target = Path(os.path.realpath(path))   # a link keeps pointing where it did
    if target.exists() and not target.is_file():
        target.write_bytes(data)
        return
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        partial.write_bytes(data)
        os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)
        target.write_bytes(data)
