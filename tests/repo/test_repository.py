"""Scanning repositories: one broken model never hides the others; duplicates; change detection."""

from __future__ import annotations

import os

import pytest

from tritium.repo import LoadStage, ModelLoadError, ModelRepository, RepositoryOptions, stage_of
from tritium.repo.config_file import MAX_CONFIG_BYTES
from tritium.repo.repository import version_fingerprint
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, identity, write_model

PY = {"1/model.py": PLAIN_PY_MODEL}


def good_models(root):
    write_model(root, "onnx_model", None, {"1/model.onnx": add_sub()})
    write_model(root, "py_model", 'backend: "python"', PY)


def test_every_model_gets_an_entry(tmp_path):
    good_models(tmp_path)
    scan = ModelRepository([tmp_path]).load_all()
    assert sorted(scan.models) == ["onnx_model", "py_model"]
    assert scan.errors == ()
    entry = scan.models["onnx_model"]
    assert entry.ok and entry.error is None
    assert entry.paths == (tmp_path / "onnx_model",)
    assert entry.definition.path == tmp_path / "onnx_model"
    assert entry.definition.config.max_batch_size == 4


def test_hidden_entries_are_skipped(tmp_path):
    good_models(tmp_path)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".DS_Store").write_bytes(b"\x00")
    assert sorted(ModelRepository([tmp_path]).load_all().models) == ["onnx_model", "py_model"]


def test_broken_models_each_get_a_one_line_error_and_the_others_load(tmp_path):
    good_models(tmp_path)
    write_model(tmp_path, "empty")
    (tmp_path / "a_file").write_text("not a model folder")
    write_model(tmp_path, "binary", None, {**PY, "config.pbtxt": b"\x00\x01\x02"})
    huge = write_model(tmp_path, "huge", None, PY)
    with open(huge / "config.pbtxt", "wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 10)
    write_model(tmp_path, "syntax", 'backend: "python"\nmax_batch_size: [\n', PY)
    write_model(tmp_path, "unsupported", None, {"1/model.plan": b"engine"})
    write_model(tmp_path, "ts", 'platform: "pytorch_libtorch"', {"1/model.pt": b"x"})

    scan = ModelRepository([tmp_path]).load_all()
    models = scan.models
    assert models["onnx_model"].ok and models["py_model"].ok
    errors = {name: entry.error for name, entry in models.items() if not entry.ok}
    assert sorted(errors) == ["binary", "empty", "huge", "syntax", "ts", "unsupported"]
    assert "a_file" not in models   # a file beside the models is not one, as in Triton
    for name, error in errors.items():
        assert "\n" not in error, name
        assert str(tmp_path / name) in error, name  # every error says where
    assert errors["empty"] == f"{tmp_path / 'empty'}: model folder is empty"
    assert "binary file" in errors["binary"]
    assert f"{MAX_CONFIG_BYTES + 10} bytes" in errors["huge"]
    assert errors["syntax"].startswith(f"{tmp_path / 'syntax' / 'config.pbtxt'}:2:17: ")
    assert "platform 'tensorrt_plan' (TensorRT)" in errors["unsupported"]
    assert "must list its inputs and outputs" in errors["ts"]


AUTO_COMPLETED_BATCH = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_max_batch_size(8)
            return config

        def execute(self, requests):
            return []
"""


def test_each_failure_says_where_triton_meets_it(tmp_path):
    """The stage decides how a failed model shows (checked side by side with Triton 2.51): a config
    refused while Triton polls the repository, no version to load, or a failure as a version loads."""
    write_model(tmp_path, "syntax", 'backend: "python"\nmax_batch_size: [\n', PY)
    write_model(tmp_path, "unknown_field", 'backend: "python"\nno_such_field: 1', PY)
    write_model(tmp_path, "misnamed", 'name: "other"\nbackend: "python"', PY)
    write_model(tmp_path, "negative", 'backend: "python"\nmax_batch_size: -2', PY)
    # Checked against the config as written, before the model's auto_complete_config raises it to 8.
    write_model(tmp_path, "preferred", 'backend: "python"\ndynamic_batching { preferred_batch_size: [ 4 ] }',
                {"1/model.py": AUTO_COMPLETED_BATCH})
    write_model(tmp_path, "no_version", 'backend: "python"', {"notes/.keep": b""})
    write_model(tmp_path, "latest_zero", 'backend: "python"\nversion_policy { latest { num_versions: 0 } }', PY)
    write_model(tmp_path, "bad_dims", """
        backend: "python"
        input [ { name: "IN", data_type: TYPE_FP32, dims: [ -2 ] } ]""", PY)
    models = ModelRepository([tmp_path]).load_all().models
    stages = {name: stage_of(entry.error) for name, entry in models.items()}
    assert stages == {"syntax": "config", "unknown_field": "config", "misnamed": "config", "negative": "config",
                      "preferred": "config", "no_version": "versions", "latest_zero": "versions", "bad_dims": "load"}
    assert "preferred_batch_size 4 is larger than max_batch_size 0" in models["preferred"].error
    # inputs and outputs are checked as each version loads: the model reads, its versions fail
    assert models["bad_dims"].ok and [bool(info.error and "dimension -2" in info.error)
                                      for info in models["bad_dims"].definition.versions] == [True]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_model_folder(tmp_path):
    good_models(tmp_path)
    locked = write_model(tmp_path, "locked", 'backend: "python"', PY)
    locked.chmod(0)
    try:
        models = ModelRepository([tmp_path]).load_all().models
    finally:
        locked.chmod(0o755)
    assert "Permission denied" in models["locked"].error
    assert models["py_model"].ok


def test_unreadable_model_folder_simulated(tmp_path, monkeypatch):
    """The chmod 000 case for runs as root: listing the model folder fails with EACCES."""
    good_models(tmp_path)
    locked = write_model(tmp_path, "locked", 'backend: "python"', PY)
    path_type = type(locked)
    real_iterdir = path_type.iterdir

    def iterdir(path):
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_iterdir(path)

    monkeypatch.setattr(path_type, "iterdir", iterdir)
    models = ModelRepository([tmp_path]).load_all().models
    assert models["locked"].error == f"{locked}: model folder cannot be read: Permission denied"
    assert models["py_model"].ok and models["onnx_model"].ok


def test_version_that_is_a_file_is_no_version(tmp_path):
    write_model(tmp_path, "m", 'backend: "python"', {"1": "a file where a folder is expected"})
    models = ModelRepository([tmp_path]).load_all().models
    assert models["m"].error == (
        f"{tmp_path / 'm'}: model 'm' has no version folder that its version policy selects "
        "(numeric folders found: none); at least one version must be available under the "
        "version policy")


def test_internal_errors_are_contained_per_model(tmp_path, monkeypatch):
    good_models(tmp_path)
    import tritium.repo.repository as repository

    real_load_model = repository.load_model

    def load_model(name, path, options):
        if name == "py_model":
            raise KeyError("surprise")
        return real_load_model(name, path, options)

    monkeypatch.setattr(repository, "load_model", load_model)
    models = ModelRepository([tmp_path]).load_all().models
    assert models["py_model"].error == "internal error loading model 'py_model': KeyError('surprise')"
    assert models["onnx_model"].ok


def test_repository_that_does_not_exist(tmp_path):
    good_models(tmp_path)
    scan = ModelRepository([tmp_path / "missing", tmp_path]).load_all()
    assert scan.errors == (f"model repository '{tmp_path / 'missing'}' does not exist",)
    assert sorted(scan.models) == ["onnx_model", "py_model"]


def test_repository_that_is_a_file(tmp_path):
    (tmp_path / "repo.txt").write_text("x")
    scan = ModelRepository([tmp_path / "repo.txt"]).load_all()
    assert scan.errors == (f"model repository '{tmp_path / 'repo.txt'}' is not a folder",)
    assert scan.models == {}


def test_several_repositories(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_model(first, "one", None, {"1/model.onnx": identity(dims=(2,))})
    write_model(second, "two", 'backend: "python"', PY)
    models = ModelRepository([first, str(second)]).load_all().models
    assert sorted(models) == ["one", "two"]
    assert models["two"].paths == (second / "two",)


def test_duplicate_model_name_across_repositories(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_model(first, "same", 'backend: "python"', PY)
    write_model(second, "same", 'backend: "python"', PY)
    write_model(second, "other", 'backend: "python"', PY)
    repository = ModelRepository([first, second])
    models = repository.load_all().models
    expected = (f"model 'same' appears in more than one model repository "
                f"({first / 'same'}, {second / 'same'})")
    assert models["same"].error == expected and stage_of(models["same"].error) is LoadStage.CONFIG   # never loaded
    assert models["same"].paths == (first / "same", second / "same")
    assert models["other"].ok
    with pytest.raises(ModelLoadError) as info:
        repository.load("same")
    assert info.value.message == expected


def test_load_one_model_by_name(tmp_path):
    good_models(tmp_path)
    repository = ModelRepository([tmp_path], RepositoryOptions(default_max_batch_size=2))
    assert repository.load("onnx_model").config.max_batch_size == 2
    with pytest.raises(ModelLoadError) as info:
        repository.load("absent")
    assert info.value.message == "model 'absent' is not in the model repository"
    assert info.value.model == "absent"


def test_discover_lists_models_without_loading_them(tmp_path):
    good_models(tmp_path)
    write_model(tmp_path, "broken", "nonsense")
    found, errors = ModelRepository([tmp_path]).discover()
    assert sorted(found) == ["broken", "onnx_model", "py_model"]
    assert errors == ()


def test_options_reach_every_model(tmp_path):
    write_model(tmp_path, "m", 'backend: "python"', {**PY, "configs/big.pbtxt": 'backend: "python" max_batch_size: 9'})
    write_model(tmp_path, "n", None, {"1/model.onnx": add_sub()})
    scan = ModelRepository([tmp_path], RepositoryOptions(model_config_name="big", gpus=(0,))).load_all()
    assert scan.models["m"].definition.config.max_batch_size == 9
    assert scan.models["n"].definition.config.instance_group[0].kind == 1  # KIND_GPU


# -- change detection ----------------------------------------------------------------------

def bump(path, seconds: int = 10):
    """Move a file's mtime, as an edit would, without relying on clock granularity."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 1_000_000_000))


@pytest.fixture
def watched(tmp_path):
    model_dir = write_model(tmp_path, "m", 'backend: "python"', {**PY, "labels.txt": "cat\ndog\n"})
    return ModelRepository([tmp_path]), model_dir


def test_fingerprint_is_stable_without_changes(watched):
    repository, model_dir = watched
    first = repository.fingerprint("m")
    repository.load_all()
    assert repository.fingerprint("m") == first
    assert first[0][0] == str(model_dir)


def test_fingerprint_is_not_changed_by_loading_a_python_model(watched, monkeypatch):
    repository, model_dir = watched
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    (model_dir / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(c):\n"
        "        return c\n")
    before = repository.fingerprint("m")
    assert repository.load_all().models["m"].ok
    (model_dir / "1" / "__pycache__").mkdir(exist_ok=True)  # as a Python instance would leave it
    (model_dir / "__pycache__").mkdir(exist_ok=True)
    assert repository.fingerprint("m") == before


def test_fingerprint_changes_when_the_config_changes(watched):
    repository, model_dir = watched
    before = repository.fingerprint("m")
    (model_dir / "config.pbtxt").write_text('backend: "python" max_batch_size: 2')
    assert repository.fingerprint("m") != before
    before = repository.fingerprint("m")
    bump(model_dir / "config.pbtxt")  # same size, newer
    assert repository.fingerprint("m") != before


def test_fingerprint_changes_when_a_custom_config_changes(watched):
    repository, model_dir = watched
    before = repository.fingerprint("m")
    (model_dir / "configs").mkdir()
    assert repository.fingerprint("m") != before
    before = repository.fingerprint("m")
    (model_dir / "configs" / "h100.pbtxt").write_text("max_batch_size: 1")
    assert repository.fingerprint("m") != before


def test_fingerprint_changes_with_version_folders(watched):
    repository, model_dir = watched
    before = repository.fingerprint("m")
    (model_dir / "2").mkdir()
    added = repository.fingerprint("m")
    assert added != before
    (model_dir / "2" / "model.py").write_text(PLAIN_PY_MODEL)
    filled = repository.fingerprint("m")
    assert filled != added
    bump(model_dir / "2" / "model.py")
    assert repository.fingerprint("m") != filled
    (model_dir / "2" / "model.py").unlink()
    (model_dir / "2").rmdir()
    assert repository.fingerprint("m") == before


def test_fingerprint_changes_with_label_files(watched):
    repository, model_dir = watched
    before = repository.fingerprint("m")
    (model_dir / "labels.txt").write_text("cat\ndog\nbird\n")
    assert repository.fingerprint("m") != before


def test_fingerprint_sees_any_file_at_any_depth(watched):
    repository, model_dir = watched
    (model_dir / "1" / "weights").mkdir()
    (model_dir / "1" / "weights" / "layer.bin").write_bytes(b"1234")
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "sample").write_bytes(b"x")
    before = repository.fingerprint("m")
    bump(model_dir / "1" / "weights" / "layer.bin")
    deep = repository.fingerprint("m")
    assert deep != before
    bump(model_dir / "warmup" / "sample")
    assert repository.fingerprint("m") != deep


def test_version_fingerprint_leaves_out_the_other_versions(watched):
    _, model_dir = watched
    (model_dir / "2").mkdir()
    (model_dir / "2" / "model.py").write_text(PLAIN_PY_MODEL)
    first, second = version_fingerprint(model_dir, 1), version_fingerprint(model_dir, 2)
    bump(model_dir / "2" / "model.py")
    assert version_fingerprint(model_dir, 1) == first
    assert version_fingerprint(model_dir, 2) != second
    bump(model_dir / "labels.txt")            # a file of the whole model: every version's
    assert version_fingerprint(model_dir, 1) != first
    assert {item[0] for item in first} == {"1", "1/model.py", "config.pbtxt", "labels.txt"}


def test_fingerprint_of_other_models_is_untouched(tmp_path):
    write_model(tmp_path, "a", 'backend: "python"', PY)
    write_model(tmp_path, "b", 'backend: "python"', PY)
    repository = ModelRepository([tmp_path])
    before = repository.fingerprint("b")
    (tmp_path / "a" / "config.pbtxt").write_text('backend: "python" max_batch_size: 3')
    (tmp_path / "a" / "7").mkdir()
    assert repository.fingerprint("b") == before


def test_fingerprint_of_an_absent_model(tmp_path):
    assert ModelRepository([tmp_path]).fingerprint("nothing") == ()


LABELLED = '''backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 3 ], label_filename: "labels.txt" } ]
'''


def test_label_files_are_read_for_classification(tmp_path):
    write_model(tmp_path, "labelled", LABELLED, {**PY, "labels.txt": "cat\ndog\n"})
    assert ModelRepository([tmp_path]).load("labelled").labels == {"Y": ("cat", "dog")}


def test_a_missing_label_file_fails_the_model(tmp_path):
    write_model(tmp_path, "labelled", LABELLED, PY)
    with pytest.raises(ModelLoadError) as failure:
        ModelRepository([tmp_path]).load("labelled")
    assert "output 'Y': cannot read label file 'labels.txt'" in str(failure.value)


def test_a_link_at_the_root_that_leads_nowhere_is_still_reported(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "README.md").write_text("not a model")
    models = ModelRepository([tmp_path]).load_all().models
    assert "README.md" not in models
    assert models["dangling"].error.endswith("model folder does not exist")
