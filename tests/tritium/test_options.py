"""The options table: each option declared once, and serve's children accept what serve hands them."""

from __future__ import annotations

import click
import pytest

from tritium.cli import main
from tritium.options import OPTIONS, child_args
from tritium.triton_flags import BOOLEAN

ROLES = ("serve", "broker", "gateway", "worker")


def _command_options(role: str) -> dict[str, click.Option]:
    return {param.name: param for param in main.commands[role].params if isinstance(param, click.Option)}


def test_each_option_is_declared_once_and_every_role_takes_its_rows():
    keys = [option.key for option in OPTIONS]
    assert len(keys) == len(set(keys))
    for role in ROLES:
        declared = set(_command_options(role))
        assert {option.key for option in OPTIONS if role in option.on} <= declared


def test_every_option_has_help_and_booleans_read_as_booleans():
    for role in ROLES:
        for name, param in _command_options(role).items():
            assert param.help, f"{role} --{name} has no help"
            if param.default in ("true", "false"):
                assert param.type is BOOLEAN, f"{role} --{name} takes true/false but reads as {param.type.name}"


def test_serve_only_hands_a_child_options_it_declares():
    for option in OPTIONS:
        assert not option.to or "serve" in option.on, f"{option.names[0]}: serve hands on what it does not take"
        for child in option.to:
            assert child in option.on, f"serve hands {option.names[0]} to {child}, which does not take it"


@pytest.mark.parametrize("child", ["broker", "gateway", "worker"])
def test_a_child_parses_the_flags_serve_builds_to_the_values_serve_got(child):
    serve_args = ["--model-repository", "/models/a", "--model-repository", "/models/b", "--http-port", "9000",
                  "--grpc-port", "9001", "--id", "edge", "--log-verbose", "2", "--log-info", "false",
                  "--disable-auto-complete-config", "--metrics-port", "9002", "--exit-timeout-secs", "7",
                  "--heartbeat-interval-secs", "0.5", "--backend-config", "python,shm-default-byte-size=1",
                  "--model-control-mode", "explicit", "--load-model", "a"]
    serve = main.commands["serve"].make_context("serve", serve_args)
    required = {"broker": ["--frontend", "ipc:///f", "--backend", "ipc:///b"],
                "gateway": ["--broker", "ipc:///f"], "worker": ["--broker", "ipc:///b"]}[child]
    parsed = main.commands[child].make_context(child, [*child_args(serve.params, child), *required]).params
    for option in OPTIONS:
        if child in option.to:
            assert parsed[option.key] == serve.params[option.key], option.names[0]
    expected = {"broker": ("model_repository", ("/models/a", "/models/b")), "gateway": ("server_id", "edge"),
                "worker": ("model_repository", ("/models/a", "/models/b"))}[child]
    assert parsed[expected[0]] == expected[1]


@pytest.mark.parametrize("given", ["EXPLICIT", "Explicit", "explicit"])
def test_model_control_mode_is_read_whatever_its_case_as_triton_reads_it(given):
    serve = main.commands["serve"].make_context("serve", ["--model-repository", "/m", "--model-control-mode", given])
    assert serve.params["model_control_mode"] == "explicit"


@pytest.mark.parametrize("locations, without_a_bucket, refusal", [
    (("s3://bucket/models", "s3://localhost:9000/b/m"), "s3:///", "Invalid bucket name: 's3:///'"),
    (("gs://bucket/models", "gs://other"), "gs://", "No bucket name found in path: gs://"),
    (("as://account/container/models",), "as://account", "Invalid azure storage path: as://account"),
])
def test_a_bucket_s_location_is_a_repository_and_a_malformed_one_a_usage_error(locations, without_a_bucket,
                                                                                     refusal):
    from click.testing import CliRunner

    serve = main.commands["serve"].make_context("serve", [word for location in locations
                                                          for word in ("--model-repository", location)])
    assert serve.params["model_repository"] == locations
    result = CliRunner().invoke(main, ["serve", "--model-repository", without_a_bucket])
    assert result.exit_code == 2
    assert f"'{without_a_bucket}': {refusal}" in " ".join(result.output.split())


def test_a_local_folder_whose_name_holds_a_colon_and_slashes_is_a_folder():
    from tritium.options import REPOSITORY_FOLDER

    assert REPOSITORY_FOLDER.convert("./a://b", None, None) == "./a://b"
    assert REPOSITORY_FOLDER.convert("/data/x://models", None, None) == "/data/x://models"
