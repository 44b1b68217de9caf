"""Model names and the load API's file paths: what may be written, and where."""

from __future__ import annotations

import pytest

from tritium.repo.errors import ModelLoadError
from tritium.repo.names import NOT_A_NAME, name_problem, relative_file_problem, require_name, write_files
from tritium.errors import InvalidArgument


@pytest.mark.parametrize("name", ["add_sub", "a.b", ".hidden", "model-1", "模型", "a b", "..."])
def test_folder_names_are_model_names(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "..", ".", "x\0y", "a\nb", "a\\b", "a\x7fb", "a\tb"])
def test_paths_and_control_characters_are_not_model_names(name):
    assert name_problem(name) == NOT_A_NAME


@pytest.mark.parametrize("name", ["", None, 3])
def test_an_empty_or_non_text_name_is_refused(name):
    assert name_problem(name) == "a model name cannot be empty"


def test_load_and_unload_refuse_a_path_with_their_own_text():
    with pytest.raises(InvalidArgument) as load:
        require_name("../x", "load")
    assert load.value.message == f"failed to load '../x', failed to poll from model repository: {NOT_A_NAME}"
    with pytest.raises(InvalidArgument) as unload:
        require_name("../x", "unload")
    assert unload.value.message == f"failed to unload '../x': {NOT_A_NAME}"
    require_name("fine", "load")


@pytest.mark.parametrize("path", ["1/model.py", "1/sub/weights.bin", "12/model.onnx"])
def test_version_relative_paths_are_accepted(path):
    assert relative_file_problem(path) is None


@pytest.mark.parametrize("path", ["1/../../x", "/etc/passwd", "1/a\\b", "1/\0x", "1/./x", "../1/x", "", "1//x/.."])
def test_paths_that_could_leave_the_model_folder_are_refused(path):
    assert relative_file_problem(path).startswith("must be a relative path inside the model folder")


@pytest.mark.parametrize("path", ["model.py", "v1/model.py", "config.pbtxt"])
def test_files_outside_a_version_folder_are_refused(path):
    assert relative_file_problem(path) == "must be <version>/<file name> inside the model"


def test_files_are_written_below_the_load_folder(tmp_path):
    model_dir = write_files(tmp_path, "m", {"1/model.py": b"code", "1/sub/w.bin": b"\1"})
    assert model_dir == tmp_path / "m"
    assert (model_dir / "1" / "model.py").read_bytes() == b"code"
    assert (model_dir / "1" / "sub" / "w.bin").read_bytes() == b"\1"


def test_a_leading_slash_is_below_the_model_folder_as_in_triton(tmp_path):
    model_dir = write_files(tmp_path, "m", {"/1/model.py": b"code", "//2/model.py": b"two"})
    assert (model_dir / "1" / "model.py").read_bytes() == b"code"
    assert (model_dir / "2" / "model.py").read_bytes() == b"two"
    with pytest.raises(ModelLoadError) as failure:
        write_files(tmp_path, "n", {"/../1/model.py": b"x"})
    assert failure.value.detail.startswith("failed to load 'n': file override 'file:/../1/model.py' must be a relative")


def test_a_link_on_the_way_out_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    load_dir = tmp_path / "load"
    (load_dir / "m").mkdir(parents=True)
    (load_dir / "m" / "1").symlink_to(outside)
    with pytest.raises(ModelLoadError) as failure:
        write_files(load_dir, "m", {"1/model.py": b"x"})
    assert failure.value.detail == "failed to load 'm': file override 'file:1/model.py' leaves the model folder"
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["../victim", "/abs"])
def test_a_hostile_name_writes_nothing(tmp_path, name):
    load_dir = tmp_path / "a" / "b"
    load_dir.mkdir(parents=True)
    with pytest.raises(ModelLoadError):
        write_files(load_dir, name, {"1/model.py": b"x"})
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
