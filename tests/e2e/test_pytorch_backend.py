"""TorchScript models made here with torch.jit, served through the pytorch backend."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.rawhttp import request
from tests.models import write_config
from tests.servers import TritiumServer


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor):
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Multiply(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y


class DictInput(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        return [inputs["A"] + inputs["B"], inputs["A"] - inputs["B"]]


class Ordered(torch.nn.Module):
    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return first * 10 + second


class Shout(torch.nn.Module):
    def forward(self, words: List[str]) -> List[str]:
        return [w.upper() for w in words]


class RunningSum(torch.nn.Module):
    """A stateful model: the sequence's START control and its implicit state come to forward()."""

    def forward(self, value: torch.Tensor, start: torch.Tensor, state: torch.Tensor):
        total = torch.where(start > 0, value, state + value)
        return total, total


def save(module: torch.nn.Module, repo, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(repo / name / "1" / "model.pt"))
    write_config(repo / name, 'platform: "pytorch_libtorch"\n' + config)


def tensors(config_type="TYPE_FP32", dims="[ 4 ]", *names):
    return ", ".join(f'{{ name: "{n}", data_type: {config_type}, dims: {dims} }}' for n in names)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    save(AddSub(), repo, "ts_add_sub", f"""max_batch_size: 8
input [ {tensors("TYPE_FP32", "[ 4 ]", "INPUT0", "INPUT1")} ]
output [ {tensors("TYPE_FP32", "[ 4 ]", "OUTPUT__0", "OUTPUT__1")} ]
dynamic_batching {{ }}""")
    save(Multiply(), repo, "ts_named", f"""max_batch_size: 0
input [ {tensors("TYPE_INT64", "[ -1 ]", "INPUT__1", "INPUT__0")} ]
output [ {tensors("TYPE_INT64", "[ -1 ]", "OUTPUT__0")} ]""")
    save(DictInput(), repo, "ts_dict", f"""max_batch_size: 4
input [ {tensors("TYPE_FP64", "[ 2 ]", "A", "B")} ]
output [ {tensors("TYPE_FP64", "[ 2 ]", "SUM", "DIFF")} ]""")
    save(Ordered(), repo, "ts_order", f"""max_batch_size: 0
input [ {tensors("TYPE_FP32", "[ 3 ]", "X", "Y")} ]
output [ {tensors("TYPE_FP32", "[ 3 ]", "Z")} ]""")
    save(Shout(), repo, "ts_strings", f"""max_batch_size: 0
input [ {tensors("TYPE_STRING", "[ -1 ]", "WORDS")} ]
output [ {tensors("TYPE_STRING", "[ -1 ]", "LOUD")} ]""")
    save(RunningSum(), repo, "ts_running_sum", """max_batch_size: 2
input [ { name: "VALUE__0", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "TOTAL__0", data_type: TYPE_INT32, dims: [ 1 ] } ]
sequence_batching {
  control_input [ { name: "START__1", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN__2", output_name: "STATE_OUT__1", data_type: TYPE_INT32, dims: [ 1 ] } ]
}""")
    save(AddSub(), repo, "ts_wrong_inputs", f"""max_batch_size: 0
input [ {tensors("TYPE_FP32", "[ 4 ]", "INPUT0", "INPUT1", "INPUT2")} ]
output [ {tensors("TYPE_FP32", "[ 4 ]", "OUTPUT__0")} ]""")
    with TritiumServer(repo, "--exit-on-error=false") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url)


def inputs(**arrays):
    result = []
    for name, array in arrays.items():
        t = httpclient.InferInput(name, list(array.shape), httpclient.np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        result.append(t)
    return result


def test_forward_argument_names_and_a_tuple_of_outputs(client):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    result = client.infer("ts_add_sub", inputs(INPUT0=a, INPUT1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    assert client.get_model_metadata("ts_add_sub")["platform"] == "pytorch_libtorch"


def test_name_index_convention_binds_by_index_not_config_order(client):
    x = np.array([2, 3, 4], dtype=np.int64)
    y = np.array([10, 10, 10], dtype=np.int64)
    result = client.infer("ts_named", inputs(INPUT__0=x, INPUT__1=y))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * y)


def test_dict_input_and_a_list_of_outputs(client):
    a = np.array([[1.5, 2.5]], dtype=np.float64)
    b = np.array([[0.5, 0.5]], dtype=np.float64)
    result = client.infer("ts_dict", inputs(A=a, B=b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)


def test_config_order_when_names_follow_no_convention(client):
    x = np.array([1, 2, 3], dtype=np.float32)
    y = np.array([4, 5, 6], dtype=np.float32)
    np.testing.assert_array_equal(client.infer("ts_order", inputs(X=x, Y=y)).as_numpy("Z"), x * 10 + y)


def test_strings_in_and_out(client):
    words = np.array([b"torch", b"script"], dtype=np.object_)
    result = client.infer("ts_strings", inputs(WORDS=words))
    assert list(result.as_numpy("LOUD")) == [b"TORCH", b"SCRIPT"]


def test_runtime_failure_is_a_500_and_the_model_keeps_serving(client):
    x = np.array([1, 2, 3], dtype=np.int64)
    y = np.array([1, 2], dtype=np.int64)  # the model multiplies tensors of different sizes
    with pytest.raises(InferenceServerException) as error:
        client.infer("ts_named", inputs(INPUT__0=x, INPUT__1=y))
    assert error.value.status() == "500"
    assert "PyTorch execute failure:" in error.value.message()
    np.testing.assert_array_equal(client.infer("ts_named", inputs(INPUT__0=x, INPUT__1=x)).as_numpy("OUTPUT__0"), x * x)


def test_config_and_model_disagreeing_on_inputs_fails_the_load(server):
    assert request(server.url, "GET", "/v2/models/ts_wrong_inputs/ready")[0] == 400
    assert ("unable to load model 'ts_wrong_inputs', configuration expects 3 inputs, model provides 2"
            in server.logs())


def test_batched_requests_are_stacked_for_torch(server):
    from concurrent.futures import ThreadPoolExecutor

    rows = [np.full((1, 4), i, dtype=np.float32) for i in range(8)]

    def call(row):
        own = httpclient.InferenceServerClient(server.url)
        return own.infer("ts_add_sub", inputs(INPUT0=row, INPUT1=row)).as_numpy("OUTPUT__0")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, rows))
    for row, result in zip(rows, results):
        np.testing.assert_array_equal(result, row * 2)


def test_sequence_controls_and_implicit_state_reach_forward(client):
    """As Triton's pytorch backend binds them: START__1 and STATE_IN__2 by their indexes (two
    slots: a batch of two, one row per sequence, shares one forward())."""
    def add(value: int, sequence_id: int, start: bool = False) -> int:
        tensor = httpclient.InferInput("VALUE__0", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer("ts_running_sum", [tensor], sequence_id=sequence_id, sequence_start=start)
        return int(result.as_numpy("TOTAL__0")[0, 0])

    assert [add(5, 7, start=True), add(3, 8, start=True), add(4, 7), add(10, 8), add(1, 7)] == [5, 3, 9, 13, 10]
    assert add(2, 7, start=True) == 2   # a new sequence on the same id starts from its value
