"""Python models: auto_complete_config run in a subprocess, and what it may and may not do."""

from __future__ import annotations

import time

from tritonclient.grpc import model_config_pb2 as mc

from tritium.repo.python_autocomplete import run_auto_complete
from tests.repo.helpers import PLAIN_PY_MODEL, config_fails_model, load, load_error, version_error, write_model

COMPLETING_MODEL = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            config = auto_complete_model_config
            config.set_max_batch_size(8)
            config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
            config.add_input({"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1],
                              "optional": True})
            config.add_output({"name": "SCORE", "data_type": "TYPE_FP32", "dims": [2, 3]})
            config.set_dynamic_batching()
            return config

        def execute(self, requests):
            return []
"""


def summary(tensors):
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in tensors]


def test_auto_complete_config_fills_the_config(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": COMPLETING_MODEL})
    config = load(tmp_path, "m").config
    assert config.backend == "python"
    assert config.max_batch_size == 8
    assert summary(config.input) == [("TEXT", "TYPE_STRING", [1]), ("MASK", "TYPE_BOOL", [-1])]
    assert [t.optional for t in config.input] == [False, True]
    assert summary(config.output) == [("SCORE", "TYPE_FP32", [2, 3])]
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 1)]


def test_auto_complete_merges_with_config_pbtxt(tmp_path):
    write_model(tmp_path, "m", """
        backend: "python"
        max_batch_size: 4
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        parameters { key: "mode" value { string_value: "fast" } }
    """, {"1/model.py": COMPLETING_MODEL})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 8
    assert [t.name for t in config.input] == ["TEXT", "MASK"]
    assert config.parameters["mode"].string_value == "fast"


def test_auto_complete_cannot_lower_a_configured_max_batch_size(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 16", {"1/model.py": COMPLETING_MODEL})
    message = version_error(tmp_path, "m")
    assert message.startswith("Internal: ValueError: ")
    assert "max_batch_size 16 is greater than the max_batch_size 8" in message


def test_auto_complete_conflicting_datatype_is_an_error(tmp_path):
    write_model(tmp_path, "m", 'input [ { name: "TEXT" data_type: TYPE_INT32 dims: [ 1 ] } ]',
                {"1/model.py": COMPLETING_MODEL})
    message = version_error(tmp_path, "m")
    assert "configuration expects datatype TYPE_INT32 for input 'TEXT', model provides TYPE_STRING" in message


def test_set_dynamic_batching_refused_with_sequence_batching(tmp_path):
    write_model(tmp_path, "m", "sequence_batching { }", {"1/model.py": COMPLETING_MODEL})
    message = version_error(tmp_path, "m")
    assert "scheduling_choice as 'sequence_batching'" in message


def test_decoupled_transaction_policy(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.set_model_transaction_policy({"decoupled": True})
                return config
    """})
    assert load(tmp_path, "m").config.model_transaction_policy.decoupled is True


def test_model_without_auto_complete_config_and_without_config(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": PLAIN_PY_MODEL})
    config = load(tmp_path, "m").config
    assert (config.backend, config.platform, config.max_batch_size) == ("python", "", 0)
    assert len(config.input) == 0 and len(config.output) == 0


def test_auto_complete_that_raises(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                raise RuntimeError("no GPU tokenizer here")
    """})
    # As Triton's stub reports it, each version failed with it (the model itself is listed).
    assert version_error(tmp_path, "m") == ("Internal: RuntimeError: no GPU tokenizer here\n\nAt:\n"
                                            f"  {tmp_path / 'm' / '1' / 'model.py'}(5): auto_complete_config\n")


def test_model_py_that_fails_to_import(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        import module_that_does_not_exist

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                return config
    """})
    message = version_error(tmp_path, "m")
    assert message.startswith("Internal: ModuleNotFoundError: ")
    assert "module_that_does_not_exist" in message


def test_auto_complete_that_hangs_times_out(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        import time

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                time.sleep(60)
                return config
    """})
    start = time.monotonic()
    message = version_error(tmp_path, "m", python_autocomplete_timeout_s=0.5)
    assert time.monotonic() - start < 5
    model_file = tmp_path / "m" / "1" / "model.py"
    assert f"auto_complete_config of model 'm' ({model_file}) did not finish within 0.5 s" in message


def test_auto_complete_that_prints_to_stdout(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        import sys
        print("loading tokenizer...")
        print('{"config": {"max_batch_size": 99}}')

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                print("in auto_complete_config")
                sys.stdout.write('{"error": "not really"}\\n')
                sys.stdout.flush()
                config.set_max_batch_size(2)
                return config
    """})
    assert load(tmp_path, "m").config.max_batch_size == 2


def test_auto_complete_that_exits_the_process(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        import os, sys

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                sys.stderr.write("fatal: giving up\\n")
                sys.stderr.flush()
                os._exit(3)
    """})
    message = version_error(tmp_path, "m")
    assert "auto_complete_config of model 'm'" in message
    assert "ended with exit status 3 and no answer: fatal: giving up" in message


def test_auto_complete_returning_something_else(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                return config.as_dict()
    """})
    message = version_error(tmp_path, "m")
    assert "auto_complete_config must return the pb_utils.ModelConfig it was given, got dict" in message


def test_auto_complete_with_an_invalid_datatype(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.py": """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_input({"name": "X", "data_type": "TYPE_FLOAT", "dims": [1]})
                return config
    """})
    message = load_error(tmp_path, "m")
    assert "auto_complete_config of model 'm' returned an invalid configuration" in message
    assert "TYPE_FLOAT" in message


def test_auto_complete_sees_the_config_and_relative_imports_work(tmp_path):
    write_model(tmp_path, "m", 'max_batch_size: 3\nparameters { key: "k" value { string_value: "v" } }',
                {"1/helper.py": "SIZE = 7\n", "1/model.py": """
        from .helper import SIZE

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                seen = config.as_dict()
                assert seen["name"] == "m", seen
                assert seen["max_batch_size"] == 3, seen
                assert seen["parameters"]["k"]["string_value"] == "v", seen
                config.set_max_batch_size(SIZE)
                return config
    """})
    assert load(tmp_path, "m").config.max_batch_size == 7


def test_auto_complete_disabled_skips_user_code(tmp_path):
    write_model(tmp_path, "m", 'backend: "python"', {"1/model.py": config_fails_model("must not run")})
    config = load(tmp_path, "m", auto_complete=False).config
    assert config.max_batch_size == 0


def test_no_bytecode_is_written_into_the_version_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    write_model(tmp_path, "m", None, {"1/model.py": COMPLETING_MODEL})
    load(tmp_path, "m")
    assert sorted(p.name for p in (tmp_path / "m" / "1").iterdir()) == ["model.py"]


def test_run_auto_complete_directly(tmp_path):
    model_file = write_model(tmp_path, "m", None, {"1/model.py": COMPLETING_MODEL}) / "1" / "model.py"
    completed = run_auto_complete("m", model_file, {"name": "m"}, timeout_s=30)
    assert completed["max_batch_size"] == 8
    assert completed["dynamic_batching"] == {}
    assert [t["name"] for t in completed["input"]] == ["TEXT", "MASK"]


def test_a_python_based_backend_completes_its_models_even_named_as_a_module_python_has(tmp_path):
    """backend: "json": its model.py is imported as "model" (Triton's way), not as json.model."""
    import textwrap

    from tritium.repo import ModelRepository, RepositoryOptions

    backends = tmp_path / "backends"
    (backends / "json").mkdir(parents=True)
    (backends / "json" / "model.py").write_text(textwrap.dedent(COMPLETING_MODEL))
    repo = tmp_path / "repo"
    write_model(repo, "m", 'backend: "json"', {"1/weights.txt": "w"})
    definition = ModelRepository([repo], RepositoryOptions(backend_directory=backends)).load("m")
    assert definition.python_based and definition.runs_python
    assert summary(definition.config.output) == [("SCORE", "TYPE_FP32", [2, 3])]
    assert definition.config.runtime == "model.py"   # as Triton's config says for such a backend


def test_vllms_backend_loads_when_the_backend_directory_has_it_as_a_python_based_one(tmp_path):
    from tritium.repo import ModelRepository, RepositoryOptions

    (tmp_path / "backends" / "vllm").mkdir(parents=True)
    (tmp_path / "backends" / "vllm" / "model.py").write_text(PLAIN_PY_MODEL)
    write_model(tmp_path / "repo", "llm", 'backend: "vllm"', {"1/model.json": "{}"})
    assert "does not support" in load_error(tmp_path / "repo", "llm")
    options = RepositoryOptions(backend_directory=tmp_path / "backends")
    assert ModelRepository([tmp_path / "repo"], options).load("llm").python_based
