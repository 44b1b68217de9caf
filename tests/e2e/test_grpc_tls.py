"""gRPC over TLS (Triton's --grpc-use-ssl and --grpc-use-ssl-mutual): real clients with the
tests' own certificate authority, against tritium's gRPC server and grpc.aio; clients that
should be refused are, and the server serves on."""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.grpc_requests import add_sub_request, check_add_sub
from tests.e2e.rawhttp import request
from tests.models import add_sub_model
from tests.servers import TritiumServer, free_port
from tests.tls_certs import CertificateAuthority, ed448_self_signed
from tritium.cli import serve


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """Another authority, which the server does not trust and whose certificates it must refuse."""
    return CertificateAuthority(tmp_path_factory.mktemp("stranger"), name="stranger CA")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repo")
    add_sub_model(folder, "add_sub", max_batch_size=8)
    return folder


def _tls_flags(ca: CertificateAuthority, *extra: str) -> tuple[str, ...]:
    pem = ca.server()
    return ("--grpc-server-cert", str(pem.cert), "--grpc-server-key", str(pem.key), *extra)


@pytest.fixture(scope="module")
def server(repo, ca):
    with TritiumServer(repo, "--grpc-use-ssl=true", *_tls_flags(ca)) as running:
        yield running


@pytest.fixture(scope="module")
def mutual_server(repo, ca):
    with TritiumServer(repo, "--grpc-use-ssl-mutual=true", *_tls_flags(ca, "--grpc-root-cert", str(ca.root.cert))) \
            as running:
        yield running


def _channel(url: str, root: CertificateAuthority, client=None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root.root.cert.read_bytes(),
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None)
    return grpc.secure_channel(url, credentials)


def _infer_and_stream(channel: grpc.Channel) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    message, a, b = add_sub_request(rows=3, seed=7)
    check_add_sub(stub.ModelInfer(message, timeout=10), a, b)
    (streamed,) = list(stub.ModelStreamInfer(iter([message]), timeout=10))
    assert streamed.error_message == ""
    check_add_sub(streamed.infer_response, a, b)


def test_tritonclient_over_tls_infers_and_the_http_port_stays_plain(server, ca):
    client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(ca.root.cert))
    assert client.is_server_ready() and client.is_model_ready("add_sub")
    a = [[1.0] * 16, [2.0] * 16]
    inputs = [grpcclient.InferInput(name, [2, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.array(a, dtype=np.float32))
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array(a, dtype=np.float32) * 2)
    client.close()
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200   # TLS is gRPC's only, as in Triton


def test_unary_and_streaming_calls_over_tls(server, ca):
    with _channel(server.grpc_url, ca) as channel:
        _infer_and_stream(channel)


def test_a_plaintext_client_or_one_that_does_not_trust_the_server_fails_and_the_server_serves_on(server, ca, stranger):
    plain = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        plain.is_server_live(client_timeout=5)
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    plain.close()
    with _channel(server.grpc_url, stranger) as channel:
        with pytest.raises(grpc.RpcError) as untrusted:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
        assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    with _channel(server.grpc_url, ca) as channel:
        _infer_and_stream(channel)
    assert "Traceback" not in server.logs()
    assert "serving gRPC on 127.0.0.1:%d over TLS\n" % server.grpc_port in server.logs()


def test_mutual_tls_needs_a_client_certificate_from_the_root(mutual_server, ca, stranger):
    for client in (None, stranger.client("outsider")):
        with _channel(mutual_server.grpc_url, ca, client) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(),
                                                                              timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with _channel(mutual_server.grpc_url, ca, ca.client()) as channel:
        _infer_and_stream(channel)
    client_pem = ca.client("tritonclient")
    client = grpcclient.InferenceServerClient(mutual_server.grpc_url, ssl=True, root_certificates=str(ca.root.cert),
                                              private_key=str(client_pem.key),
                                              certificate_chain=str(client_pem.cert))
    assert client.is_server_live()
    client.close()


def test_grpcio_serves_tls_too(repo, ca):
    flags = _tls_flags(ca, "--grpc-root-cert", str(ca.root.cert))
    with TritiumServer(repo, "--grpc-server=grpcio", "--grpc-use-ssl-mutual=true", *flags) as running:
        with _channel(running.grpc_url, ca, ca.client()) as channel:
            _infer_and_stream(channel)
        with _channel(running.grpc_url, ca) as channel:   # no client certificate
            with pytest.raises(grpc.RpcError):
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(),
                                                                              timeout=5)


def _serve_usage_error(tmp_path, *flags: str) -> str:
    result = CliRunner().invoke(serve, ["--model-repository", str(tmp_path), *flags], prog_name="tritonserver")
    assert result.exit_code == 2, result.output
    return result.output


def test_files_that_cannot_serve_tls_are_usage_errors_naming_flag_and_file(tmp_path, ca):
    pem = ca.server("checked")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    output = _serve_usage_error(tmp_path, "--grpc-use-ssl=true", "--grpc-server-cert", str(garbage),
                                "--grpc-server-key", str(pem.key))
    assert (f"--grpc-server-cert '{garbage}' and --grpc-server-key '{pem.key}' are not a PEM certificate and its "
            "unencrypted private key") in output
    output = _serve_usage_error(tmp_path, "--grpc-use-ssl=true", "--grpc-server-cert", str(pem.cert),
                                "--grpc-server-key", str(pem.key), "--grpc-root-cert", str(garbage))
    assert f"--grpc-root-cert '{garbage}' is not a PEM certificate" in output
    output = _serve_usage_error(tmp_path, "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(pem.cert),
                                "--grpc-server-key", str(pem.key))
    assert "--grpc-use-ssl-mutual needs --grpc-root-cert" in output



def test_credentials_grpcio_cannot_use_stop_its_gateway_with_a_line_that_names_them(tmp_path):
    """OpenSSL (the flags' check) loads an Ed448 certificate; gRPC's BoringSSL does not: the
    gateway says so and exits, instead of blaming the port."""
    pem = ed448_self_signed(tmp_path)
    port = free_port()
    gateway = subprocess.run(
        [sys.executable, "-m", "tritium.cli", "gateway", "--broker", f"ipc://{tmp_path}/no-broker",
         "--allow-http", "false", "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--grpc-server", "grpcio",
         "--grpc-use-ssl", "true", "--grpc-server-cert", str(pem.cert), "--grpc-server-key", str(pem.key)],
        capture_output=True, text=True, timeout=60)
    assert gateway.returncode == 1
    assert (f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{port}' cannot serve TLS: grpc refused "
            f"--grpc-server-cert '{pem.cert}' or --grpc-server-key '{pem.key}'") in gateway.stderr
