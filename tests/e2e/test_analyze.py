"""tritium analyze on a model whose best setting is known by construction.

``sleepy`` sleeps 80 ms per execution whatever its batch holds, so at 16 requests in flight
only bigger batches and more instances raise throughput: within 2 instances and batches of
at most 2, the best is 2 instances with max_batch_size 2 (4 requests per 80 ms), twice
anything else. The config analyze writes is then loaded from the repository. Windows of
600 ms: with 300 ms a loaded machine once measured 2 instances no better than 1.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from click.testing import CliRunner

from tests.servers import TritiumServer, free_port
from tritium.cli import main

SLEEPY_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

SLEEPY_MODEL = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.08)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "sleepy" / "1").mkdir(parents=True)
    (root / "sleepy" / "config.pbtxt").write_text(SLEEPY_CONFIG)
    (root / "sleepy" / "1" / "model.py").write_text(SLEEPY_MODEL)
    return root


@pytest.fixture(scope="module")
def server(repo):
    running = TritiumServer(repo, "--model-control-mode", "explicit", "--load-model", "sleepy")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def analysis(server, tmp_path_factory):
    output = tmp_path_factory.mktemp("analysis")
    result = CliRunner(catch_exceptions=False).invoke(main, [
        "analyze", "-m", "sleepy", "-u", server.url, "--output", str(output), "--concurrency", "16",
        "--max-instance-count", "2", "--max-batch-size", "2", "--queue-delays", "0",
        "-p", "600", "-r", "3", "-s", "100", "--latency-budget", "2000"])
    return result, output


def test_analyze_finds_the_setting_known_to_be_best(analysis):
    result, output = analysis
    assert result.exit_code == 0, result.stderr
    # the trials' figures, to tell a noisy measurement from a wrong choice when this fails
    assert "best for sleepy: 2xcpu batch 2" in result.stdout, result.stderr
    text = (output / "sleepy" / "config.pbtxt").read_text()
    assert re.search(r"^max_batch_size: 2$", text, re.M)
    assert re.search(r"instance_group \{\s+count: 2\s+kind: KIND_CPU\s+\}", text)
    assert "dynamic_batching" in text
    # one progress line per candidate: the grid (2 counts x 2 sizes), then the preferred batch size
    measured = [line.split(":")[0] for line in result.stderr.splitlines() if line.startswith("sleepy ")]
    assert measured[:2] == ["sleepy 1xcpu batch 1", "sleepy 2xcpu batch 1"]
    assert len(measured) == 5


def test_the_report_embeds_its_plots(analysis):
    _, output = analysis
    report = (output / "report.html").read_text()
    assert report.count('src="data:image/png;base64,') == 1
    assert "Pareto" in report or "Best configuration" in report
    assert (output / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_written_config_loads_and_serves(analysis, repo, server):
    _, output = analysis
    (repo / "sleepy" / "config.pbtxt").write_text((output / "sleepy" / "config.pbtxt").read_text())
    client = httpclient.InferenceServerClient(server.url)
    client.load_model("sleepy")
    config = client.get_model_config("sleepy")
    assert config["max_batch_size"] == 2
    assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(2, "KIND_CPU")]
    tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 4), np.float32))
    answer = client.infer("sleepy", [tensor]).as_numpy("OUTPUT0")
    assert answer.shape == (2, 4) and float(answer.sum()) == 16.0


def test_a_stopped_server_is_one_line_and_exit_3(tmp_path):
    result = CliRunner().invoke(main, ["analyze", "-m", "sleepy", "-u", f"127.0.0.1:{free_port()}",
                                       "--output", str(tmp_path)])
    assert result.exit_code == 3
    assert result.stderr.startswith("error: cannot reach the server at http://127.0.0.1:")
    assert len(result.stderr.splitlines()) == 1 and not list(tmp_path.iterdir())
