"""pb_utils.load_model, unload_model and is_model_ready: the arguments as Triton's bindings take
them, and readiness read from the model table as a client's readiness request reads it. The
broker's side is in tests/e2e/test_model_control_from_a_model.py; here the instance's BLS client
is replaced by one that records what it is asked and answers with a given table."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tritium.pb_utils import MODULE_DIR
from tritium.pb_utils.types import runtime
from tritium.protocol import LoadModel, ModelsQuery, UnloadModel

sys.path.insert(0, MODULE_DIR)
import triton_python_backend_utils as pb_utils  # noqa: E402


class Broker:
    """What ``BlsClient.control`` is asked, answered with a model table."""

    def __init__(self, versions: list | None = None) -> None:
        self.pid = os.getpid()   # the process it serves (a forked one would get a client of its own)
        self.asked: list = []
        self.versions = versions or []

    def control(self, args):
        self.asked.append(args)
        if isinstance(args, ModelsQuery):
            return {"models": [{"name": "m", "versions": self.versions}]}
        return {}


@pytest.fixture
def broker():
    runtime.instance_name, runtime.bls = "caller_0", Broker()
    yield runtime.bls
    runtime.bls = None


def test_names_and_contents_are_taken_as_tritons_bindings_take_them(broker):
    pb_utils.load_model(np.str_("m"), config=b'{"backend": "python"}', files={b"file:1/model.py": np.bytes_(b"x")})
    pb_utils.unload_model(b"m", unload_dependents=np.True_)
    pb_utils.unload_model("m", 0)
    assert broker.asked == [LoadModel("m", {"file:1/model.py": b"x", "config": '{"backend": "python"}'}),
                            UnloadModel("m", True), UnloadModel("m", False)]
    assert [type(args.model) for args in broker.asked] == [str, str, str]
    assert type(broker.asked[0].parameters["file:1/model.py"]) is bytes


def test_arguments_the_bindings_refuse(broker):
    with pytest.raises(TypeError, match="is not an instance of 'bytes'"):
        pb_utils.load_model("m", files={"file:1/model.py": "text"})
    with pytest.raises(RuntimeError, match="Unable to cast Python instance"):
        pb_utils.load_model("m", files={1: b"x"})
    with pytest.raises(TypeError, match=r"^is_model_ready\(\): incompatible function arguments"):
        pb_utils.is_model_ready("m", 1)
    assert broker.asked == []


@pytest.mark.parametrize("versions, version, ready", [
    ([[1, "READY", "", True], [2, "READY", "", True]], "", True),
    ([[1, "READY", "", True], [2, "READY", "", False]], "", False),   # the latest ready one decides, as for a client
    ([[1, "READY", "", True], [2, "UNAVAILABLE", "unloaded", False]], "", True),
    ([[1, "READY", "", True], [2, "READY", "", False]], "1", True),
    ([[1, "READY", "", True]], " 1x", True),    # std::stol reads the leading digits
    ([[1, "LOADING", "", False]], "1", False),
    ([], "", False),
])
def test_readiness_is_the_table_read_as_a_client_reads_it(broker, versions, version, ready):
    broker.versions = versions
    assert pb_utils.is_model_ready("m", version) is ready
    assert pb_utils.is_model_ready("another", version) is False


def test_a_version_std_stol_cannot_read_is_refused(broker):
    for text in ("x", "\uff11", "99999999999999999999"):   # (a full-width digit: not one of stol's)
        with pytest.raises(pb_utils.TritonModelException, match=f"version string '{text}' \\(details: stol\\)"):
            pb_utils.is_model_ready("m", text)
