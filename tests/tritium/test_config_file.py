"""Settings from --config FILE and TRITIUM_* variables: precedence, errors, `tritium config show`,
and one `tritium serve --config` run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import pytest
import tritonclient.http as httpclient
from click.testing import CliRunner

from tests.servers import TritiumServer
from tritium.cli import main, serve
from tritium.config_file import SettingsCommand, variables

PYTHON_REPO = Path(__file__).parent.parent / "e2e" / "python_repo"
DEPLOY_CONFIG = Path(__file__).parent.parent.parent / "deploy" / "config"
GATEWAY_FLAGS = ["--broker", "tcp://broker:5555"]


def write(tmp_path: Path, text: str, name: str = "settings.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def show(*args: str, env: dict | None = None) -> dict:
    result = CliRunner().invoke(main, ["config", "show", *args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["settings"]


def refused(*args: str, env: dict | None = None) -> str:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == 2, result.output
    return result.output


# -- sources and precedence --------------------------------------------------------------------

def test_config_show_names_every_source(tmp_path):
    path = write(tmp_path, "broker: tcp://broker:5555\nhttp-port: 9000\n")
    settings = show("gateway", "--config", path, "--id", "edge-1", env={"TRITIUM_GRPC_PORT": "9001"})
    assert settings["broker"] == {"value": "tcp://broker:5555", "source": "file", "from": path}
    assert settings["http-port"] == {"value": 9000, "source": "file", "from": path}
    assert settings["grpc-port"] == {"value": 9001, "source": "env", "from": "TRITIUM_GRPC_PORT"}
    assert settings["id"] == {"value": "edge-1", "source": "flag", "from": None}
    assert settings["http-address"] == {"value": "0.0.0.0", "source": "default", "from": None}


def test_flag_beats_environment_beats_file_beats_default(tmp_path):
    path = write(tmp_path, "http-port: 1001\n")
    env = {"TRITIUM_HTTP_PORT": "1002"}
    assert show("gateway", *GATEWAY_FLAGS)["http-port"]["value"] == 8000
    assert show("gateway", *GATEWAY_FLAGS, "--config", path)["http-port"]["value"] == 1001
    assert show("gateway", *GATEWAY_FLAGS, "--config", path, env=env)["http-port"]["value"] == 1002
    assert show("gateway", *GATEWAY_FLAGS, "--config", path, "--http-port", "1003",
                env=env)["http-port"] == {"value": 1003, "source": "flag", "from": None}


def test_the_config_file_can_come_from_tritium_config(tmp_path):
    path = write(tmp_path, "broker: tcp://elsewhere:5555\n")
    settings = show("gateway", env={"TRITIUM_CONFIG": path})
    assert settings["broker"] == {"value": "tcp://elsewhere:5555", "source": "file", "from": path}


def test_config_show_prints_a_table_and_marks_missing_required_settings(tmp_path):
    path = write(tmp_path, "http-port: 9000\n")
    result = CliRunner().invoke(main, ["config", "show", "gateway", "--config", path])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"tritium gateway settings (config file: {path})"
    assert lines[1].split() == ["broker", "(required,", "not", "set)", "default"]
    assert [line.split() for line in lines if line.startswith("http-port ")] == [["http-port", "9000", "file", path]]


def test_environment_variables_of_other_commands_keys_are_ignored():
    settings = show("gateway", *GATEWAY_FLAGS, env={"TRITIUM_HTTP_WORKERS": "3", "TRITIUM_LOAD_MODEL": "a"})
    assert "http-workers" not in settings and "load-model" not in settings


# -- values of every shape ----------------------------------------------------------------------

def test_lists_from_the_file_and_comma_separated_lists_from_the_environment(tmp_path):
    path = write(tmp_path, "model-repository: [/models/a, /models/b]\nbackend-config: python,shm=1\n")
    settings = show("serve", "--config", path, env={"TRITIUM_METRICS_CONFIG": "histogram_latencies=true, x=1"})
    assert settings["model-repository"]["value"] == ["/models/a", "/models/b"]
    assert settings["backend-config"]["value"] == ["python,shm=1"]  # a scalar is a one-item list
    assert settings["metrics-config"]["value"] == ["histogram_latencies=true", "x=1"]
    flagged = show("serve", "--config", path, "--model-repository", "/other")
    assert flagged["model-repository"] == {"value": ["/other"], "source": "flag", "from": None}


def test_other_long_names_and_models_are_keys_too(tmp_path):
    path = write(tmp_path, "model-store: /models\nmodel-control-mode: explicit\nmodels: [a, b]\n")
    for role in ("serve", "broker"):
        settings = show(role, "--config", path)
        assert settings["model-repository"]["value"] == ["/models"]
        assert settings["load-model"] == {"value": ["a", "b"], "source": "file", "from": path}
    assert show("broker", env={"TRITIUM_MODELS": "c,d"})["load-model"]["value"] == ["c", "d"]


def test_yaml_booleans_set_true_false_options_and_flags(tmp_path):
    path = write(tmp_path, "model-repository: /m\nallow-grpc: false\nexit-on-error: no\n"
                           "disable-auto-complete-config: true\n")
    settings = show("serve", "--config", path)
    assert settings["allow-grpc"]["value"] == "false"
    assert settings["exit-on-error"]["value"] == "false"
    assert settings["disable-auto-complete-config"]["value"] is True
    assert show("serve", "--model-repository", "/m", env={"TRITIUM_DISABLE_AUTO_COMPLETE_CONFIG": "true"}
                )["disable-auto-complete-config"]["value"] is True


def test_an_empty_key_or_file_leaves_the_defaults(tmp_path):
    assert show("gateway", *GATEWAY_FLAGS, "--config", write(tmp_path, ""))["http-port"]["source"] == "default"
    path = write(tmp_path, "http-port:\n", "empty-key.yaml")
    assert show("gateway", *GATEWAY_FLAGS, "--config", path)["http-port"]["source"] == "default"


def test_an_option_added_to_a_command_later_is_settable_from_file_and_environment(tmp_path):
    @click.command(cls=SettingsCommand)
    @click.option("--heartbeat-interval-ms", type=int, default=1000)
    @click.option("--curve-secret-key", "curve_key", default=None)
    def command(heartbeat_interval_ms, curve_key):
        click.echo(f"{heartbeat_interval_ms} {curve_key}")

    path = write(tmp_path, "heartbeat-interval-ms: 250\ncurve-secret-key: /etc/tritium/broker.key\n")
    assert CliRunner().invoke(command, ["--config", path]).output == "250 /etc/tritium/broker.key\n"
    result = CliRunner().invoke(command, ["--config", path], env={"TRITIUM_HEARTBEAT_INTERVAL_MS": "500"})
    assert result.output == "500 /etc/tritium/broker.key\n"


@pytest.mark.parametrize("role", ["broker", "gateway", "worker"])
def test_the_example_production_files_are_accepted(role):
    path = str(DEPLOY_CONFIG / f"{role}.yaml")
    settings = show(role, "--config", path)
    assert settings["model-repository" if role != "gateway" else "http-port"]["source"] == "file"


# -- errors name the key and the file -------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("http_port: 9000\n", "unknown key 'http_port' (did you mean 'http-port'?)"),
    ("config: other.yaml\n", "unknown key 'config'"),
    ("models: [add_sub]\n", "unknown key 'models'"),
    ("http-port: abc\n", "key 'http-port': 'abc' is not a valid integer"),
    ("http-port: 80.5\n", "key 'http-port': expected an integer, not 80.5"),
    ("http-port: true\n", "key 'http-port': expected a single integer value, not a boolean"),
    ("http-port: [8000, 8001]\n", "key 'http-port': takes one value, not a list"),
    ("id: {name: edge}\n", "key 'id': expected a single text value, not a mapping"),
    ("- http-port\n", "a config file is a mapping of keys to values, not a list"),
    ("http-port: [\n", "not valid YAML"),
])
def test_a_bad_file_is_refused_naming_the_key_and_the_file(tmp_path, text, message):
    path = write(tmp_path, text)
    assert f"{path}: {message}" in refused("gateway", *GATEWAY_FLAGS, "--config", path)
    assert f"{path}: {message}" in refused("config", "show", "gateway", "--config", path)


def test_bad_values_in_lists_and_choices_are_refused(tmp_path):
    path = write(tmp_path, "model-repository: [[/a]]\n")
    assert f"{path}: key 'model-repository': each item of the list is one value, not a list" in \
        refused("broker", "--config", path)
    path = write(tmp_path, "model-control-mode: sometimes\n", "mode.yaml")
    assert f"{path}: key 'model-control-mode': 'sometimes' is not one of 'none', 'poll', 'explicit'" in \
        refused("serve", "--config", path)


def test_two_keys_for_one_setting_are_refused(tmp_path):
    path = write(tmp_path, "model-repository: /a\nmodel-store: /b\n")
    assert f"{path}: keys 'model-repository' and 'model-store' set the same setting" in \
        refused("worker", "--config", path)
    path = write(tmp_path, "models: [a]\nload-model: [b]\n", "models.yaml")
    assert f"{path}: keys 'models' and 'load-model' set the same setting" in refused("broker", "--config", path)


def test_a_missing_file_and_bad_environment_values_are_refused(tmp_path):
    missing = str(tmp_path / "absent.yaml")
    assert f"{missing}: cannot read the config file" in refused("gateway", "--config", missing)
    assert "environment variable TRITIUM_HTTP_PORT: 'abc' is not a valid integer" in \
        refused("gateway", *GATEWAY_FLAGS, env={"TRITIUM_HTTP_PORT": "abc"})


def test_settings_from_the_file_meet_the_same_checks_as_flags(tmp_path):
    path = write(tmp_path, "model-repository: /m\nmodels: [a]\n")
    assert "Use of '--load-model' requires setting '--model-control-mode=explicit' as well." in \
        refused("serve", "--config", path)


def test_serve_hands_every_variable_it_reads_to_no_child():
    names = variables(serve)
    assert {"TRITIUM_CONFIG", "TRITIUM_HTTP_PORT", "TRITIUM_MODEL_STORE", "TRITIUM_MODELS",
            "TRITIUM_LOAD_MODEL", "TRITIUM_HTTP_WORKERS"} <= names
    assert "TRITIUM_GPUS" not in names  # read by every part, not a setting of serve


# -- end to end ----------------------------------------------------------------------------------

def test_serve_loads_exactly_the_models_its_config_file_names(tmp_path):
    path = write(tmp_path, "model-control-mode: explicit\nmodels: [py_add_sub]\n")
    with TritiumServer(PYTHON_REPO, "--config", path, env={"TRITIUM_ID": "from-env"}) as server:
        client = httpclient.InferenceServerClient(server.url)
        ready = [m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"]
        assert ready == ["py_add_sub"]
        assert client.get_server_metadata()["name"] == "from-env"  # the gateway child got it as a flag
        a, b = np.arange(16, dtype=np.float32)[None], np.ones((1, 16), dtype=np.float32)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        np.testing.assert_array_equal(client.infer("py_add_sub", inputs).as_numpy("OUTPUT0"), a + b)
