"""CURVE between broker, gateways and workers on tcp://: keys, who gets in, who is refused.

One broker with CURVE serves three models. ``add_sub`` and ``bls`` (a Python model that
calls ``add_sub`` through a socket of its own) are served by a worker whose key is
authorized; ``guarded`` is served by no authorized worker, so it becomes ready only if a
refused worker got in after all.
"""

from __future__ import annotations

import re
import shutil
import socket
import stat
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import zmq.auth
from click.testing import CliRunner

from tests import cluster
from tests.models import add_sub_model
from tritium.cli import main

PYTHON_MODELS = Path(__file__).parent / "python_repo"
HEARTBEAT_S = 0.25
HEARTBEATS = ("--heartbeat-interval-secs", str(HEARTBEAT_S))  # a peer whose beats do not get through is soon gone

def generate(directory, name, *flags):
    return CliRunner().invoke(main, ["keys", "generate", str(directory), "--name", name, *flags])


# -- tritium keys generate --------------------------------------------------------------------

def test_keys_generate_writes_a_public_and_a_private_certificate(tmp_path):
    result = generate(tmp_path / "keys", "worker1")
    assert result.exit_code == 0, result.output
    public, secret = tmp_path / "keys" / "worker1.key", tmp_path / "keys" / "worker1.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    public_key, no_secret = zmq.auth.load_certificate(public)
    same_public_key, secret_key = zmq.auth.load_certificate(secret)
    assert no_secret is None and "secret-key" not in public.read_text()
    assert public_key == same_public_key and len(public_key) == 40 and len(secret_key) == 40
    assert public_key.decode() in result.output


def test_keys_generate_refuses_to_overwrite_unless_forced(tmp_path):
    assert generate(tmp_path, "broker").exit_code == 0
    before = (tmp_path / "broker.key_secret").read_bytes()
    refused = generate(tmp_path, "broker")
    assert refused.exit_code == 2
    assert f"refusing to overwrite {tmp_path / 'broker.key'}" in refused.output
    assert (tmp_path / "broker.key_secret").read_bytes() == before
    forced = generate(tmp_path, "broker", "--force")
    assert forced.exit_code == 0, forced.output
    assert (tmp_path / "broker.key_secret").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "broker.key_secret").stat().st_mode) == 0o600


# -- flags that are refused before anything starts ------------------------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Key pairs for every part, and the broker's folder of authorized public keys."""
    folder = tmp_path_factory.mktemp("keys")
    for name in ("broker", "gateway", "worker", "intruder"):
        assert generate(folder, name).exit_code == 0
    authorized = folder / "authorized"
    authorized.mkdir()
    for name in ("gateway", "worker"):
        shutil.copy(folder / f"{name}.key", authorized)
    return folder


@pytest.mark.parametrize("flags, message", [
    (["--curve-secret-key", "{keys}/missing.key_secret", "--curve-server-key", "{keys}/broker.key"],
     "CURVE key file '{keys}/missing.key_secret' does not exist"),
    (["--curve-secret-key", "{keys}/worker.key_secret", "--curve-server-key", "{keys}/nobroker.key"],
     "CURVE key file '{keys}/nobroker.key' does not exist"),
    (["--curve-secret-key", "{keys}/worker.key", "--curve-server-key", "{keys}/broker.key"],
     "CURVE key file '{keys}/worker.key' holds no secret key"),
    (["--curve-secret-key", "{keys}/authorized", "--curve-server-key", "{keys}/broker.key"],
     "CURVE key file '{keys}/authorized' does not exist"),
    (["--curve-secret-key", "{keys}/worker.key_secret"],
     "--curve-secret-key and --curve-server-key go together: give both or neither."),
])
def test_worker_and_gateway_name_the_key_file_they_cannot_use(keys, tmp_path, flags, message):
    flags = [flag.format(keys=keys) for flag in flags]
    for command in (["worker", "--model-repository", str(tmp_path)], ["gateway"]):
        result = CliRunner().invoke(main, [*command, "--broker", "tcp://127.0.0.1:1", *flags])
        assert result.exit_code == 2, result.output
        assert message.format(keys=keys) in result.output


def test_broker_names_the_key_file_or_folder_it_cannot_use(keys, tmp_path):
    base = ["broker", "--model-repository", str(tmp_path), "--frontend", "tcp://127.0.0.1:1",
            "--backend", "tcp://127.0.0.1:2"]
    cases = [
        (["--curve-secret-key", f"{keys}/broker.key_secret", "--curve-authorized-keys", f"{keys}/nowhere"],
         f"CURVE authorized keys folder '{keys}/nowhere' does not exist"),
        (["--curve-secret-key", f"{keys}/broker.key", "--curve-authorized-keys", f"{keys}/authorized"],
         f"CURVE key file '{keys}/broker.key' holds no secret key"),
        (["--curve-authorized-keys", f"{keys}/authorized"],
         "--curve-secret-key and --curve-authorized-keys go together: give both or neither."),
    ]
    for flags, message in cases:
        result = CliRunner().invoke(main, [*base, *flags])
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_a_malformed_key_file_is_named(keys, tmp_path):
    bad = tmp_path / "bad.key_secret"
    bad.write_text('curve\n    public-key = "short"\n    secret-key = "short"\n')
    result = CliRunner().invoke(main, ["gateway", "--broker", "tcp://127.0.0.1:1", "--curve-secret-key", str(bad),
                                       "--curve-server-key", f"{keys}/broker.key"])
    assert result.exit_code == 2
    assert f"CURVE key file '{bad}' holds a malformed key" in result.output


# -- a cluster with CURVE ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def curve_cluster(keys, tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    add_sub_model(repository)
    add_sub_model(repository, name="guarded")
    shutil.copytree(PYTHON_MODELS / "bls", repository / "bls")
    parts = []
    try:
        broker = cluster.broker(repository, "--curve-secret-key", str(keys / "broker.key_secret"),
                                "--curve-authorized-keys", str(keys / "authorized"), *HEARTBEATS)
        parts.append(broker)
        broker.wait_ready()
        client_keys = ("--curve-server-key", str(keys / "broker.key"), *HEARTBEATS)
        parts.append(cluster.worker(broker.backend, repository, "--models", "add_sub,bls",
                                    "--curve-secret-key", str(keys / "worker.key_secret"), *client_keys))
        gateway = cluster.gateway(broker.frontend, "--curve-secret-key", str(keys / "gateway.key_secret"),
                                  *client_keys)
        parts.append(gateway)
        gateway.wait_ready()
        client = httpclient.InferenceServerClient(gateway.url)
        cluster.wait_until(lambda: client.is_model_ready("add_sub") and client.is_model_ready("bls"), 60,
                           what="add_sub and bls ready")
        yield broker, gateway, client, repository
    finally:
        for part in reversed(parts):
            part.kill()


def add_sub_request(client):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    return a, b, result


def test_a_request_is_served_through_curve(curve_cluster):
    broker, _, client, _ = curve_cluster
    time.sleep(4 * HEARTBEAT_S)  # long enough for the broker to drop a peer whose heartbeats are refused
    assert "stopped answering heartbeats" not in broker.logs()
    a, b, result = add_sub_request(client)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert "CURVE: 2 authorized key(s)" in broker.logs()
    assert "refused" not in broker.logs()


def test_a_model_calls_another_through_curve(curve_cluster):
    _, _, client, _ = curve_cluster
    a = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("A", [1, 16], "FP32"), httpclient.InferInput("MODEL", [1], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.array([b"add_sub"], dtype=np.object_))
    np.testing.assert_array_equal(client.infer("bls", inputs).as_numpy("SUM"), a + a)


def test_a_worker_with_a_key_not_authorized_never_joins(curve_cluster, keys):
    broker, _, client, repository = curve_cluster
    intruder_key = zmq.auth.load_certificate(keys / "intruder.key")[0].decode()
    intruder = cluster.worker(broker.backend, repository, "--models", "guarded",
                              "--curve-secret-key", str(keys / "intruder.key_secret"),
                              "--curve-server-key", str(keys / "broker.key"))
    try:
        cluster.wait_until(lambda: intruder_key in broker.logs(), 30, what="the broker's refusal")
        cluster.wait_until(lambda: "refused this worker's CURVE key" in intruder.logs(), 30,
                           what="the worker's refusal")
        assert "refused a client from 127.0.0.1 on " + broker.backend in broker.logs()
        assert f"agent-{socket.gethostname()}-{intruder.pid} joined" not in broker.logs()
        assert not client.is_model_ready("guarded")
        assert intruder.process.poll() is None  # it keeps waiting; its operator reads why in its log
    finally:
        intruder.kill()


def test_a_worker_without_curve_flags_is_refused(curve_cluster):
    broker, _, client, repository = curve_cluster
    plain = cluster.worker(broker.backend, repository, "--models", "guarded")
    try:
        # The broker's hang-up reaches the worker either as the mechanism mismatch or as a reset
        # before the greeting, depending on timing: both name the flags.
        cluster.wait_until(lambda: re.search("requires CURVE: start this worker with --curve-secret-key|"
                                             "if the broker requires CURVE, start this worker with --curve-secret-key",
                                             plain.logs()), 30, what="the worker's explanation")
        cluster.wait_until(lambda: f"refused a client on {broker.backend}: it does not use CURVE" in broker.logs(),
                           30, what="the broker's refusal")
        assert f"agent-{socket.gethostname()}-{plain.pid} joined" not in broker.logs()
        assert not client.is_model_ready("guarded")
    finally:
        plain.kill()


def test_a_gateway_with_the_wrong_server_key_never_gets_the_model_table(curve_cluster, keys):
    broker, _, client, _ = curve_cluster
    stray = cluster.gateway(broker.frontend, "--curve-secret-key", str(keys / "gateway.key_secret"),
                            "--curve-server-key", str(keys / "intruder.key"))
    try:
        with pytest.raises(RuntimeError, match="was not ready within"):
            stray.wait_ready(timeout_s=5)
        assert f"the CURVE handshake with the broker at {broker.frontend} failed" in stray.logs()
        assert f"refused a client on {broker.frontend}: it does not hold this broker's public key" in broker.logs()
        assert stray.logs().count("CURVE handshake with the broker") == 1  # once a minute, not per retry
    finally:
        stray.kill()
    a, b, result = add_sub_request(client)  # the cluster serves on, unharmed
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
