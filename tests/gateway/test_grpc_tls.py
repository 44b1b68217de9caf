"""How Triton's five TLS flags combine (tritium/gateway/grpc_tls.py): which turn TLS on, when
mutual authentication applies, and that the files are read only when TLS is on."""

from __future__ import annotations

import pytest

from tests.tls_certs import CertificateAuthority
from tritium.errors import InvalidArgument
from tritium.gateway.grpc_tls import GrpcTls, tls_from_flags


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.mark.parametrize("use_ssl, mutual_flag, on, mutual", [
    (None, None, False, False),
    ("false", None, False, False),
    ("true", None, True, False),
    ("true", "false", True, False),
    ("true", "true", True, True),
    (None, "true", True, True),
    (None, "false", True, False),     # Triton: the mutual flag, true or false, sets use_ssl
])
def test_which_flags_turn_tls_on(ca, use_ssl, mutual_flag, on, mutual):
    pem = ca.server()
    tls = tls_from_flags(use_ssl, mutual_flag, str(pem.cert), str(pem.key), str(ca.root.cert))
    assert tls == (GrpcTls(str(pem.cert), str(pem.key), str(ca.root.cert), mutual) if on else None)


def test_files_are_not_read_while_tls_is_off():
    assert tls_from_flags("false", None, "/nowhere.pem", "/nowhere.key", "/nowhere-root.pem") is None


def test_a_missing_file_is_named_with_its_flag(ca):
    pem = ca.server()
    with pytest.raises(InvalidArgument) as refused:
        tls_from_flags("true", None, str(pem.cert), str(pem.key), "/nowhere-root.pem")
    assert refused.value.message == "--grpc-root-cert '/nowhere-root.pem' cannot be read: No such file or directory"


def test_the_context_offers_h2_and_asks_for_client_certificates_only_when_mutual(ca):
    import ssl

    pem = ca.server()
    plain = GrpcTls(str(pem.cert), str(pem.key)).server_context()
    mutual = GrpcTls(str(pem.cert), str(pem.key), str(ca.root.cert), mutual=True).server_context()
    assert (plain.verify_mode, mutual.verify_mode) == (ssl.CERT_NONE, ssl.CERT_REQUIRED)
    assert plain.minimum_version == ssl.TLSVersion.TLSv1_2
    assert plain.options & ssl.OP_NO_RENEGOTIATION


@pytest.mark.parametrize("mutual_flag", ["true", "false"])
def test_use_ssl_false_with_the_mutual_flag_is_refused_as_their_order_decides_in_triton(ca, mutual_flag):
    pem = ca.server()
    with pytest.raises(InvalidArgument) as refused:
        tls_from_flags("false", mutual_flag, str(pem.cert), str(pem.key), str(ca.root.cert))
    assert refused.value.message == (f"--grpc-use-ssl=false and --grpc-use-ssl-mutual={mutual_flag} disagree "
                                     "(Triton applies whichever comes last): give only the one you mean")


def test_an_encrypted_key_is_refused_without_asking_for_its_passphrase(ca, tmp_path):
    from cryptography.hazmat.primitives import serialization

    pem = ca.server()
    key = serialization.load_pem_private_key(pem.key.read_bytes(), None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(InvalidArgument) as refused:
        tls_from_flags("true", None, str(pem.cert), str(locked), None)
    assert refused.value.message.startswith(f"--grpc-server-cert '{pem.cert}' and --grpc-server-key '{locked}' are "
                                            "not a PEM certificate and its unencrypted private key: ")


def test_files_gone_by_the_time_the_gateway_binds_stop_it_with_one_line(ca, tmp_path):
    from tritium.gateway.grpc_api import GrpcInferenceService
    from tritium.gateway.grpc_server import bind_grpc_tritium
    from tritium.ports import PortInUse

    pem = ca.server()
    root = tmp_path / "root.pem"
    root.write_text("not a certificate")   # checked when the flags were read, replaced since
    with pytest.raises(PortInUse) as refused:
        bind_grpc_tritium(GrpcInferenceService(None), "127.0.0.1", 0, tls=GrpcTls(str(pem.cert), str(pem.key), str(root)))
    assert str(refused.value).startswith(f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:0' cannot serve "
                                         f"TLS: --grpc-root-cert '{root}' is not a PEM certificate: ")
