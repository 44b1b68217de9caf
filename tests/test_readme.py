"""The README's curl and Python snippets, run as written against a server of examples/model_repository.

The only change made to a snippet is the address: the server listens on free ports, not on
8000 and 8001, so that the test can run beside anything else.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import orjson
import pytest

from tests.servers import PROJECT_ROOT, TritiumServer

README = (PROJECT_ROOT / "README.md").read_text()
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
A = np.arange(16, dtype=np.float32)
CURL_B = np.ones(16, dtype=np.float32)


def snippets(language: str, containing: str = "") -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == language and containing in body]


@pytest.fixture(scope="module")
def server():
    with TritiumServer(PROJECT_ROOT / "examples" / "model_repository") as running:
        yield running


def _pointed_at(snippet: str, server: TritiumServer) -> str:
    return snippet.replace("grpc://localhost:8001", f"grpc://{server.grpc_url}").replace("localhost:8000", server.url)


def test_readme_has_the_snippets_this_test_runs():
    assert len(snippets("bash", "curl ")) == 1
    assert len(snippets("python")) == 2
    assert "pip install .  " in README and "tritium serve --model-repository examples/model_repository" in README


def test_curl_snippet(server):
    (snippet,) = snippets("bash", "curl ")
    result = subprocess.run(["bash", "-c", _pointed_at(snippet, server)], capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr
    outputs = {o["name"]: o for o in orjson.loads(result.stdout)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == (A + 1 + CURL_B).tolist()  # the snippet's INPUT0 is 1..16
    assert outputs["OUTPUT1"]["data"] == (A + 1 - CURL_B).tolist()
    assert outputs["OUTPUT0"]["shape"] == [1, 16] and outputs["OUTPUT0"]["datatype"] == "FP32"


@pytest.mark.parametrize("index", [0, 1], ids=["tritonclient", "tritium.client"])
def test_python_snippet_prints_a_plus_b_and_a_minus_b(server, index):
    snippet = snippets("python")[index]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _pointed_at(snippet, server)], capture_output=True, timeout=60,
                            env=env, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr.decode()
    printed = [float(x) for x in re.findall(r"-?\d+\.?\d*", result.stdout.decode())]
    assert printed == (A + 1).tolist() + (A - 1).tolist()  # a + b, a - b with b = 1
