"""CurveZMQ on the sockets between gateways, broker, host agents and instances.

With CURVE the broker's two ROUTER sockets are CURVE servers and every peer is a
CURVE client: traffic is encrypted, each client proves it holds the secret key of a
public key the broker knows, and each client checks it reached the real broker. The
broker decides who may connect with a ZAP handler (ZeroMQ's authentication hook, a
thread of this process) that lets in the public keys found in one folder.

Everything CURVE needs is here, so that each place that makes a socket adds one line:
``secure_server`` (broker) or ``secure_client`` (everyone else). Key files are ZeroMQ's
certificate format (``zmq.auth``): ``NAME.key`` holds the public key and is handed out;
``NAME.key_secret`` holds both keys and stays on its host.

A refused handshake is silent in ZeroMQ: the peer just never answers. So both ends watch
their socket's monitor events and say why in the log, once a minute at most per cause.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import zmq
import zmq.auth
from zmq.utils import z85

from tritium.errors import InvalidArgument

log = logging.getLogger(__name__)

_ZAP_ENDPOINT = "inproc://zeromq.zap.01"   # where libzmq looks for the ZAP handler
_REPEAT_S = 60.0                           # one log line per cause and peer per minute
_LOOPBACK = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:")


@dataclass(frozen=True)
class CurveKeys:
    """The key files one process uses; ``None`` in its settings means no CURVE."""

    secret_key_file: str                      # this process's own NAME.key_secret
    server_key_file: str | None = None        # clients: the broker's public NAME.key
    authorized_keys_dir: str | None = None    # broker: folder of the public keys let in

    def check(self) -> None:
        """Load every file now, so that a bad path fails at startup with its name."""
        load_secret_key(self.secret_key_file)
        if self.server_key_file is not None:
            load_public_key(self.server_key_file)
        if self.authorized_keys_dir is not None:
            _authorized_folder(self.authorized_keys_dir)

    def as_spec(self) -> dict:
        """The file paths (never the keys) for a child process's JSON spec."""
        return asdict(self)

    @classmethod
    def from_spec(cls, spec: dict | None) -> CurveKeys | None:
        return cls(**spec) if spec else None


# -- key files ----------------------------------------------------------------------------

def generate_keys(directory: str | os.PathLike, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (0600) into ``directory``."""
    folder = Path(directory)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    existing = [str(path) for path in (public, secret) if path.exists()]
    if existing and not force:
        raise InvalidArgument(f"refusing to overwrite {' and '.join(existing)} (use --force to replace)")
    folder.mkdir(parents=True, exist_ok=True)
    for path in (public, secret):
        path.unlink(missing_ok=True)
    previous = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(previous)
    public.chmod(0o644)
    secret.chmod(0o600)
    return public, secret


def load_secret_key(path: str) -> tuple[bytes, bytes]:
    """(public, secret) from a NAME.key_secret file."""
    public, secret = _load_certificate(path)
    if secret is None:
        raise InvalidArgument(f"CURVE key file '{path}' holds no secret key "
                              "(give the NAME.key_secret file, not NAME.key)")
    return public, secret


def load_public_key(path: str) -> bytes:
    return _load_certificate(path)[0]


def _load_certificate(path: str) -> tuple[bytes, bytes | None]:
    if not os.path.isfile(path):
        raise InvalidArgument(f"CURVE key file '{path}' does not exist")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except ValueError:
        raise InvalidArgument(f"CURVE key file '{path}' holds no public key: not a ZeroMQ certificate") from None
    except (OSError, UnicodeError) as exc:
        raise InvalidArgument(f"cannot read CURVE key file '{path}': {exc}") from None
    for key in (public, secret):
        if key is not None and not _valid_key(key):
            raise InvalidArgument(f"CURVE key file '{path}' holds a malformed key (expected 40 Z85 characters)")
    return public, secret


def _valid_key(key: bytes) -> bool:
    try:
        return len(key) == 40 and len(z85.decode(key)) == 32
    except (KeyError, ValueError, IndexError):
        return False


def _authorized_folder(path: str) -> dict[bytes, str]:
    """Public key -> file name, for every readable NAME.key in the folder."""
    if not os.path.isdir(path):
        raise InvalidArgument(f"CURVE authorized keys folder '{path}' does not exist")
    keys = {}
    for file in sorted(Path(path).glob("*.key")):
        try:
            keys[load_public_key(str(file))] = file.name
        except InvalidArgument as exc:
            log.warning("ignoring an authorized key: %s", exc.message)
    return keys


# -- sockets --------------------------------------------------------------------------------

def secure_server(sock: zmq.Socket, keys: CurveKeys | None, address: str) -> None:
    """Make a broker socket a CURVE server that lets in only the authorized keys."""
    if keys is None:
        if address.startswith("tcp://") and not address.startswith(_LOOPBACK):
            log.warning("%s is open to the network without CURVE: anyone who reaches it can join "
                        "(see --curve-secret-key in docs/security.md)", address)
        return
    if keys.authorized_keys_dir is None:
        raise InvalidArgument("a CURVE server needs the folder of the keys it lets in")
    public, secret = load_secret_key(keys.secret_key_file)
    _ZapHandler.start_for(sock.context, keys.authorized_keys_dir)
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.zap_domain = address.encode()[:254]      # ZAP names the socket a refused peer tried
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)    # no ZAP handler means nobody gets in, not everybody
    _watch(sock, _ServerEvents(address))


def secure_client(sock: zmq.Socket, keys: CurveKeys | None, who: str) -> None:
    """Make a socket to the broker a CURVE client (when ``keys``), and report refusals.

    ``who`` names this process in log lines ("worker", "gateway", ...). Without keys the
    socket is only watched, to explain a broker that wants CURVE.
    """
    if keys is not None:
        if keys.server_key_file is None:
            raise InvalidArgument(f"a CURVE {who} needs the broker's public key")
        sock.curve_publickey, sock.curve_secretkey = load_secret_key(keys.secret_key_file)
        sock.curve_serverkey = load_public_key(keys.server_key_file)
    _watch(sock, _ClientEvents(who, keys is not None))


# -- the broker's ZAP handler --------------------------------------------------------------

class _ZapHandler(threading.Thread):
    """Answers libzmq's ZAP requests: a CURVE client is in when its key is in the folder.

    The folder is read again whenever its files change, so that a new host's key works
    at once, without restarting the broker or sending it a signal.
    """

    _running: dict[int, _ZapHandler] = {}
    _lock = threading.Lock()

    def __init__(self, context: zmq.Context, folder: str) -> None:
        super().__init__(name="zap-handler", daemon=True)
        self.folder = folder
        self.keys: dict[bytes, str] = {}
        self.signature: tuple | None = None
        self.sock = context.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(_ZAP_ENDPOINT)
        self.throttle = _Throttle()
        self._refresh()
        if not self.keys:
            log.warning("no public key in %s: every gateway and worker will be refused", folder)

    @classmethod
    def start_for(cls, context: zmq.Context, folder: str) -> None:
        with cls._lock:
            if id(context) not in cls._running:
                handler = cls._running[id(context)] = cls(context, folder)
                handler.start()

    def run(self) -> None:
        while True:
            try:
                request = self.sock.recv_multipart()
            except zmq.ZMQError:
                return  # the context is going away
            self.sock.send_multipart(self._answer(request))

    def _answer(self, request: list[bytes]) -> list[bytes]:
        version, request_id, domain, address, _identity, mechanism, *credentials = request
        key = z85.encode(credentials[0]) if mechanism == b"CURVE" and credentials else None
        self._refresh()
        if key is not None and key in self.keys:
            return [version, request_id, b"200", b"OK", self.keys[key].encode(), b""]
        if self.throttle.due((address, domain)):
            log.warning("refused a client from %s on %s: its CURVE public key %s is not in %s",
                        address.decode(errors="replace"), domain.decode(errors="replace"),
                        key.decode() if key else f"(none: {mechanism.decode(errors='replace')})", self.folder)
        return [version, request_id, b"400", b"public key not authorized", b"", b""]

    def _refresh(self) -> None:
        try:
            signature = tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(self.folder))
        except OSError:
            signature = ()
        if signature != self.signature:
            self.signature = signature
            try:
                self.keys = _authorized_folder(self.folder)
            except InvalidArgument as exc:
                log.error("%s; refusing every client until it is back", exc.message)
                self.keys = {}
            log.info("CURVE: %d authorized key(s) in %s", len(self.keys), self.folder)


# -- explaining failed handshakes ---------------------------------------------------------

_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_MECHANISM_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
_monitors = itertools.count(1)
_PROTOCOL_ERRORS = {getattr(zmq, name): name for name in dir(zmq) if name.startswith("PROTOCOL_ERROR_")}


class _Throttle:
    """True at most once per ``interval_s`` for each key: no log flood from a retrying peer."""

    def __init__(self, interval_s: float = _REPEAT_S) -> None:
        self.interval_s = interval_s
        self.last: dict = {}

    def due(self, key) -> bool:
        now = time.monotonic()
        if now - self.last.get(key, -self.interval_s) < self.interval_s:
            return False
        self.last[key] = now
        return True


class _ServerEvents:
    """The broker's view of handshakes that fail before ZAP (which logs its own refusals)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.throttle = _Throttle()

    def __call__(self, event: int, value: int, endpoint: str) -> None:
        if event not in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return  # success, or a ZAP refusal, which the ZAP handler logged with the peer's address
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL or value == _MECHANISM_MISMATCH:
            # A client without CURVE sees the mismatch too, and often hangs up before we do.
            why = "it does not use CURVE (start it with --curve-secret-key and --curve-server-key)"
        elif value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            why = "it does not hold this broker's public key (check its --curve-server-key)"
        else:
            why = f"its CURVE handshake failed ({_PROTOCOL_ERRORS.get(value, value)})"
        # ZeroMQ reports no peer address for a handshake that fails this early.
        if self.throttle.due(why):
            log.warning("refused a client on %s: %s", self.address, why)


class _ClientEvents:
    """A gateway's, agent's or instance's view of the broker refusing its handshake."""

    def __init__(self, who: str, curve: bool) -> None:
        self.who, self.curve = who, curve
        self.throttle = _Throttle()
        self.failed = False

    def __call__(self, event: int, value: int, endpoint: str) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self.failed and self.curve:
                log.info("the broker at %s accepted this %s's CURVE key", endpoint, self.who)
            self.failed = False
            return
        self.failed = True
        why = self._why(event, value, endpoint)
        if self.throttle.due(why):
            log.error("%s", why)

    def _why(self, event: int, value: int, endpoint: str) -> str:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the broker at {endpoint} refused this {self.who}'s CURVE key (ZAP status {value}): add its "
                    f"public key to the broker's --curve-authorized-keys folder, then restart this {self.who}")
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            if self.curve:
                return f"the broker at {endpoint} does not use CURVE, but this {self.who} was given CURVE keys"
            return (f"the broker at {endpoint} requires CURVE: start this {self.who} with "
                    "--curve-secret-key and --curve-server-key")
        if self.curve:
            return (f"the CURVE handshake with the broker at {endpoint} failed (is --curve-server-key "
                    "the broker's public key?); retrying")
        # A broker that requires CURVE often hangs up before its greeting reaches us (a reset,
        # not the mechanism mismatch), and may do so on every retry.
        detail = f" ({os.strerror(value)})" if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value > 0 else ""
        return (f"the handshake with the broker at {endpoint} failed{detail}: "
                f"if the broker requires CURVE, start this {self.who} with --curve-secret-key and "
                "--curve-server-key; retrying")


def broker_refusals(who: str) -> Callable[[str, Exception], None]:
    """What a DEALER that speaks ZMTP itself (tritium/zmtp.py) calls when the broker refuses
    its handshake: the same log lines as a libzmq socket's monitor gives, as often."""
    events = _ClientEvents(who, curve=False)

    def report(endpoint: str, exc: Exception) -> None:
        if getattr(exc, "mechanism", "") == "CURVE":
            events(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, _MECHANISM_MISMATCH, endpoint)
            return
        why = (f"the handshake with the broker at {endpoint} failed: {exc} (if it does, start this {who} "
               "with --curve-secret-key and --curve-server-key); retrying")
        if events.throttle.due(why):
            log.error("%s", why)

    return report


def client_refusals(address: str) -> Callable[[str, Exception], None]:
    """What a ROUTER that speaks ZMTP itself calls when it refuses a client's handshake."""
    throttle = _Throttle()

    def report(endpoint: str, exc: Exception) -> None:
        why = ("it uses CURVE, which this broker does not (start the broker with --curve-secret-key)"
               if getattr(exc, "mechanism", "") == "CURVE" else str(exc))
        if throttle.due(why):
            log.warning("refused a client on %s: %s", address, why)

    return report


def _watch(sock: zmq.Socket, handle) -> None:
    """Pass the socket's handshake events to ``handle`` from a thread, until the socket closes."""
    # An address of our own: pyzmq's default reuses the socket's descriptor number, which a
    # socket made after this one closes may get again.
    address = f"inproc://tritium-monitor-{os.getpid()}-{next(_monitors)}"
    monitor = sock.get_monitor_socket(_FAILURES | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED, address)
    threading.Thread(target=_read_events, args=(monitor, handle), name="zmq-monitor", daemon=True).start()


def _read_events(monitor: zmq.Socket, handle) -> None:
    try:
        # Imported here: pyzmq's monitor module imports asyncio (~30 ms), which a process whose
        # links speak ZMTP themselves (every local instance) never needs.
        from zmq.utils.monitor import recv_monitor_message

        while True:
            message = recv_monitor_message(monitor)
            event = int(message["event"])
            if event == zmq.EVENT_MONITOR_STOPPED:
                return
            try:
                handle(event, int(message["value"]), message["endpoint"].decode(errors="replace"))
            except Exception:
                log.exception("cannot report a handshake event")
    except zmq.ZMQError:
        return  # the context was terminated
    finally:
        monitor.close(0)  # the context's term() waits for this socket too
