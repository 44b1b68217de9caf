"""The instance process against a scripted broker.

The instance runs as the agent starts it (``python -m tritium.workers.instance <iid>``, its
spec on stdin) and connects to a ROUTER the test binds on ``ipc://``; the test plays
the broker: it sends BATCH messages carrying INFER records as a gateway made them and
reads the BATCH_DONE and RESPONSE records back, so that order, errors and the
instance's life (HELLO, heartbeats, RESET, SIGTERM) are asserted on the wire.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tritium.repo.json_form import config_to_json_dict
from tests.repo.helpers import load, write_model
from tests.scripted_peers import ScriptedBroker, at_least, eventually, ipc_address
from tritium.errors import ErrorCode
from tritium.exit_codes import ExitCode
from tritium.protocol import PROTOCOL_VERSION, Batch, CancelRunning, Heartbeat, Infer, Kind, LogSettings, Reset, decode

HEARTBEAT_S = 0.1
AGENT = "agent-test"
CONFIG = """
    name: "scaler"
    backend: "python"
    max_batch_size: 8
    input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
    output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
MODEL = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                if (x < 0).any():
                    raise ValueError("negative input")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
            return responses
"""
_batches = itertools.count(1)
_rids = itertools.count(100)
_iids = itertools.count()
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class Instance:
    """One instance process of model ``scaler`` and the scripted broker it joined."""

    def __init__(self, root: Path, config: str = CONFIG, model: str = MODEL) -> None:
        model_dir = write_model(root / "repo", "scaler", config, {"1/model.py": model})
        self.address, self.folder = ipc_address("backend")
        self.broker = ScriptedBroker(self.address)
        self.iid = f"{AGENT}/scaler/1/5/scaler_0/{next(_iids)}"
        spec = {"broker": self.address, "agent": AGENT, "iid": self.iid, "model": "scaler", "version": 1,
                "epoch": 5, "boot": 3, "model_dir": str(model_dir), "name": "scaler_0", "key": "scaler_0",
                "kind": "CPU", "device_id": 0, "credit": 2, "heartbeat_interval_s": HEARTBEAT_S,
                "config": config_to_json_dict(load(root / "repo", "scaler").portable_config)}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen([sys.executable, "-m", "tritium.workers.instance", self.iid], stdin=subprocess.PIPE,
                                        env=env)
        self.process.stdin.write(json.dumps(spec).encode())
        self.process.stdin.close()
        self.peer = self.iid.encode()

    def until(self, condition, what: str = "it", timeout_s: float = 10.0):
        return eventually(condition, self._step, timeout_s, what)

    def _step(self) -> None:
        self.broker.pump()
        if self.process.poll() is not None:
            pytest.fail(f"the instance exited with status {self.process.returncode}")

    def hellos(self, count: int = 1) -> list[dict]:
        return self.until(lambda: at_least(count, self.broker.of(Kind.HELLO, self.peer)), f"{count} HELLO")

    def execute(self, *infers: bytes) -> tuple[dict, list]:
        """Send one BATCH of these INFER records; (its BATCH_DONE header, the RESPONSE records after it)."""
        batch = next(_batches)
        self.broker.send(self.peer, Batch(batch, len(infers)).encode(), *infers)
        received = self.until(lambda: [i for i, r in enumerate(self.broker.received)
                                       if r.kind == Kind.BATCH_DONE and r.header["b"] == batch], f"batch {batch} done")
        start = received[0]
        done = self.broker.received[start]
        return done.header, self.broker.received[start + 1:start + 1 + len(infers)]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.broker.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    instance = Instance(tmp_path_factory.mktemp("instance"))
    instance.hellos()
    yield instance
    instance.close()


@pytest.fixture
def two_instances(tmp_path):
    instances = [Instance(tmp_path / "one"), Instance(tmp_path / "two")]   # they start side by side
    yield instances
    for instance in instances:
        instance.close()


def infer(values: list[float], shape: list[int] | None = None) -> tuple[int, bytes]:
    """(rid, an INFER record of X = values as a gateway makes it)."""
    rid = next(_rids)
    data = np.asarray(values, np.float32).tobytes()
    request = Infer(rid, "scaler", [["X", "FP32", shape or [1, len(values)], len(data), False]], version=1,
                    batch_size=1)
    return rid, request.encode([data])


def y_of(record) -> list[float]:
    header, view, offset = decode(record.record)
    assert header["outputs"] == [["Y", "FP32", [1, 4], 16, False]], header
    return np.frombuffer(view[offset:offset + 16], np.float32).tolist()


def test_it_says_hello_with_its_load_and_credit_then_heartbeats_on_a_socket_of_its_own(instance):
    (hello,) = instance.hellos()
    assert hello == {"k": Kind.HELLO, "role": "instance", "pv": PROTOCOL_VERSION, "agent": AGENT, "credit": 2,
                     "m": "scaler", "v": 1, "e": 5, "name": "scaler_0", "boot": 3, "kind": "CPU", "hb": HEARTBEAT_S,
                     "dev": 0, "group": 0}
    beats = instance.until(lambda: at_least(2, instance.broker.of(Kind.HEARTBEAT, f"{instance.iid}/hb".encode())),
                           "two heartbeats")
    assert {key: value for key, value in beats[0].items() if key != "pl"} == \
        {"k": Kind.HEARTBEAT, "iid": instance.iid, "agent": AGENT, "joined": True, "hb": HEARTBEAT_S}
    assert beats[1]["pl"] == [["answer", 256 << 20, 0, 0, 0]]   # its pool for large outputs, nothing held in it


def test_a_batch_is_answered_by_batch_done_then_one_response_per_request_in_request_order(instance):
    requests = [infer([i, i + 1, i + 2, i + 3]) for i in (1, 10, 20)]
    done, responses = instance.execute(*(record for _, record in requests))
    assert (done["ok"], done["rx"], len(done["t"])) == ([True] * 3, [0] * 3, 3)
    assert all(isinstance(t, int) and t >= 0 for t in done["t"])
    assert [r.header["rid"] for r in responses] == [rid for rid, _ in requests]
    assert [y_of(r) for r in responses] == [[2.0 * (i + k) for k in range(4)] for i in (1, 10, 20)]


def test_a_model_that_raises_fails_its_execution_with_tritons_message_naming_the_instance_and_serves_on(instance):
    requests = [infer([1, 1, 1, 1]), infer([-1, 0, 0, 0])]
    done, responses = instance.execute(*(record for _, record in requests))
    assert done["ok"] == [False, False]
    assert [(r.header["rid"], r.header["err"]["code"]) for r in responses] == [
        (rid, ErrorCode.INTERNAL) for rid, _ in requests]
    for response in responses:   # Triton's words, naming the instance, then where the model raised
        message = response.header["err"]["message"]
        assert message.startswith("Failed to process the request(s) for model 'scaler_0', "
                                  "message: ValueError: negative input\n\nAt:\n"), message
        assert "model.py(10): execute" in message
    rid, record = infer([3, 3, 3, 3])
    done, (response,) = instance.execute(record)
    assert done["ok"] == [True] and response.header["rid"] == rid and y_of(response) == [6.0] * 4


def test_a_malformed_request_fails_alone_and_the_rest_of_its_batch_is_served(instance):
    good, bad, also_good = infer([1, 2, 3, 4]), infer([1, 2, 3, 4], shape=[1, 2]), infer([4, 3, 2, 1])
    done, responses = instance.execute(good[1], bad[1], also_good[1])
    assert done["ok"] == [True, False, True]
    assert [r.header["rid"] for r in responses] == [good[0], bad[0], also_good[0]]
    assert y_of(responses[0]) == [2.0, 4.0, 6.0, 8.0] and y_of(responses[2]) == [8.0, 6.0, 4.0, 2.0]
    error = responses[1].header["err"]
    assert error["code"] == ErrorCode.INVALID_ARG and "'X'" in error["message"]


def test_a_reset_from_a_new_broker_that_keeps_it_makes_it_say_hello_as_that_load_and_serve_on(instance):
    before = len(instance.broker.of(Kind.HELLO, instance.peer))
    instance.broker.tell(instance.peer, Reset(8, 42))
    hello = instance.hellos(before + 1)[-1]
    assert (hello["boot"], hello["e"], hello["name"], hello["m"]) == (8, 42, "scaler_0", "scaler")
    rid, record = infer([5, 5, 5, 5])
    done, (response,) = instance.execute(record)
    assert done["ok"] == [True] and y_of(response) == [10.0] * 4


def test_a_reset_that_does_not_keep_it_exits_for_its_agent_to_restart_it_and_sigterm_stops_it_cleanly(
        two_instances):
    reset, terminated = two_instances
    reset.hellos()
    terminated.hellos()
    reset.broker.tell(reset.peer, Reset())
    terminated.process.send_signal(signal.SIGTERM)
    assert reset.process.wait(10) == ExitCode.ERROR
    assert terminated.process.wait(10) == ExitCode.OK


DECOUPLED_CONFIG = CONFIG + """
    model_transaction_policy { decoupled: true }
"""
LATE_ANSWER_MODEL = """
    import threading
    import time

    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            def answer_later(sender, x):
                time.sleep(0.2)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                threading.Thread(target=answer_later, args=(request.get_response_sender(), x)).start()
            return None
"""


def test_an_answer_from_a_model_s_own_thread_leaves_while_the_broker_keeps_the_socket_busy(tmp_path):
    instance = Instance(tmp_path, DECOUPLED_CONFIG, LATE_ANSWER_MODEL)
    try:
        instance.hellos()
        rid, record = infer([1.0, 2.0, 3.0, 4.0])
        instance.broker.send(instance.peer, Batch(next(_batches), 1).encode(), record)
        started = time.monotonic()
        flood = LogSettings({}).encode()
        while time.monotonic() - started < 5 and not instance.broker.of(Kind.RESPONSE_PART, instance.peer):
            for _ in range(50):   # messages keep arriving faster than the instance reads them
                instance.broker.send(instance.peer, flood)
            instance._step()
        answered_after = time.monotonic() - started
    finally:
        instance.close()
    assert instance.broker.of(Kind.RESPONSE_PART, instance.peer), "the model's answer never left"
    assert answered_after < 2.5, f"the answer waited {answered_after:.1f} s behind the broker's messages"


POLLING_MODEL = """
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            deadline = time.monotonic() + 5
            while not requests[0].is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.005)
            seen = np.full((1, 4), float(requests[0].is_cancelled()), np.float32)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", seen)]) for _ in requests]
"""


def test_a_cancel_on_the_heartbeat_socket_reaches_a_request_inside_its_execute(tmp_path):
    """The main thread is in execute; the heartbeat thread reads CANCEL_RUNNING and marks the request."""
    instance = Instance(tmp_path, CONFIG, POLLING_MODEL)
    try:
        instance.hellos()
        beats = f"{instance.iid}/hb".encode()
        instance.until(lambda: instance.broker.of(Kind.HEARTBEAT, beats), "a heartbeat")
        batch = next(_batches)
        _, record = infer([1.0, 2.0, 3.0, 4.0])
        started = time.monotonic()
        instance.broker.send(instance.peer, Batch(batch, 1).encode(), record)
        time.sleep(0.2)   # execute is running
        instance.broker.send(beats, CancelRunning(batch, 0).encode())
        done = instance.until(lambda: [r for r in instance.broker.received if r.kind == Kind.RESPONSE], "its answer")
        took = time.monotonic() - started
    finally:
        instance.close()
    assert y_of(done[0]) == [1.0] * 4   # the model saw is_cancelled() turn True
    assert took < 3, f"execute ran {took:.1f} s: it did not see the cancel"


WAIT_FOR_CANCEL_MODEL = """
    import time

    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                deadline = time.monotonic() + 5
                while (x < 0).any() and not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.005)   # a negative input holds the instance until its client leaves
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
            return responses
"""


def test_a_request_cancelled_while_its_batch_waits_behind_another_is_answered_cancelled_unrun(tmp_path):
    """The instance holds a second batch while the first runs (its credit of 2); the broker tells
    both sockets that a request of the waiting batch was cancelled, as it does for any request it
    sent: that request is answered CANCELLED and its model never runs it, the other runs."""
    instance = Instance(tmp_path, CONFIG.replace("max_batch_size: 8", "max_batch_size: 0"), WAIT_FOR_CANCEL_MODEL)
    try:
        instance.hellos()
        beats = f"{instance.iid}/hb".encode()
        instance.until(lambda: instance.broker.of(Kind.HEARTBEAT, beats), "a heartbeat")
        running, waiting = next(_batches), next(_batches)
        instance.broker.send(instance.peer, Batch(running, 1).encode(), infer([-1.0, 0.0, 0.0, 0.0], [4])[1])
        time.sleep(0.2)   # the first batch is in execute
        kept, dropped = infer([1.0, 2.0, 3.0, 4.0], [4]), infer([-1.0, -1.0, -1.0, -1.0], [4])
        instance.broker.send(instance.peer, Batch(waiting, 2).encode(), kept[1], dropped[1])
        cancel = CancelRunning(waiting, 1).encode()
        instance.broker.send(beats, cancel)
        instance.broker.send(instance.peer, cancel)
        time.sleep(0.2)
        instance.broker.send(beats, CancelRunning(running, 0).encode())   # the first batch ends
        done = instance.until(lambda: [r for r in instance.broker.received
                                       if r.kind == Kind.BATCH_DONE and r.header["b"] == waiting], "the second batch")
        start = instance.broker.received.index(done[0])
        answers = instance.broker.received[start + 1:start + 3]
    finally:
        instance.close()
    assert done[0].header["ok"] == [True, False]
    assert [a.header["rid"] for a in answers] == [kept[0], dropped[0]]
    assert answers[1].header["err"] == {"code": ErrorCode.CANCELLED, "message": "the client cancelled the request"}
    header, view, offset = decode(answers[0].record)
    assert np.frombuffer(view[offset:offset + 16], np.float32).tolist() == [2.0, 4.0, 6.0, 8.0]


BLS_CALLER_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X")
                big = pb_utils.Tensor("BIG", np.ones(1 << 16, np.float32))   # 256 KiB: in the BLS pool
                called = pb_utils.InferenceRequest(model_name="doubler", inputs=[x, big],
                                                   requested_output_names=["Y"]).exec()
                responses.append(pb_utils.InferenceResponse(error=called.error()) if called.has_error() else
                                 pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy())]))
            return responses
"""


def test_a_bls_call_the_previous_broker_process_held_fails_and_the_instance_rejoins_once(tmp_path):
    """The model waits in execute on a BLS call no process will answer (its broker was
    restarted); after the new broker's RESET on the heartbeat socket, the BLS socket asks the new
    process which calls it got, and its answer (none) answers the call with an error, the batch is
    answered, and the RESETs that queued on the data socket meanwhile make it join again
    once: every one is answered with a HELLO, but its pool for large outputs is made anew once.
    The call's 256 KiB input is freed from the BLS pool, which the heartbeats report."""
    instance = Instance(tmp_path, CONFIG, BLS_CALLER_MODEL)
    try:
        instance.hellos()
        beats = f"{instance.iid}/hb".encode()
        instance.until(lambda: instance.broker.of(Kind.HEARTBEAT, beats), "a heartbeat")
        _, record = infer([1.0, 2.0, 3.0, 4.0])
        instance.broker.send(instance.peer, Batch(next(_batches), 1).encode(), record)
        calls = instance.until(lambda: instance.broker.of(Kind.INFER, f"{instance.iid}/bls".encode()), "its BLS call")
        assert calls[0]["m"] == "doubler"
        hellos = len(instance.broker.of(Kind.HELLO, instance.peer))
        for _ in range(3):   # as the new broker says it, each heartbeat, while the instance is silent
            instance.broker.send(instance.peer, Reset(8, 42).encode())
        instance.broker.send(beats, Reset(8, 42).encode())
        bls = f"{instance.iid}/bls".encode()
        (asked,) = instance.until(lambda: [beat for beat in instance.broker.of(Kind.HEARTBEAT, bls)],
                                  "the BLS socket asking the new process what it got")
        assert asked["nr"] == calls[0]["rid"] + 1
        instance.broker.send(bls, Heartbeat(8, since=asked["nr"]).encode())   # it got none of them
        (response,) = instance.until(lambda: instance.broker.of(Kind.RESPONSE, instance.peer), "the batch's answer")
        instance.hellos(hellos + 3)
        instance.until(lambda: [beat for beat in instance.broker.of(Kind.HEARTBEAT, beats)
                                if len(beat["pl"]) == 2 and beat["pl"][0][4]], "both pools reported after the RESET")
        time.sleep(3 * HEARTBEAT_S)   # and a few more reports: the RESETs were all read
        instance._step()
        pools = instance.broker.of(Kind.HEARTBEAT, beats)[-1]["pl"]
    finally:
        instance.close()
    assert response["err"]["message"] == f"the broker at {instance.address} restarted; the BLS request to model " \
                                         "'doubler' was lost"
    assert pools == [["answer", 256 << 20, 0, 0, 1], ["bls", 64 << 20, 0, 0, 0]]
