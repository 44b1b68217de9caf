"""Version folders and version policies: latest (default 1), all, specific; missing model files."""

from __future__ import annotations

from tritium.repo.backends import numeric_subdirs
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, load, load_error, write_model


def py_versions(*versions: int) -> dict[str, str]:
    return {f"{v}/model.py": PLAIN_PY_MODEL for v in versions}


def test_numeric_folders_are_versions_and_other_names_are_ignored(tmp_path):
    model_dir = write_model(tmp_path, "m", None, {
        **py_versions(1, 2, 10, 0), "01/model.py": "", "abc/model.py": "", "1a/model.py": "",
        "-1/model.py": "", "configs/x.pbtxt": "", "warmup/data": b"", "3": "a file, not a folder"})
    assert numeric_subdirs(model_dir) == [0, 1, 2, 10]


def test_default_policy_is_latest_one(tmp_path):
    write_model(tmp_path, "m", 'backend: "python"', py_versions(1, 2, 10))
    definition = load(tmp_path, "m")
    assert definition.config.version_policy.WhichOneof("policy_choice") == "latest"
    assert definition.config.version_policy.latest.num_versions == 1
    # Numerically highest: 10, not the lexicographically highest "2".
    assert [v.version for v in definition.versions] == [10]
    assert definition.loadable_versions == (10,)
    assert definition.versions[0].path == tmp_path / "m" / "10"
    assert definition.versions[0].error is None


def test_latest_n(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { latest { num_versions: 2 } }',
                py_versions(1, 2, 3))
    assert load(tmp_path, "m").loadable_versions == (2, 3)


def test_latest_n_larger_than_available(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { latest { num_versions: 5 } }',
                py_versions(4, 7))
    assert load(tmp_path, "m").loadable_versions == (4, 7)


def test_all(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy: { all { } }', py_versions(1, 3, 2))
    assert load(tmp_path, "m").loadable_versions == (1, 2, 3)


def test_specific(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { specific { versions: [1, 3] } }',
                py_versions(1, 2, 3))
    assert load(tmp_path, "m").loadable_versions == (1, 3)


def test_specific_version_without_folder_fails_that_version(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { specific { versions: [1, 4] } }',
                py_versions(1, 2))
    definition = load(tmp_path, "m")
    assert definition.loadable_versions == (1,)
    missing = [v for v in definition.versions if v.error]
    assert [v.version for v in missing] == [4]
    assert missing[0].error == (f"version 4 of model 'm' is listed by the version policy but "
                                f"folder {tmp_path / 'm' / '4'} does not exist")


def test_specific_versions_none_present_fails_the_model(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { specific { versions: [5, 6] } }',
                py_versions(1))
    message = load_error(tmp_path, "m")
    assert "model 'm' has no version folder that its version policy selects" in message
    assert "numeric folders found: [1]" in message
    assert "listed but absent: [5, 6]" in message
    assert "at least one version must be available" in message


def test_no_version_folder_at_all(tmp_path):
    write_model(tmp_path, "m", 'backend: "python"', {"notes.txt": "x"})
    message = load_error(tmp_path, "m")
    assert message.startswith(f"{tmp_path / 'm'}: ")
    assert "numeric folders found: none" in message


def test_version_folder_without_its_model_file(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { all { } }',
                {**py_versions(1), "2/other.py": "x = 1"})
    definition = load(tmp_path, "m")
    assert definition.loadable_versions == (1,)
    (bad,) = [v for v in definition.versions if v.error]
    assert bad.version == 2
    assert bad.error == f"version 2 of model 'm' has no model.py in {tmp_path / 'm' / '2'}"


def test_latest_version_without_model_file_is_not_replaced_by_an_older_one(tmp_path):
    """Triton picks versions by folder, then fails the one without a file."""
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub(), "2/README": "empty"})
    definition = load(tmp_path, "m")
    assert [v.version for v in definition.versions] == [2]
    assert definition.loadable_versions == ()
    assert "version 2 of model 'm' has no model.onnx" in definition.versions[0].error


def test_onnx_model_folder_counts_as_the_model_file(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx/model.onnx": add_sub()})
    definition = load(tmp_path, "m")
    assert definition.loadable_versions == (1,)
    assert definition.config.max_batch_size == 4  # auto-completed from the folder's model.onnx


def test_custom_default_model_filename_is_the_file_looked_for(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" default_model_filename: "main.py"',
                {"1/main.py": PLAIN_PY_MODEL, "2/model.py": PLAIN_PY_MODEL})
    definition = load(tmp_path, "m")
    assert definition.versions[0].error == f"version 2 of model 'm' has no main.py in {tmp_path / 'm' / '2'}"


def test_custom_backends_are_not_checked_for_a_file(tmp_path):
    write_model(tmp_path, "m", 'backend: "my_backend"' + " max_batch_size: 0", {"1/anything.bin": b""})
    assert load(tmp_path, "m").loadable_versions == (1,)


def test_version_policy_latest_zero_is_a_validation_error(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" version_policy { latest { num_versions: 0 } }',
                py_versions(1))
    message = load_error(tmp_path, "m")
    assert "model 'm': version_policy latest must have num_versions >= 1, got 0" in message


def test_version_policy_specific_empty_and_negative(tmp_path):
    write_model(tmp_path, "empty", 'backend: "python" version_policy { specific { } }', py_versions(1))
    assert "version_policy specific must list at least one version" in load_error(tmp_path, "empty")
    write_model(tmp_path, "neg", 'backend: "python" version_policy { specific { versions: [-2] } }',
                py_versions(1))
    assert "version_policy specific lists version -2" in load_error(tmp_path, "neg")
