"""The host agent, in-process, against a scripted broker, with real instance processes.

The test binds a ROUTER on ``ipc://`` where the broker would be, drives the agent turn
by turn (``HostAgent.turn``) and plays the broker's side of the protocol by hand:
assignments, heartbeats, silence, a restart, RESET, the drain. The instances the agent
starts are real processes of a tiny Python model; they say HELLO to the same socket,
which is how the test sees them come up.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time

import msgspec
import pytest

from tritium.repo.json_form import config_to_json_dict
from tests.repo.helpers import load, write_model
from tests.scripted_peers import ScriptedBroker, at_least, eventually, ipc_address
from tritium.exit_codes import ExitCode
from tritium.hosts import host_name
from tritium.protocol import (
    PROTOCOL_VERSION,
    Assign,
    Assignment,
    Batch,
    Drained,
    Infer,
    Kind,
    LoadRef,
    Refused,
    Reset,
    Scale,
    Unassign,
)
from tritium.workers.agent import HostAgent, WorkerSettings, _stopped

HEARTBEAT_S = 0.1
METRICS_S = 0.2
ECHO_MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                    for r in requests]
"""
STUCK_MODEL = """
    import time
    from pathlib import Path

    class TritonPythonModel:
        def execute(self, requests):
            Path(__file__).with_name("executing").touch()
            time.sleep(60)   # deaf to SIGTERM meanwhile: the handler only notes it
"""
BROKEN_MODEL = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("no weights here")
"""
UNIMPORTABLE_MODEL = """
    import module_that_is_not_installed
"""
CLASSLESS_MODEL = """
    x = 1
"""
EXITING_MODEL = """
    import sys

    class TritonPythonModel:
        def initialize(self, args):
            sys.exit(3)   # not an Exception: Triton's stub reports it all the same
"""
# Exits with the status of an init failure once serving: only the instance's own word, not its exit
# status, keeps the agent from starting it again.
EXITS_IN_EXECUTE_MODEL = """
    import os

    class TritonPythonModel:
        def execute(self, requests):
            os._exit(3)
"""


def config(name: str, instances: int = 1) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]
    """


_epochs = itertools.count(10)


class Host:
    """The agent under test, the scripted broker it talks to, and the model repository."""

    def __init__(self, root, exit_timeout_s: float = 5.0) -> None:
        self.repo = root / "repo"
        for name, instances, model in (("echo", 1, ECHO_MODEL), ("pair", 2, ECHO_MODEL), ("broken", 1, BROKEN_MODEL),
                                       ("exits", 1, EXITING_MODEL), ("unimportable", 1, UNIMPORTABLE_MODEL),
                                       ("stuck", 1, STUCK_MODEL), ("exits_later", 1, EXITS_IN_EXECUTE_MODEL),
                                       ("classless", 1, CLASSLESS_MODEL)):
            write_model(self.repo, name, config(name, instances), {"1/model.py": model})
        write_model(self.repo, "all_passive", config("all_passive").replace("count: 1", "count: 2, passive: true"),
                    {"1/model.py": ECHO_MODEL})
        # Triton's stub imports a default_model_filename as "<version>.<name>" too
        write_model(self.repo, "unimportable_named", config("unimportable_named") + 'default_model_filename: "net.py"',
                    {"1/net.py": UNIMPORTABLE_MODEL})
        # ... and refuses one whose name does not end with .py, even beside a model.py
        write_model(self.repo, "not_python", config("not_python") + 'default_model_filename: "model.txt"',
                    {"1/model.txt": ECHO_MODEL, "1/model.py": ECHO_MODEL})
        self.address, self.folder = ipc_address("broker")
        self.broker = ScriptedBroker(self.address)
        self.agent = HostAgent(WorkerSettings(
            broker=self.address, model_repositories=(str(self.repo),), gpus=(), exit_timeout_s=exit_timeout_s,
            metrics_interval_s=METRICS_S, heartbeat_interval_s=HEARTBEAT_S, max_cpu_instances=3))
        self.peer = self.agent.identity.encode()

    def step(self) -> None:
        self.agent.turn(10)
        self.broker.pump()

    def until(self, condition, timeout_s: float = 10.0, what: str = "it"):
        return eventually(condition, self.step, timeout_s, what)

    def joined(self, boot: int = 1) -> dict:
        """Start the agent, answer its HELLO with this broker's heartbeat; the HELLO."""
        self.agent.start()
        hello = self.until(lambda: self.broker.of(Kind.HELLO, self.peer), what="the agent's HELLO")[-1]
        self.beat(boot)
        return hello

    def beat(self, boot: int) -> None:
        """The broker's heartbeat: who it is (``boot``) and how often it beats."""
        self.broker.keep_beating(self.peer, boot, HEARTBEAT_S)
        self.until(lambda: self.agent.broker_boot == boot, what="the heartbeat read")

    def assignment(self, model: str, identity: str = "") -> Assignment:
        """What the broker sends for a load of ``model`` version 1 (its portable config)."""
        definition = load(self.repo, model)
        return Assignment(model, 1, next(_epochs), config_to_json_dict(definition.portable_config),
                          identity=identity or None)

    def placed(self, epoch: int) -> dict:
        return self.until(lambda: [p for p in self.broker.of(Kind.PLACED) if p["e"] == epoch],
                          what=f"PLACED for load {epoch}")[-1]

    def instance_hellos(self, epoch: int, count: int) -> list[tuple[bytes, dict]]:
        """(identity, HELLO) of ``count`` instance processes of load ``epoch``, once they all said it."""
        return self.until(lambda: at_least(count, [
            (r.peer, r.header) for r in self.broker.received
            if r.kind == Kind.HELLO and r.header.get("role") == "instance" and r.header["e"] == epoch]),
            what=f"{count} instance(s) of load {epoch} saying HELLO")

    def exits(self, epoch: int, count: int) -> list[dict]:
        return self.until(lambda: at_least(count, [x for x in self.broker.of(Kind.INSTANCE_EXITED) if x["e"] == epoch]),
                          what=f"{count} INSTANCE_EXITED of load {epoch}")

    def pids(self) -> dict[str, int]:
        return {c.plan.key: c.process.pid for c in self.agent.children if c.process is not None}

    def restart_broker(self) -> None:
        """A new broker process on the same address: a new socket that knows no peer."""
        self.broker.close()
        self.broker = ScriptedBroker(self.address)

    def close(self) -> None:
        for child in self.agent.children:   # the agent closes gently; a failed test must not wait on it
            if child.process is not None:
                child.process.kill()
        self.agent.close()
        self.broker.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def host(tmp_path):
    host = Host(tmp_path)
    yield host
    host.close()


@pytest.fixture
def impatient_host(tmp_path):
    """A host whose instances and broker get half a second to stop or confirm (exit_timeout_s)."""
    host = Host(tmp_path, exit_timeout_s=0.5)
    yield host
    host.close()


def test_hello_names_the_host_then_heartbeats_and_host_metrics_follow_at_their_intervals(host):
    hello = host.joined()
    assert hello == {"k": Kind.HELLO, "role": "agent", "pv": PROTOCOL_VERSION, "host": host_name(), "gpus": [],
                     "models": [], "cpu_slots": 3, "hb": HEARTBEAT_S, "running": []}
    started = time.monotonic()
    host.until(lambda: time.monotonic() - started > 6 * METRICS_S)
    seen = [r for r in host.broker.received if r.at >= started]
    beats = [r for r in seen if r.kind == Kind.HEARTBEAT]
    metrics = [r for r in seen if r.kind == Kind.HOST_METRICS]
    assert beats[0].header == {"k": Kind.HEARTBEAT, "role": "agent", "hb": HEARTBEAT_S, "wk": []}   # no instance yet
    assert 6 * METRICS_S / HEARTBEAT_S * 0.6 <= len(beats) <= 6 * METRICS_S / HEARTBEAT_S + 2
    assert 4 <= len(metrics) <= 7
    assert all(b.at - a.at >= METRICS_S * 0.9 for a, b in itertools.pairwise(metrics))   # never faster
    sample = metrics[-1].header
    assert sample["host"] == host_name() and 0.0 <= sample["cpu_utilization"] <= 1.0
    assert 0 < sample["memory_used"] <= sample["memory_total"] and sample["gpus"] == []


def test_assign_starts_each_instance_of_the_groups_answers_placed_and_unassign_stops_them(host):
    host.joined(boot=7)
    assignment = host.assignment("pair", identity="load-a")
    host.broker.tell(host.peer, Assign((assignment,)))
    placed = host.placed(assignment.epoch)
    assert placed == {"k": Kind.PLACED, "m": "pair", "v": 1, "e": assignment.epoch, "boot": 7,
                      "instances": ["pair_0_0", "pair_0_1"], "adopted": {}}
    hellos = host.instance_hellos(assignment.epoch, 2)
    assert sorted(h["name"] for _, h in hellos) == ["pair_0_0", "pair_0_1"]
    for identity, hello in hellos:
        assert (hello["m"], hello["v"], hello["boot"], hello["agent"], hello["pv"]) == ("pair", 1, 7, host.agent.identity,
                                                                                         PROTOCOL_VERSION)
        assert identity.decode().startswith(f"{host.agent.identity}/pair/1/{assignment.epoch}/{hello['name']}/")
    pids = host.pids()
    assert set(pids) == {"pair_0_0", "pair_0_1"}

    host.broker.tell(host.peer, Assign((assignment,)))   # the broker says it again
    host.until(lambda: len(host.broker.of(Kind.HEARTBEAT, host.peer)) > 3)
    assert len(host.broker.of(Kind.PLACED)) == 1 and host.pids() == pids   # nothing more is started

    host.broker.tell(host.peer, Unassign((LoadRef("pair", 1, assignment.epoch),)))
    exits = host.exits(assignment.epoch, 2)
    assert sorted(e["name"] for e in exits) == ["pair_0_0", "pair_0_1"]
    assert {(e["code"], e["why"], e["stopped"], e["boot"]) for e in exits} == {(0, "exited with status 0", True, 7)}
    assert {e["iid"] for e in exits} == {identity.decode() for identity, _ in hellos}
    assert host.agent.children == []
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_update_keeps_the_instances_the_new_groups_match_and_stops_only_those_named(host):
    host.joined(boot=7)
    assignment = host.assignment("pair", identity="load-a")
    host.broker.tell(host.peer, Assign((assignment,)))
    host.instance_hellos(assignment.epoch, 2)
    pids = host.pids()
    # New groups: the first group renamed and down to one instance, a second group of two with
    # other settings (a rate limiter), so matching no running instance.
    config = dict(assignment.config, instance_group=[
        {"name": "renamed", "count": 1, "kind": "KIND_CPU"},
        {"name": "pair_0", "count": 2, "kind": "KIND_CPU", "rate_limiter": {"priority": 2}}])
    update = msgspec.structs.replace(assignment, config=config, identity="load-b", update=True)
    host.broker.tell(host.peer, Assign((update,)))
    host.until(lambda: len(host.broker.of(Kind.PLACED)) == 2, what="the update's PLACED")
    placed = host.broker.of(Kind.PLACED)[-1]
    # The lowest-keyed running instance stays as it is, keeping its name; the new group's first
    # instance would take the name the leaving one still holds, so it gets another key.
    assert placed == {"k": Kind.PLACED, "m": "pair", "v": 1, "e": assignment.epoch, "boot": 7, "update": True,
                      "instances": ["pair_0_0", "pair_0_0~2", "pair_0_1~2"], "kept": ["pair_0_0"],
                      "leaving": ["pair_0_1"]}
    hellos = host.instance_hellos(assignment.epoch, 4)
    assert sorted(h["name"] for _, h in hellos[2:]) == ["pair_0_0~2", "pair_0_1~2"]
    assert {h["group"] for _, h in hellos[2:]} == {1}
    assert host.pids()["pair_0_0"] == pids["pair_0_0"] and host.pids()["pair_0_1"] == pids["pair_0_1"]
    kept = next(c for c in host.agent.children if c.plan.key == "pair_0_0")
    assert (kept.identity, kept.spec["config"]["instance_group"][0]["name"]) == ("load-b", "renamed")

    host.broker.tell(host.peer, Unassign((LoadRef("pair", 1, assignment.epoch, instances=("pair_0_1",)),)))
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["name"], exited["stopped"]) == ("pair_0_1", True)
    assert sorted(c.plan.key for c in host.agent.children) == ["pair_0_0", "pair_0_0~2", "pair_0_1~2"]


def test_a_killed_instance_is_reported_with_its_signal_and_started_again(host):
    host.joined()
    assignment = host.assignment("echo")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((first, _),) = host.instance_hellos(assignment.epoch, 1)
    os.kill(host.pids()["echo_0_0"], signal.SIGKILL)
    (exited,) = host.exits(assignment.epoch, 1)
    assert exited == {"k": Kind.INSTANCE_EXITED, "iid": first.decode(), "why": "was killed by signal 9", "code": -9,
                      "e": assignment.epoch, "name": "echo_0_0", "stopped": False, "boot": 1}
    hellos = host.instance_hellos(assignment.epoch, 2)   # after the first backoff (1 s)
    second = hellos[-1][0].decode()
    assert second != first.decode() and second.rsplit("/", 1)[0] == first.decode().rsplit("/", 1)[0]
    assert hellos[-1][1]["name"] == "echo_0_0"


@pytest.mark.parametrize("model, why", [("broken", "Internal: RuntimeError: no weights here\n\nAt:\n"),
                                       ("exits", "Internal: SystemExit: 3\n\nAt:\n"),
                                       # Triton's stub shows the import machinery's frames too
                                       ("unimportable", "Internal: ModuleNotFoundError: No module named "
                                                        "'module_that_is_not_installed'\n\nAt:\n"),
                                       ("unimportable_named", "Internal: ModuleNotFoundError: No module named "
                                                              "'module_that_is_not_installed'\n\nAt:\n"),
                                       ("classless", "Internal: AttributeError: module '1.model' has no attribute "
                                                     "'TritonPythonModel'"),
                                       ("not_python", "Internal: Model name must end with '.py'. Model name is "
                                                      '"model.txt".')])
def test_an_instance_that_fails_to_initialize_says_why_exits_init_failed_and_is_not_restarted(host, model, why):
    host.joined()
    assignment = host.assignment(model)
    host.broker.tell(host.peer, Assign((assignment,)))
    assert host.placed(assignment.epoch)["instances"] == [f"{model}_0_0"]
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["code"], exited["stopped"], exited["final"]) == (ExitCode.INIT_FAILED, False, True)
    (failed,) = host.broker.of(Kind.INSTANCE_FAILED)
    assert (failed["m"], failed["name"]) == (model, f"{model}_0_0")
    assert failed["err"]["message"].startswith(why)
    assert "python_backend.py" not in failed["err"]["message"] and "import_module" not in failed["err"]["message"]
    if model.startswith("unimportable"):   # the import machinery's frames, as Triton's stub shows them
        assert "_find_and_load" in failed["err"]["message"]
    assert host.agent.children == []


def test_an_instance_the_broker_refuses_exits_and_is_not_restarted(host):
    host.joined()
    assignment = host.assignment("echo")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((iid, _),) = host.instance_hellos(assignment.epoch, 1)
    host.broker.tell(iid, Refused('Invalid argument: Resource count for "R" is limited to 0 ...'))
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["code"], exited["stopped"], exited["final"]) == (ExitCode.PROTOCOL_MISMATCH, False, True)
    assert host.agent.children == []


def test_an_instance_whose_model_ends_the_process_with_any_status_is_started_again(host):
    host.joined()
    assignment = host.assignment("exits_later")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((first, _),) = host.instance_hellos(assignment.epoch, 1)
    host.broker.send(first, Batch(1, 1).encode(),
                     Infer(1, "exits_later", [["X", "FP32", [1, 2], 8, False]], version=1, batch_size=1).encode([bytes(8)]))
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["code"], exited["stopped"], exited.get("final")) == (ExitCode.INIT_FAILED, False, None)
    hellos = host.instance_hellos(assignment.epoch, 2)   # after the first backoff (1 s)
    assert hellos[-1][0] != first and hellos[-1][1]["name"] == "exits_later_0_0"


def test_an_assignment_it_cannot_place_is_answered_with_the_reason(host):
    host.joined()
    assignment = msgspec.structs.replace(host.assignment("echo"), model="absent")
    host.broker.tell(host.peer, Assign((assignment,)))
    placed = host.placed(assignment.epoch)
    assert placed["err"]["message"] == f"model 'absent' is not in this host's model repositories ({host.repo})"
    assert "instances" not in placed and host.agent.children == []


def test_a_model_of_passive_instances_only_cannot_be_placed(host):
    """Nothing would ever serve it (Triton loads it, and crashes on its first request)."""
    host.joined()
    assignment = host.assignment("all_passive")
    host.broker.tell(host.peer, Assign((assignment,)))
    placed = host.placed(assignment.epoch)
    assert placed["err"]["message"] == "model 'all_passive' has no instance to start on this host"
    assert host.agent.children == []


def test_an_instance_deaf_to_sigterm_is_killed_once_the_exit_timeout_passes(impatient_host):
    host = impatient_host
    host.joined()
    assignment = host.assignment("stuck")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((iid, _),) = host.instance_hellos(assignment.epoch, 1)
    host.broker.send(iid, Batch(1, 1).encode(),   # it is stuck in the model from now on
                     Infer(1, "stuck", [["X", "FP32", [1, 2], 8, False]], version=1, batch_size=1).encode([bytes(8)]))
    host.until(lambda: (host.repo / "stuck" / "1" / "executing").exists(), what="the batch in the model")
    host.broker.tell(host.peer, Unassign((LoadRef("stuck", 1, assignment.epoch),)))
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["code"], exited["stopped"]) == (-signal.SIGKILL, True)
    assert host.agent.children == []


def test_scale_starts_the_count_asked_and_stops_the_instance_named(host):
    host.joined()
    assignment = host.assignment("echo")
    host.broker.tell(host.peer, Scale(assignment, 2))
    assert host.placed(assignment.epoch)["instances"] == ["echo_0_0", "echo_0_1"]
    host.instance_hellos(assignment.epoch, 2)
    kept = host.pids()["echo_0_1"]
    host.broker.received.clear()
    host.broker.tell(host.peer, Scale(assignment, 1, ("echo_0_0",)))
    assert host.placed(assignment.epoch)["instances"] == []   # what it started now: nothing
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["name"], exited["stopped"]) == ("echo_0_0", True)
    assert host.pids() == {"echo_0_1": kept}


def test_a_stop_drains_first_and_the_agent_stops_when_the_broker_says_drained(host):
    host.joined()
    host.agent.request_stop()
    host.until(lambda: host.broker.of(Kind.DRAIN))
    assignment = host.assignment("echo")
    host.broker.tell(host.peer, Assign((assignment,)))
    assert host.placed(assignment.epoch)["err"]["message"] == f"host {host_name()} is draining"
    assert host.agent.running and host.agent.children == []   # still up: the broker moves work away first
    host.broker.tell(host.peer, Drained())
    host.until(lambda: not host.agent.running, what="the stop")
    assert host.agent.close() == ExitCode.OK


def test_a_drain_the_broker_never_confirms_ends_after_the_exit_timeout(impatient_host):
    impatient_host.joined()
    impatient_host.agent.request_stop()
    asked = impatient_host.until(lambda: [r.at for r in impatient_host.broker.received if r.kind == Kind.DRAIN])[0]
    impatient_host.until(lambda: not impatient_host.agent.running, what="the stop")
    assert time.monotonic() - asked >= 0.5 * 0.9
    assert impatient_host.agent.close() == ExitCode.OK


def test_a_second_stop_while_draining_stops_at_once_and_says_so_in_the_exit_code(host):
    host.joined()
    host.agent.request_stop()
    host.agent.request_stop()
    assert not host.agent.running
    assert host.agent.close() == ExitCode.FORCED


def test_a_silent_broker_is_noticed_and_its_successor_keeps_the_running_instance(host):
    host.joined(boot=1)
    assignment = host.assignment("echo", identity="load-a")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((iid, _),) = host.instance_hellos(assignment.epoch, 1)
    pid = host.pids()["echo_0_0"]
    host.broker.stop_beating()
    host.until(lambda: host.agent.broker_lost, timeout_s=HEARTBEAT_S * 10, what="the broker noticed lost")

    host.restart_broker()   # the agent reconnects by itself and heartbeats to the new one
    host.until(lambda: host.broker.of(Kind.HEARTBEAT, host.peer), what="a heartbeat to the new broker")
    host.broker.keep_beating(host.peer, 2, HEARTBEAT_S)
    hello = host.until(lambda: host.broker.of(Kind.HELLO, host.peer), what="a new HELLO")[-1]
    assert not host.agent.broker_lost
    (running,) = hello["running"]
    assert running == {"iid": iid.decode(), "m": "echo", "v": 1, "id": "load-a", "key": "echo_0_0", "name": "echo_0_0",
                       "kind": "CPU", "device": 0, "credit": 2, "scaled": False, "pid": pid}

    kept = msgspec.structs.replace(host.assignment("echo", identity="load-a"), adopt=(iid.decode(),))
    host.broker.tell(host.peer, Assign((kept,), complete=True))
    placed = host.placed(kept.epoch)
    assert (placed["instances"], placed["adopted"], placed["boot"]) == (["echo_0_0"], {"echo_0_0": iid.decode()}, 2)
    assert host.pids() == {"echo_0_0": pid} and host.agent.children[0].epoch == kept.epoch
    assert not host.broker.of(Kind.INSTANCE_EXITED)


def test_reset_makes_it_register_again_and_what_the_broker_does_not_keep_stops(host):
    host.agent.start()
    host.until(lambda: host.broker.of(Kind.HELLO, host.peer))
    host.broker.tell(host.peer, Reset())   # queued before its HELLO was answered: stale, ignored
    host.until(lambda: len(host.broker.of(Kind.HEARTBEAT, host.peer)) >= 2)
    assert len(host.broker.of(Kind.HELLO, host.peer)) == 1
    host.beat(1)
    assignment = host.assignment("echo", identity="load-a")
    host.broker.tell(host.peer, Assign((assignment,)))
    ((iid, _),) = host.instance_hellos(assignment.epoch, 1)

    host.broker.tell(host.peer, Reset(boot=1))   # the broker dropped this host
    host.until(lambda: len(host.broker.of(Kind.HELLO, host.peer)) == 2, what="HELLO again")
    assert [r["iid"] for r in host.broker.of(Kind.HELLO, host.peer)[-1]["running"]] == [iid.decode()]
    host.beat(1)
    host.broker.tell(host.peer, Assign((), complete=True))   # keeps nothing
    (exited,) = host.exits(assignment.epoch, 1)
    assert (exited["iid"], exited["stopped"]) == (iid.decode(), True)
    assert host.agent.children == []


def test_a_broker_that_refuses_the_agent_stops_it_with_the_protocol_exit_code(host):
    host.agent.start()
    host.until(lambda: host.broker.of(Kind.HELLO, host.peer))
    host.broker.tell(host.peer, Refused("protocol version 5 refused"))
    host.until(lambda: not host.agent.running)
    assert host.agent.close() == ExitCode.PROTOCOL_MISMATCH


def test_a_process_stopped_by_a_signal_is_not_reported_working():
    """The agent's heartbeat lists the instances whose processes run; the broker keeps a silent one
    of them. A stopped process (SIGSTOP, a debugger) does no work: it is not listed."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _stopped(process.pid)
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not _stopped(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _stopped(process.pid)
    finally:
        process.kill()
        process.wait()
    assert not _stopped(process.pid)   # gone: not stopped (and not running: the agent sees it exit)
