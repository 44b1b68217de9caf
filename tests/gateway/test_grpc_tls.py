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
    ("false", "true", False, False),  # Triton takes the later of the two; tritium lets false win
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
