"""Triton's trace file as tritium writes it: the records of each trace, files written whole, and
written by a thread of their own (``wait`` before reading them)."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time

import numpy as np

from tritium.broker import tracing
from tritium.broker.tracing import BrokerTracing
from tritium.tracing import triton_file
from tritium.tracing.triton_file import TraceFile


def tree(model: str, start_ns: int) -> dict:
    return {"m": model, "v": 1, "ts": [["HTTP_RECV_START", start_ns], ["REQUEST_START", start_ns + 5],
                                       ["HTTP_SEND_END", start_ns + 9]]}


def test_every_n_traces_go_to_the_next_numbered_file_whole_and_nothing_else_is_left(tmp_path):
    traces = TraceFile()
    path = str(tmp_path / "trace.json")
    for number in range(4):
        traces.add(path, 2, tree(f"m{number}", 100 * number))
    assert traces.wait(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]
    first = json.loads((tmp_path / "trace.json.0").read_bytes())
    assert [r.get("model_name") for r in first if "model_name" in r] == ["m0", "m1"]
    assert [r["id"] for r in first] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert first[1] == {"id": 1, "model_name": "m0", "model_version": 1}   # after the front end's receive stamp


def test_tracing_stopped_writes_the_rest_to_the_file_itself(tmp_path):
    traces = TraceFile()
    path = str(tmp_path / "trace.json")
    traces.add(path, 0, tree("m", 1))
    assert list(tmp_path.iterdir()) == []
    traces.flush()
    assert traces.wait(10)
    assert [r["id"] for r in json.loads((tmp_path / "trace.json").read_bytes())] == [1, 1, 1, 1]
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_a_file_that_cannot_be_written_is_logged_and_leaves_no_partial_file(tmp_path, caplog):
    (tmp_path / "trace.json").mkdir()   # a folder where the file should go: the rename fails
    traces = TraceFile()
    traces.add(str(tmp_path / "trace.json"), 0, tree("m", 1))
    with caplog.at_level(logging.ERROR):
        traces.flush()
        assert traces.wait(10)
    assert "cannot write the trace file" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_a_link_to_the_trace_file_stays_a_link_and_the_file_it_names_gets_the_traces(tmp_path):
    real = tmp_path / "real" / "trace.json"
    real.parent.mkdir()
    (tmp_path / "trace.json").symlink_to(real)
    traces = TraceFile()
    traces.add(str(tmp_path / "trace.json"), 0, tree("m", 1))
    traces.flush()
    assert traces.wait(10)
    assert (tmp_path / "trace.json").is_symlink()
    assert [r["id"] for r in json.loads(real.read_bytes())] == [1, 1, 1, 1]
    assert sorted(p.name for p in real.parent.iterdir()) == ["trace.json"]


def test_a_pipe_as_the_trace_file_is_written_into_not_replaced(tmp_path):
    pipe = tmp_path / "trace.json"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    traces = TraceFile()
    traces.add(str(pipe), 0, tree("m", 1))
    traces.flush()
    reader.join(timeout=10)
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert [r["id"] for r in json.loads(received[0])] == [1, 1, 1, 1]


def test_a_pipe_nobody_reads_holds_up_only_the_writer_and_files_leave_in_order(tmp_path):
    pipe, after = tmp_path / "trace.json", tmp_path / "later.json"
    os.mkfifo(pipe)
    traces = TraceFile()
    started = time.monotonic()
    traces.add(str(pipe), 0, tree("first", 1))
    traces.add(str(after), 0, tree("second", 2))   # another file: the pipe's traces are flushed
    traces.flush()
    assert time.monotonic() - started < 1.0   # the caller goes on while the writer waits for a reader
    assert not traces.wait(0.2) and not after.exists()   # the second file waits for the first
    first = json.loads(pipe.read_bytes())
    assert traces.wait(10)
    assert [r["model_name"] for r in first if "model_name" in r] == ["first"]
    assert [r["model_name"] for r in json.loads(after.read_bytes()) if "model_name" in r] == ["second"]


def test_the_broker_stops_without_waiting_for_ever_on_a_trace_file(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracing, "CLOSE_TIMEOUT_S", 0.2)
    pipe = tmp_path / "trace.json"
    os.mkfifo(pipe)
    broker = BrokerTracing()
    broker.file.add(str(pipe), 0, tree("m", 1))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        broker.close()
    assert 0.2 <= time.monotonic() - started < 2.0
    assert "the trace file is still being written after 0 s; stopping without it" in caplog.text
    assert [r["id"] for r in json.loads(pipe.read_bytes())] == [1, 1, 1, 1]   # a late reader still gets it


def test_files_beyond_what_a_stuck_writer_holds_are_dropped_with_an_error(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton_file, "MAX_UNWRITTEN", 2)
    pipe = tmp_path / "trace.json.0"   # the first of the numbered files: a pipe nobody reads yet
    os.mkfifo(pipe)
    traces = TraceFile()
    with caplog.at_level(logging.ERROR):
        for number in range(4):   # a file per trace: the first waits on the pipe, the second behind it
            traces.add(str(tmp_path / "trace.json"), 1, tree(f"m{number}", number))
    assert caplog.text.count("the trace file writer is 2 files behind") == 2
    assert [r["model_name"] for r in json.loads(pipe.read_bytes()) if "model_name" in r] == ["m0"]
    assert traces.wait(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]   # .2 and .3 dropped
    second = json.loads((tmp_path / "trace.json.1").read_bytes())
    assert [r["model_name"] for r in second if "model_name" in r] == ["m1"], "the dropped files' traces with them"


def _step(model: str, inputs: list, outputs: list) -> dict:
    return {"m": model, "v": 1, "ts": [["REQUEST_START", 10], ["QUEUE_START", 11], ["COMPUTE_START", 12],
                                      ["REQUEST_END", 20]], "inputs": inputs, "outputs": outputs}


def _fp32(*values: float) -> bytes:
    return np.array(values, np.float32).tobytes()


def test_a_steps_raw_tensors_are_formatted_by_the_writer_the_outputs_right_after_the_inputs(tmp_path):
    traces = TraceFile()
    root = dict(tree("e", 1), steps=[_step("s", [["X", "FP32", [1, 2], _fp32(1, 2)]],
                                           [["Y", "FP32", [1, 2], _fp32(2, 4)]])])
    traces.add(str(tmp_path / "trace.json"), 0, root)
    traces.flush()
    assert traces.wait(10)
    records = json.loads((tmp_path / "trace.json").read_bytes())
    step = [r.get("activity") or r.get("timestamps", [{}])[0].get("name") or "model" for r in records if r["id"] == 2]
    assert step == ["model", "REQUEST_START", "QUEUE_START", "TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT",
                    "COMPUTE_START", "REQUEST_END"]
    assert [r["tensor"] for r in records if "tensor" in r] == [
        {"name": "X", "data": "1,2", "shape": "1,2", "dtype": "FP32"},
        {"name": "Y", "data": "2,4", "shape": "1,2", "dtype": "FP32"}]


def test_with_tensors_alone_the_steps_tensors_come_first_and_one_that_cannot_be_written_costs_only_its_own(
        tmp_path, caplog):
    traces = TraceFile()
    root = dict(tree("e", 1), stamps=False, inputs=[{"name": "IN", "data": "1", "shape": "1", "dtype": "FP32"}],
                steps=[_step("bad", [["X", "FP32", [1, 2], b"\x00"]], []),   # not a whole FP32
                       _step("s", [["X", "FP32", [1], _fp32(3)]], [])])
    with caplog.at_level(logging.ERROR):
        traces.add(str(tmp_path / "trace.json"), 0, root)
        traces.flush()
        assert traces.wait(10)
    records = json.loads((tmp_path / "trace.json").read_bytes())
    assert [(r["id"], r["tensor"]["name"]) for r in records] == [(3, "X"), (1, "IN")]
    assert "model 'bad' are not written" in caplog.text


def test_a_malformed_trace_costs_only_itself_and_the_writer_goes_on(tmp_path, caplog):
    traces = TraceFile()
    path = str(tmp_path / "trace.json")
    with caplog.at_level(logging.ERROR):
        traces.add(path, 0, {"v": 1, "ts": []})   # no model: a peer's bug
        traces.add(path, 0, tree("m", 1))
        traces.flush()
        assert traces.wait(10)
    assert [r.get("model_name") for r in json.loads((tmp_path / "trace.json").read_bytes()) if "model_name" in r] \
        == ["m"]
    assert "could not be written" in caplog.text
