"""``tritium repo check``: the table, the JSON, and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tritium.repo import ModelRepository
from tritium.repo.check import check_rows, render_table, rows_as_json
from tests.repo.helpers import FLOAT, PLAIN_PY_MODEL, add_sub, identity, minimal_io, onnx_io, write_model
from tritium.cli import main

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setenv("TRITIUM_GPUS", "")  # the same table on every machine


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def torchscript(module: torch.nn.Module):
    return lambda path: torch.jit.script(module).save(str(path))


def good_repo(root):
    write_model(root, "add_sub", None, {"1/model.onnx": add_sub()})
    write_model(root, "plain", None, {"1/model.onnx": identity(dims=(3,))})
    write_model(root, "py", 'backend: "python"\nmax_batch_size: 2\nsequence_batching { }\n'
                'instance_group [ { kind: KIND_CPU count: 3 }, { kind: KIND_MODEL } ]',
                {"1/model.py": PLAIN_PY_MODEL, "2/model.py": PLAIN_PY_MODEL})
    write_model(root, "ts", 'platform: "pytorch_libtorch"\nversion_policy { all { } }' + minimal_io(),
                {"1/model.pt": torchscript(Double()), "3/model.pt": torchscript(Double())})
    ens = write_model(root, "ens", """
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "S" data_type: TYPE_FP32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1
            input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
            output_map { key: "OUTPUT0" value: "S" } } ] }
    """)
    (ens / "1").mkdir()


def run(*args):
    return CliRunner().invoke(main, ["repo", "check", *map(str, args)])


def table_rows(output: str) -> dict[str, list[str]]:
    lines = output.splitlines()
    assert lines[0].split() == ["MODEL", "BACKEND", "VERSIONS", "MAX_BATCH", "SCHEDULER",
                                "INSTANCES", "STATUS"]
    rows = {}
    for line in lines[1:]:
        if not line:
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def test_table_of_a_good_repository(tmp_path):
    good_repo(tmp_path)
    result = run(tmp_path)
    assert result.exit_code == 0, result.output
    rows = table_rows(result.output)
    assert rows == {
        "add_sub": ["add_sub", "onnxruntime/onnxruntime_onnx", "1", "4",
                    "dynamic(delay=0us,preferred=[4])", "2xCPU", "OK"],
        "ens": ["ens", "ensemble", "1", "4", "ensemble(1", "steps)", "-", "OK"],
        "plain": ["plain", "onnxruntime/onnxruntime_onnx", "1", "0", "default", "2xCPU", "OK"],
        "py": ["py", "python", "2", "2", "sequence(direct)", "3xCPU", "1xMODEL", "OK"],
        "ts": ["ts", "pytorch/pytorch_libtorch", "1,3", "0", "default", "1xCPU", "OK"],
    }
    assert list(rows) == sorted(rows)
    assert "error" not in result.output.lower()


def test_failures_give_exit_status_1_and_their_message(tmp_path):
    good_repo(tmp_path)
    write_model(tmp_path, "bad", 'backend: "python"\nunknown_field: 1', {"1/model.py": PLAIN_PY_MODEL})
    write_model(tmp_path, "nofile", 'backend: "python"\nversion_policy { all { } }',
                {"1/model.py": PLAIN_PY_MODEL, "2/readme.txt": "x"})
    result = run(tmp_path)
    assert result.exit_code == 1
    rows = table_rows(result.output)
    assert rows["bad"] == ["bad", "-", "-", "-", "-", "-", "FAIL"]
    assert rows["nofile"][1:4] == ["python", "1", "0"] and rows["nofile"][-1] == "FAIL"
    assert rows["add_sub"][-1] == "OK"
    lines = result.output.splitlines()
    assert f"bad: {tmp_path / 'bad' / 'config.pbtxt'}:2:1: " in "\n".join(lines)
    assert 'has no field named "unknown_field"' in result.output
    assert f"nofile: version 2 of model 'nofile' has no model.py in {tmp_path / 'nofile' / '2'}" in lines


def test_a_model_whose_inputs_fail_each_version_is_a_failure_with_its_reason(tmp_path):
    write_model(tmp_path, "dims", """
        backend: "python"
        input [ { name: "IN", data_type: TYPE_FP32, dims: [ -2 ] } ]
        parameters { key: "tritium.autoscale" value: { string_value: "min=one" } }""", {"1/model.py": PLAIN_PY_MODEL})
    result = run(tmp_path)
    assert result.exit_code == 1, result.output
    assert table_rows(result.output)["dims"][-1] == "FAIL"
    assert "input 'IN' has dimension -2" in result.output


def test_missing_repository_fails(tmp_path):
    good_repo(tmp_path)
    result = run(tmp_path, tmp_path / "nowhere")
    assert result.exit_code == 1
    assert f"error: model repository '{tmp_path / 'nowhere'}' does not exist" in result.output.splitlines()
    assert table_rows(result.output)["add_sub"][-1] == "OK"


def test_json_output(tmp_path):
    good_repo(tmp_path)
    write_model(tmp_path, "bad", None, {"1/model.plan": b"x"})
    result = run(tmp_path, "--json")
    assert result.exit_code == 1
    document = json.loads(result.output)
    assert document["ok"] is False
    assert document["repository_errors"] == []
    models = {m["name"]: m for m in document["models"]}
    assert models["add_sub"] == {
        "name": "add_sub", "backend": "onnxruntime/onnxruntime_onnx", "versions": [1],
        "max_batch_size": 4, "scheduler": "dynamic(delay=0us,preferred=[4])",
        "instance_groups": "2xCPU", "ok": True, "error": None, "path": str(tmp_path / "add_sub")}
    assert models["bad"]["ok"] is False
    assert models["bad"]["max_batch_size"] is None
    assert "platform 'tensorrt_plan' (TensorRT), which tritium does not support" in models["bad"]["error"]


def test_json_output_of_a_good_repository(tmp_path):
    good_repo(tmp_path)
    result = run("--json", tmp_path)
    assert result.exit_code == 0
    assert json.loads(result.output)["ok"] is True


def test_model_config_name_option(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub(),
                                      "configs/small.pbtxt": "max_batch_size: 2"})
    result = run(tmp_path, "--model-config-name", "small")
    assert result.exit_code == 0
    assert table_rows(result.output)["m"][3] == "2"


@pytest.mark.parametrize("flags", [["--disable-auto-complete-config"], ["--strict-model-config", "true"],
                                   ["--strict-model-config=1"]])
def test_auto_complete_can_be_turned_off(tmp_path, flags):
    write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"', {"1/model.onnx": add_sub()})
    write_model(tmp_path, "no_config", None, {"1/model.onnx": add_sub()})
    result = run(tmp_path, *flags)
    rows = table_rows(result.output)
    assert rows["m"][3] == "0" and rows["m"][4] == "default"
    assert rows["no_config"][-1] == "FAIL"
    assert "auto-complete is disabled" in result.output
    assert result.exit_code == 1


def test_strict_model_config_false_keeps_auto_complete(tmp_path):
    write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"', {"1/model.onnx": add_sub()})
    result = run(tmp_path, "--strict-model-config", "false")
    assert result.exit_code == 0
    assert table_rows(result.output)["m"][3] == "4"


def test_bad_strict_model_config_value(tmp_path):
    result = run(tmp_path, "--strict-model-config", "maybe")
    assert result.exit_code == 2
    assert "expected true or false, got 'maybe'" in result.output


def test_gpu_host_shows_gpu_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITIUM_GPUS", "0,1")
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    result = run(tmp_path)
    assert table_rows(result.output)["m"][5] == "1xGPU@gpu0,1"


def test_a_repository_argument_is_required():
    result = CliRunner().invoke(main, ["repo", "check"])
    assert result.exit_code == 2


def test_render_table_and_json_from_a_scan(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    scan = ModelRepository([tmp_path, tmp_path / "gone"]).load_all()
    rows = check_rows(scan)
    text = render_table(rows, scan.errors)
    assert text.splitlines()[-1] == f"error: model repository '{tmp_path / 'gone'}' does not exist"
    document = rows_as_json(rows, scan.errors)
    assert document["ok"] is False  # a missing repository is a failure too
    assert document["models"][0]["ok"] is True


def test_the_installed_command(tmp_path):
    good_repo(tmp_path)
    write_model(tmp_path, "bad", "nonsense")
    done = subprocess.run([sys.executable, "-m", "tritium.cli", "repo", "check", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT,
                          env={"PATH": "/usr/bin:/bin", "TRITIUM_GPUS": ""})
    assert done.returncode == 1
    assert table_rows(done.stdout)["bad"][-1] == "FAIL"
    assert table_rows(done.stdout)["add_sub"][-1] == "OK"


def test_model_files_are_checked_against_their_configs(tmp_path):
    """Models that pass the config checks but that serving would refuse, as the load does."""
    good_repo(tmp_path)
    write_model(tmp_path, "renamed", """
        platform: "onnxruntime_onnx"
        input [ { name: "image" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, {"1/model.onnx": onnx_io([("pixels", FLOAT, [4])], [("y", FLOAT, [4])])})
    write_model(tmp_path, "transposed", """
        platform: "onnxruntime_onnx"
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 224, 3 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 224 ] } ]
    """, {"1/model.onnx": onnx_io([("x", FLOAT, [3, 224])], [("y", FLOAT, [3, 224])])})
    write_model(tmp_path, "ts_short", 'platform: "pytorch_libtorch"\n' + minimal_io().replace(
        'name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }',
        'name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }'),
        {"1/model.pt": torchscript(Double())})
    result = run(tmp_path)
    assert result.exit_code == 1
    rows = table_rows(result.output)
    assert {name: row[-1] for name, row in rows.items() if row[-1] == "FAIL"} == {
        "renamed": "FAIL", "transposed": "FAIL", "ts_short": "FAIL"}
    lines = result.output.splitlines()
    config = tmp_path / "renamed" / "config.pbtxt"
    assert f"renamed: {config}:3: unexpected inference input 'image', allowed inputs are: pixels" in lines
    assert (f"transposed: {tmp_path / 'transposed' / 'config.pbtxt'}:3: model 'transposed', tensor 'x': "
            "the model expects 2 dimensions (shape [3,224]) but the model configuration specifies 2 "
            "dimensions (shape [224,3])") in lines
    assert "ts_short: unable to load model 'ts_short', configuration expects 2 inputs, model provides 1" in lines


def test_an_autoscaled_model_shows_its_range(tmp_path):
    write_model(tmp_path, "scaled", 'backend: "python"\ninstance_group [ { kind: KIND_CPU count: 2 } ]\n'
                'parameters { key: "tritium.autoscale" value: { string_value: "min=0,max=6" } }',
                {"1/model.py": PLAIN_PY_MODEL})
    write_model(tmp_path, "fixed", 'backend: "python"\ninstance_group [ { kind: KIND_CPU count: 2 } ]',
                {"1/model.py": PLAIN_PY_MODEL})
    result = run(tmp_path)
    assert result.exit_code == 0, result.output
    rows = table_rows(result.output)
    assert rows["scaled"][5] == "0-6xCPU(autoscale)"
    assert rows["fixed"][5] == "2xCPU"
