"""A Python model waiting on a BLS call when the broker is restarted gets an error for it and
serves on, in the same process; a call it makes while the broker restarts is answered by the new
process.

The broker that held the call is gone and the new one never heard of it: without an answer the
model's execute would never return, and its instance could never join the new broker. Broker,
worker host and gateway run as separate processes over tcp:// (tests/cluster.py).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import cluster
from tests.cluster import instance_pids

HEARTBEAT = ("--heartbeat-interval-secs", "0.25")
VIA_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "DELAY_MS", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
"""
# Asks whoami (tests/e2e/cluster_repo) for its pid, through a BLS call; logs how the call ended.
# As "via" it passes DELAY_MS on (whoami holds the call that long); as "via_late" it says it
# waits, waits DELAY_MS itself, then calls.
VIA_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS")
            if self.name == "via_late":
                pb_utils.Logger.log_warn("via_late: waiting")
                time.sleep(float(delay.as_numpy().flat[0]) / 1000)
                delay = pb_utils.Tensor("DELAY_MS", np.zeros_like(delay.as_numpy()))
            # Version 1 by name: a call for the latest version is not held while it is taken over.
            called = pb_utils.InferenceRequest(model_name="whoami", model_version=1, inputs=[delay],
                                               requested_output_names=["PID"]).exec()
            if called.has_error():
                pb_utils.Logger.log_warn(f"{self.name}: {called.error().message()}")
                responses.append(pb_utils.InferenceResponse(error=called.error()))
            else:
                pb_utils.Logger.log_warn(f"{self.name}: whoami answered")
                responses.append(pb_utils.InferenceResponse(called.output_tensors()))
        return responses
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    shutil.copytree(Path(__file__).parent / "cluster_repo" / "whoami", repository / "whoami")
    for name in ("via", "via_late"):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(VIA_CONFIG)
        (repository / name / "1" / "model.py").write_text(VIA_MODEL)
    broker = cluster.broker(repository, *HEARTBEAT)
    broker.wait_ready()
    worker = cluster.worker(broker.backend, repository, *HEARTBEAT)
    gateway = cluster.gateway(broker.frontend, *HEARTBEAT)
    try:
        worker.wait_ready()
        gateway.wait_ready()
        yield broker, worker, gateway
    finally:
        for part in (gateway, worker, broker):
            part.stop(timeout_s=20)


def via(gateway: cluster.Part, delay_ms: float, model: str = "via") -> int:
    """The pid of the whoami instance that ``model`` called."""
    client = httpclient.InferenceServerClient(gateway.url, network_timeout=30)
    tensor = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[delay_ms]], dtype=np.float32))
    return int(client.infer(model, [tensor]).as_numpy("PID")[0, 0])


def answers(gateway: cluster.Part) -> int | None:
    try:
        return via(gateway, 0)
    except InferenceServerException:
        return None


def test_a_bls_call_in_flight_across_a_broker_restart_fails_and_its_model_serves_on(world):
    broker, worker, gateway = world
    whoami = cluster.wait_until(lambda: answers(gateway), timeout_s=60, what="via answering")
    via_pids = instance_pids(worker, "via")
    outcome: list = []

    def call() -> None:
        try:
            outcome.append(via(gateway, 3000))   # whoami holds the call for 3 s
        except InferenceServerException as error:
            outcome.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(1.0)   # the call is with whoami
    broker.kill()
    broker.start()
    broker.wait_ready()
    back = time.monotonic()
    caller.join(30)
    (error,) = outcome
    assert isinstance(error, InferenceServerException) and error.status() == "503", error
    assert cluster.wait_until(lambda: answers(gateway), timeout_s=15, what="via answering again") == whoami
    took = time.monotonic() - back
    assert instance_pids(worker, "via") == via_pids and len(via_pids) == 1, "the same instance serves"
    assert took < 8, f"via answered again {took:.1f} s after the broker was back"
    logs = worker.logs()
    assert f"via: the broker at {broker.backend} restarted; the BLS request to model 'whoami' was lost" in logs
    assert logs.count("kept by a new broker process") == 3, "each of the three instances joined the new broker once"


def test_a_bls_call_sent_while_the_broker_restarts_is_answered_by_the_new_process(world):
    """``via_late`` makes its call while no broker runs: the call reaches the new process,
    which queues it while it takes whoami over and answers it; the instance, told where the new
    process's calls begin, does not fail it. (The gateway's request itself went to the killed
    broker: its client gets a 503.)"""
    broker, worker, gateway = world
    cluster.wait_until(lambda: answers(gateway), timeout_s=60, what="via answering")
    outcome: list = []

    def call() -> None:
        try:
            outcome.append(via(gateway, 1200, "via_late"))
        except InferenceServerException as error:
            outcome.append(error)

    answered_before = worker.logs().count("via_late: whoami answered")
    waited_before = worker.logs().count("via_late: waiting")
    caller = threading.Thread(target=call)
    caller.start()
    cluster.wait_until(lambda: worker.logs().count("via_late: waiting") > waited_before or None, timeout_s=15,
                       what="via_late in execute")
    broker.kill()
    time.sleep(1.0)   # via_late calls while no broker listens: the call waits in its socket
    broker.start()
    broker.wait_ready()
    caller.join(30)
    assert not caller.is_alive()
    cluster.wait_until(lambda: worker.logs().count("via_late: whoami answered") > answered_before or None,
                       timeout_s=15, what="the call made during the restart answered")
    assert "via_late: the broker at" not in worker.logs(), "a call the new process got was failed"
