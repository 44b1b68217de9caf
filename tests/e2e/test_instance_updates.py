"""A reload that changes only a model's instance groups updates them in place, as Triton does:
the instances the new groups match go on running, only the missing ones start, the leftover
ones stop before the load returns, and a failure leaves everything as it was."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import cluster
from tests.e2e.rawhttp import error_of, request
from tests.servers import TritiumServer

MODEL = '''
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.events = os.path.join(args["model_repository"], "..", "events.log")
        self.name = args["model_instance_name"]
        self._note("init")
        if os.path.exists(os.path.join(args["model_repository"], "..", "fail_init")):
            raise pb_utils.TritonModelException("initialize refused on purpose")

    def _note(self, what):
        with open(self.events, "a") as events:
            events.write(f"{what} {self.name} {os.getpid()}\\n")

    def execute(self, requests):
        if any(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().flat[0] < 0 for r in requests):
            time.sleep(1)   # a slow request: its instance is busy meanwhile
        with open(os.path.join(os.path.dirname(self.events), "executed.log"), "a") as executed:
            executed.write(f"{self.name}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]

    def finalize(self):
        self._note("fini")
'''


def write_config(repo: Path, groups: str, max_batch_size: int = 8) -> None:
    path = repo / "grouped" / "config.pbtxt"
    staging = path.with_name("config.new")
    staging.write_text(f'''backend: "python"
max_batch_size: {max_batch_size}
dynamic_batching {{}}
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
instance_group [ {groups} ]
''')
    staging.replace(path)


def grouped_repository(repo: Path) -> Path:
    (repo / "grouped" / "1").mkdir(parents=True)
    (repo / "grouped" / "1" / "model.py").write_text(MODEL)
    write_config(repo, "{ count: 2 kind: KIND_CPU }")
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return grouped_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(repo):
    with TritiumServer(repo, "--model-control-mode=explicit", "--load-model=grouped") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


class Events:
    """The model's initialize and finalize calls, read from the file its instances write."""

    def __init__(self, repo: Path) -> None:
        self.path = repo / "events.log"
        self.seen = 0

    def new(self) -> list[tuple[str, str]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        fresh, self.seen = lines[self.seen:], len(lines)
        return sorted((what, name) for what, name, _ in (line.split() for line in fresh))


@pytest.fixture(scope="module")
def events(repo, server):
    return Events(repo)


def load(url: str, body: dict | None = None) -> tuple[int, str]:
    status, _, data = request(url, "POST", "/v2/repository/models/grouped/load",
                              json.dumps(body).encode() if body else b"")
    return status, error_of(data) if status != 200 else ""


def infer(client) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
    return client.infer("grouped", [tensor]).as_numpy("OUTPUT0")


def served_groups(client) -> list[tuple[str, int]]:
    return [(g["name"], g["count"]) for g in client.get_model_config("grouped")["instance_group"]]


def index_entry(server) -> dict:
    status, _, data = request(server.url, "POST", "/v2/repository/index", b"{}")
    assert status == 200
    return next(e for e in json.loads(data) if e["name"] == "grouped")


def test_more_instances_start_only_the_new_one(server, client, repo, events):
    events.new()
    write_config(repo, "{ count: 3 kind: KIND_CPU }")
    assert load(server.url) == (200, "")
    assert events.new() == [("init", "grouped_0_2")]
    assert served_groups(client) == [("grouped_0", 3)]
    np.testing.assert_array_equal(infer(client), [[2, 4, 6]])


def test_a_passive_group_added_in_place_initializes_its_instance_and_gets_no_request(server, client, repo, events):
    write_config(repo, "{ count: 3 kind: KIND_CPU }")   # from three instances, whatever ran before
    assert load(server.url) == (200, "")
    events.new()
    write_config(repo, '{ count: 1 kind: KIND_CPU }, { name: "standby" count: 1 kind: KIND_CPU passive: true }')
    assert load(server.url) == (200, "")
    assert events.new() == [("fini", "grouped_0_1"), ("fini", "grouped_0_2"), ("init", "standby_0")]
    executed = repo / "executed.log"
    executed.unlink(missing_ok=True)
    slow = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    slow.set_data_from_numpy(np.array([[-1, 2, 3]], dtype=np.float32))
    def slow_request():
        with httpclient.InferenceServerClient(server.url) as own:   # (a client per thread: gevent's rule)
            return own.infer("grouped", [slow])

    with concurrent.futures.ThreadPoolExecutor(1) as pool:   # the one active instance busy for a second...
        busy = pool.submit(slow_request)
        time.sleep(0.3)
        np.testing.assert_array_equal(infer(client), [[2, 4, 6]])   # ...this one waits for it, not for standby_0
        busy.result()
    assert sorted(executed.read_text().split()) == ["grouped_0_0", "grouped_0_0"]
    write_config(repo, "{ count: 3 kind: KIND_CPU }")
    assert load(server.url) == (200, "")
    assert events.new() == [("fini", "standby_0"), ("init", "grouped_0_1"), ("init", "grouped_0_2")]


def test_fewer_instances_stop_the_leftover_ones_before_the_load_returns(server, client, repo, events):
    events.new()
    write_config(repo, "{ count: 1 kind: KIND_CPU }")
    assert load(server.url) == (200, "")
    assert events.new() == [("fini", "grouped_0_1"), ("fini", "grouped_0_2")]   # the lowest one stays
    assert served_groups(client) == [("grouped_0", 1)]
    np.testing.assert_array_equal(infer(client), [[2, 4, 6]])


def test_renamed_groups_keep_their_instances(server, client, repo, events):
    write_config(repo, "{ count: 2 kind: KIND_CPU }")
    assert load(server.url) == (200, "")
    events.new()
    write_config(repo, '{ name: "a" count: 1 kind: KIND_CPU }, { name: "b" count: 1 kind: KIND_CPU }')
    assert load(server.url) == (200, "")
    assert events.new() == []
    assert served_groups(client) == [("a", 1), ("b", 1)]
    write_config(repo, '{ name: "b" count: 1 kind: KIND_CPU }')   # one fewer, whichever group it was named by
    assert load(server.url) == (200, "")
    assert [what for what, _ in events.new()] == ["fini"]


def test_the_load_api_config_updates_the_groups_too(server, client, events):
    config = client.get_model_config("grouped")
    config["instance_group"] = [{"name": "b", "count": 3, "kind": "KIND_CPU"}]
    events.new()
    assert load(server.url, {"parameters": {"config": json.dumps(config)}}) == (200, "")
    assert [what for what, _ in events.new()] == ["init", "init"]
    assert served_groups(client) == [("b", 3)]


def test_a_failed_update_leaves_the_instances_as_they_were(server, client, repo, events):
    before = served_groups(client)
    (repo / "fail_init").touch()
    try:
        write_config(repo, "{ count: 5 kind: KIND_CPU }")
        events.new()
        status, message = load(server.url)
    finally:
        (repo / "fail_init").unlink()
    assert status == 400
    assert message.startswith("load failed for model 'grouped': version 1 is at READY state: ")
    assert "initialize refused on purpose" in message
    assert [what for what, _ in events.new()] == ["init", "init"]   # the two it tried; none of the others stopped
    assert served_groups(client) == before
    entry = index_entry(server)   # as in Triton: READY, the failure as its reason
    assert entry["state"] == "READY"
    assert "initialize refused on purpose" in entry["reason"]
    assert request(server.url, "GET", "/v2/models/grouped/ready")[0] == 200
    np.testing.assert_array_equal(infer(client), [[2, 4, 6]])
    # The next update starts from what serves, and clears the reason.
    write_config(repo, "{ count: 4 kind: KIND_CPU }")
    assert load(server.url) == (200, "")
    assert [what for what, _ in events.new()] == ["init"]
    assert "reason" not in index_entry(server)


def test_a_config_written_again_the_same_reloads_nothing(server, client, repo, events):
    groups = ", ".join(f'{{ name: "{name}" count: {count} kind: KIND_CPU }}' for name, count in served_groups(client))
    events.new()
    write_config(repo, groups)   # (as an editor saves it: a new file, a new time, the same text)
    assert load(server.url) == (200, "")
    assert events.new() == []


def test_any_other_config_change_reloads_the_whole_model(server, client, repo, events):
    count = sum(count for _, count in served_groups(client))
    events.new()
    write_config(repo, "{ count: 2 kind: KIND_CPU }", max_batch_size=4)
    assert load(server.url) == (200, "")
    seen = events.new()
    assert [what for what, _ in seen].count("init") == 2
    # The old load's instances stop once the new one serves (they drain after the load returns).
    assert client.get_model_config("grouped")["max_batch_size"] == 4
    assert [what for what, _ in seen].count("fini") <= count


def test_requests_during_updates_are_all_answered(server, client, repo):
    failures: list[BaseException] = []
    answered = [0]
    stop = threading.Event()

    def keep_inferring() -> None:
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            while not stop.is_set():
                try:
                    np.testing.assert_array_equal(infer(own), [[2, 4, 6]])
                    answered[0] += 1
                except BaseException as exc:   # noqa: BLE001 (reported below)
                    failures.append(exc)
        finally:
            own.close()   # in its own thread: closed from the collector's, its gevent pool has no loop

    threads = [threading.Thread(target=keep_inferring) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for groups in ("{ count: 3 kind: KIND_CPU }", "{ count: 1 kind: KIND_CPU }", "{ count: 2 kind: KIND_CPU }"):
            write_config(repo, groups, max_batch_size=4)
            assert load(server.url) == (200, "")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert answered[0] > 0


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """A broker, two worker hosts and a gateway, each its own process, serving one repository."""
    repo = grouped_repository(tmp_path_factory.mktemp("two_hosts"))
    broker = cluster.broker(repo, "--model-control-mode=explicit", "--load-model=grouped")
    workers = [cluster.worker(broker.backend, repo) for _ in range(2)]
    gateway = cluster.gateway(broker.frontend)
    try:
        for part in (broker, *workers, gateway):
            part.wait_ready()
        cluster.wait_until(lambda: request(gateway.url, "GET", "/v2/models/grouped/ready")[0] == 200,
                           what="grouped ready")
        yield repo, gateway, workers
    finally:
        for part in (gateway, *workers, broker):
            part.stop(timeout_s=20)


def test_each_host_updates_its_own_instances(two_hosts):
    repo, gateway, workers = two_hosts
    events, client = Events(repo), httpclient.InferenceServerClient(gateway.url, network_timeout=60)
    cluster.wait_until(lambda: [line.split()[0] for line in events.path.read_text().splitlines()] == ["init"] * 4,
                       what="both hosts' instances initialized")
    pids = [cluster.instance_pids(worker, "grouped") for worker in workers]
    assert [len(p) for p in pids] == [2, 2]
    events.new()
    write_config(repo, "{ count: 1 kind: KIND_CPU }")
    assert load(gateway.url) == (200, "")   # each host stops its own leftover instance
    assert events.new() == [("fini", "grouped_0_1")] * 2
    kept = [cluster.instance_pids(worker, "grouped") for worker in workers]
    assert [len(k) for k in kept] == [1, 1] and all(k < p for k, p in zip(kept, pids))
    write_config(repo, "{ count: 3 kind: KIND_CPU }")
    assert load(gateway.url) == (200, "")
    assert events.new() == [("init", "grouped_0_1")] * 2 + [("init", "grouped_0_2")] * 2
    assert [len(cluster.instance_pids(worker, "grouped")) for worker in workers] == [3, 3]
    np.testing.assert_array_equal(infer(client), [[2, 4, 6]])


def test_a_load_queued_behind_a_failed_update_applies_its_own_groups(server, client, repo, events):
    write_config(repo, "{ count: 2 kind: KIND_CPU }", max_batch_size=4)
    assert load(server.url) == (200, "")
    config = client.get_model_config("grouped")
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    events.new()
    (repo / "fail_init").touch()
    try:
        write_config(repo, "{ count: 3 kind: KIND_CPU }", max_batch_size=4)
        with concurrent.futures.ThreadPoolExecutor() as pool:
            failing = pool.submit(load, server.url)
            time.sleep(0.2)   # (the second load waits for the first, as loads of one model do)
            shrinking = pool.submit(load, server.url, {"parameters": {"config": json.dumps(config)}})
            assert failing.result()[0] == 400
            assert shrinking.result() == (200, "")
    finally:
        (repo / "fail_init").unlink()
    assert sorted(what for what, _ in events.new()) == ["fini", "init"]   # the one it tried; the one it stopped
    assert served_groups(client) == [("grouped_0", 1)]


SEQUENCE_CONFIG = '''backend: "python"
max_batch_size: 4
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
output [{{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }}]
sequence_batching {{ direct {{ }} max_sequence_idle_microseconds: 60000000 }}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
'''
SEQUENCE_MODEL = MODEL.replace(
    '''        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]''',
    '''        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([[os.getpid()]], dtype=np.int64))])
                for r in requests]''')


def step(client, sequence: int, start: bool = False, end: bool = False) -> int:
    """One request of a sequence; the pid of the instance process that ran it."""
    tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.float32))
    result = client.infer("stateful", [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("PID")[0, 0])


def test_a_stateful_model_keeps_its_sequences_on_the_instances_that_leave(server, client, repo, events):
    (repo / "stateful" / "1").mkdir(parents=True)
    (repo / "stateful" / "1" / "model.py").write_text(SEQUENCE_MODEL)
    (repo / "stateful" / "config.pbtxt").write_text(SEQUENCE_CONFIG.format(count=3))
    events.new()
    assert request(server.url, "POST", "/v2/repository/models/stateful/load")[0] == 200
    pid_of = {pid: name for _, name, pid in (line.split() for line in events.path.read_text().splitlines())
              if name.startswith("stateful")}
    events.new()
    first, second = step(client, 1, start=True), step(client, 2, start=True)
    assert first != second   # two instances, one sequence each

    replace_config = SEQUENCE_CONFIG.format(count=1)
    (repo / "stateful" / "config.new").write_text(replace_config)
    (repo / "stateful" / "config.new").replace(repo / "stateful" / "config.pbtxt")
    assert request(server.url, "POST", "/v2/repository/models/stateful/load")[0] == 200
    busy = {pid_of[str(first)], pid_of[str(second)]} - {"stateful_0_0"}
    # The load stops at once only the leaving instance that holds no sequence.
    assert events.new() == [("fini", name) for name in sorted({"stateful_0_1", "stateful_0_2"} - busy)]
    assert (step(client, 1), step(client, 2)) == (first, second)   # each sequence stays where its state is
    kept = int(next(pid for pid, name in pid_of.items() if name == "stateful_0_0"))
    assert step(client, 3, start=True) == kept   # a new sequence goes to the instance that stays (it has 4 slots)
    step(client, 1, end=True)
    step(client, 2, end=True)
    cluster.wait_until(lambda: len(busy) == 0 or events.path.read_text().count("fini stateful") == 2,
                       what="the leaving instances stopped once their sequences ended")
    assert sorted(events.new()) == [("fini", name) for name in sorted(busy)]
    assert step(client, 3, end=True) == kept
