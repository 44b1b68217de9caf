"""TLS on the gRPC port, as Triton's ``--grpc-use-ssl`` flags ask for it: the server's
certificate and key, and with mutual authentication the root certificate that clients'
certificates must chain to. Both gRPC servers take it: tritium's own (an ``ssl.SSLContext``
under its asyncio transports) and grpc.aio (grpc's server credentials).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from tritium.errors import InvalidArgument


def _no_passphrase() -> bytes:
    """An encrypted key fails to load instead of OpenSSL asking for its passphrase on the terminal."""
    return b""


@dataclass(frozen=True)
class GrpcTls:
    cert_file: str
    key_file: str
    root_file: str | None = None   # the certificates clients' certificates are checked against
    mutual: bool = False           # every client must present a certificate that chains to root_file

    def server_context(self) -> ssl.SSLContext:
        """For tritium's own server; InvalidArgument naming the flag whose file cannot serve. gRPC
        clients require TLS 1.2 or later and ALPN's ``h2``, and HTTP/2 forbids renegotiation
        (RFC 9113, section 9.2.1)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION
        context.set_alpn_protocols(["h2"])
        try:
            context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        except (ssl.SSLError, OSError) as exc:   # an encrypted key: OSError without a terminal to ask on
            raise InvalidArgument(f"--grpc-server-cert '{self.cert_file}' and --grpc-server-key '{self.key_file}' "
                                  f"are not a PEM certificate and its unencrypted private key: {_reason(exc)}") from None
        if self.root_file:
            try:
                context.load_verify_locations(self.root_file)
            except (ssl.SSLError, OSError) as exc:
                raise InvalidArgument(f"--grpc-root-cert '{self.root_file}' is not a PEM certificate: "
                                      f"{_reason(exc)}") from None
        if self.mutual:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def grpcio_credentials(self) -> grpc.ServerCredentials:
        """The same for grpc.aio (``--grpc-server=grpcio``)."""
        root = Path(self.root_file).read_bytes() if self.root_file else None
        pair = (Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes())
        return grpc.ssl_server_credentials([pair], root_certificates=root, require_client_auth=self.mutual)


def tls_from_flags(use_ssl: str | None, use_ssl_mutual: str | None, server_cert: str | None,
                   server_key: str | None, root_cert: str | None) -> GrpcTls | None:
    """Triton's five flags read as Triton reads them (``--grpc-use-ssl-mutual``, true or false,
    turns TLS on; the files are read only when TLS is on), then checked: InvalidArgument naming
    the flag and the file that cannot serve."""
    if use_ssl == "false" and use_ssl_mutual is not None:
        # Triton applies the later of the two; a command line read by click (or a settings file)
        # has no order, and guessing could serve in clear what was meant to be encrypted.
        raise InvalidArgument(f"--grpc-use-ssl=false and --grpc-use-ssl-mutual={use_ssl_mutual} disagree (Triton "
                              "applies whichever comes last): give only the one you mean")
    if use_ssl != "true" and use_ssl_mutual is None:
        return None
    mutual = use_ssl_mutual == "true"
    if not server_cert or not server_key:
        raise InvalidArgument("gRPC over TLS (--grpc-use-ssl) needs --grpc-server-cert and --grpc-server-key")
    if mutual and not root_cert:
        raise InvalidArgument("--grpc-use-ssl-mutual needs --grpc-root-cert, the certificate that clients' "
                              "certificates must chain to")
    for flag, path in (("--grpc-server-cert", server_cert), ("--grpc-server-key", server_key),
                       ("--grpc-root-cert", root_cert)):
        if path:
            _check_readable(flag, path)
    tls = GrpcTls(server_cert, server_key, root_cert or None, mutual)
    tls.server_context()   # the files as the server will load them
    return tls


def _reason(exc: ssl.SSLError | OSError) -> object:
    return getattr(exc, "reason", None) or exc.strerror or exc


def _check_readable(flag: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InvalidArgument(f"{flag} '{path}' cannot be read: {exc.strerror or exc}") from None

