"""A certificate authority of the tests' own, and certificates it signs, as PEM files: what a
server and its clients need for gRPC over TLS, made fresh for each test module."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | ed448.Ed448PrivateKey,
           ) -> Pem:
    pem = Pem(folder / f"{stem}.pem", folder / f"{stem}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return pem


class CertificateAuthority:
    def __init__(self, folder: Path, name: str = "tritium test CA") -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(hours=1))
                      .not_valid_after(now + datetime.timedelta(days=1))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.root = _write(folder, name.replace(" ", "_"), self._cert, self._key)

    def server(self, stem: str = "server") -> Pem:
        """For a server at localhost or 127.0.0.1."""
        names = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        return self._issue(stem, names, ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, stem: str = "client") -> Pem:
        return self._issue(stem, x509.SubjectAlternativeName([x509.DNSName(stem)]), ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(self, stem: str, names: x509.SubjectAlternativeName, usage: x509.ObjectIdentifier) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(self._cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(names, critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(self._key, hashes.SHA256()))
        return _write(self.folder, stem, cert, key)


def ed448_self_signed(folder: Path) -> Pem:
    """A certificate OpenSSL loads and gRPC's own TLS library (BoringSSL) refuses: its key is Ed448."""
    key = ed448.Ed448PrivateKey.generate()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(_name("localhost"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, None))
    return _write(folder, "ed448", cert, key)
