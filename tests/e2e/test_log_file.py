"""``--log-file``: every process of ``tritium serve`` appends its lines to the one file, a
Python model's ``pb_utils.Logger`` lines included, and nothing of it reaches standard error."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.models import python_model
from tests.servers import TritiumServer

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            pb_utils.Logger.log_info(f"talker saw {x.tolist()}")
            pb_utils.Logger.log_verbose(f"talker verbose {x.tolist()}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
'''
CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "talker", MODEL, CONFIG)
    log_file = tmp_path_factory.mktemp("logs") / "tritium.log"
    log_file.write_text("a line from before\n")
    with TritiumServer(repo, "--log-file", str(log_file)) as server:
        yield server, log_file


def infer(server: TritiumServer, values: list[float]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([values], dtype=np.float32))
    return client.infer("talker", [x]).as_numpy("Y")


def lines_with(log_file, text: str, timeout_s: float = 10.0) -> list[str]:
    """The file's lines containing ``text``, once there are some (a line is written as it is logged)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in log_file.read_text().splitlines() if text in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_every_role_appends_to_the_file_and_stderr_stays_quiet(served):
    server, log_file = served
    lines = log_file.read_text().splitlines()
    assert lines[0] == "a line from before"
    roles = {match.group(1) for line in lines if (match := re.search(r" [IWED] (\w+)(?::\S+)?\[\d+\] ", line))}
    assert {"broker", "worker", "gateway", "instance"} <= roles
    assert "model talker version 1 is READY" in log_file.read_text()
    assert "is READY" not in server.logs()


def test_a_model_logger_line_goes_to_the_file(served):
    server, log_file = served
    assert infer(server, [1.5, 2.0]).tolist() == [[3.0, 4.0]]
    (line,) = lines_with(log_file, "talker saw [[1.5, 2.0]]")
    assert re.search(r" I instance:talker:\S+\[\d+\] model: talker saw \[\[1\.5, 2\.0\]\]$", line)
    assert lines_with(log_file, "talker verbose [[1.5, 2.0]]", timeout_s=0.5) == []


def test_the_logging_extension_reports_the_file_and_changes_what_is_written_to_it(served):
    server, log_file = served
    url = f"http://{server.url}/v2/logging"
    assert requests.get(url, timeout=10).json()["log_file"] == str(log_file)
    assert requests.post(url, json={"log_verbose_level": 1}, timeout=10).json()["log_verbose_level"] == 1
    try:
        deadline = time.monotonic() + 10
        while not lines_with(log_file, "talker verbose [[7.0, 8.0]]", timeout_s=0.2):
            assert time.monotonic() < deadline, "the instance never logged at the verbose level"
            infer(server, [7.0, 8.0])   # the new settings reach the instance through the broker
    finally:
        requests.post(url, json={"log_verbose_level": 0}, timeout=10)
    refused = requests.post(url, json={"log_file": "/tmp/elsewhere.log"}, timeout=10)
    assert refused.status_code == 501
    assert requests.get(url, timeout=10).json()["log_file"] == str(log_file)


def test_a_log_file_that_cannot_be_written_leaves_the_logs_on_stderr(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    missing = tmp_path / "no such folder" / "tritium.log"
    with TritiumServer(repo, "--log-file", str(missing)) as server:
        assert requests.get(f"http://{server.url}/v2/logging", timeout=10).json()["log_file"] == ""
        logs = server.logs()
    assert f"cannot write the log file {missing} (No such file or directory): logging to standard error" in logs
    assert "broker ready" in logs
    assert not missing.parent.exists()
