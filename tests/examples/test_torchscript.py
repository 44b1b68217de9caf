"""examples/torchscript: a scripted torch module served by the pytorch backend."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tests.examples.conftest import example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("torchscript", tmp_path_factory) as running:
        yield running


def test_scores_match_the_module_run_locally(server):
    rows = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    served = example_module("torchscript", "client").score(f"grpc://{server.grpc_url}", rows)
    with torch.no_grad():
        expected = example_module("torchscript", "build").perceptron()(torch.from_numpy(rows)).numpy()
    assert served.shape == (3, 4)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def test_without_torch_the_load_fails_saying_what_to_install(monkeypatch):
    from tritium.errors import InvalidArgument
    from tritium.workers.backends.pytorch import _import_torch

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    expected = r'needs PyTorch, which is not installed here: pip install "tritium\[torch\]"'
    with pytest.raises(InvalidArgument, match=expected):
        _import_torch()
