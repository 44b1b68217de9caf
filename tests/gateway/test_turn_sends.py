"""A turn's writes sent in one system call: the io_uring itself (``SendRing``) on real sockets,
and ``TurnSends`` on a real event loop with real TCP connections, their clients reading what
arrives."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import socket
import ssl

import pytest
import uvloop

from tests.tls_certs import CertificateAuthority
from tritium.gateway.send_ring import SendRing
from tritium.gateway.turn_sends import HELD_BYTES, TurnSends, ring_socket

RING = SendRing.open()
needs_ring = pytest.mark.skipif(RING is None, reason="this kernel (or its sandbox) offers no io_uring")


def address_of(buffer: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


@needs_ring
def test_one_call_sends_to_many_sockets_each_its_bytes():
    pairs = [socket.socketpair() for _ in range(5)]
    buffer = bytearray(b"".join(b"answer %d;" % i for i in range(5)))
    address = address_of(buffer)
    try:
        results = RING.send([(ours.fileno(), address + 9 * i, 9) for i, (ours, _) in enumerate(pairs)])
        assert results == [9] * 5
        assert [theirs.recv(100) for _, theirs in pairs] == [b"answer %d;" % i for i in range(5)]
    finally:
        for pair in pairs:
            for end in pair:
                end.close()


@needs_ring
def test_a_send_without_room_says_eagain_at_once_and_sends_nothing():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        filled = 0
        while True:
            try:
                filled += ours.send(b"x" * 65536)
            except BlockingIOError:
                break
        buffer = bytearray(b"y" * 100)
        assert RING.send([(ours.fileno(), address_of(buffer), 100)]) == [-errno.EAGAIN]
        received = 0
        theirs.setblocking(False)
        try:
            while True:
                received += len(theirs.recv(1 << 20))
        except BlockingIOError:
            pass
        assert received == filled   # the refused send added nothing
    finally:
        ours.close()
        theirs.close()


@needs_ring
def test_a_large_send_to_a_slow_reader_says_how_much_went():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            buffer = bytearray(4 << 20)
            (sent,) = RING.send([(ours.fileno(), address_of(buffer), len(buffer))])
            assert 0 < sent < len(buffer)
        finally:
            client.close()
            ours.close()


@needs_ring
def test_failures_come_back_per_send_and_a_gone_peer_raises_no_sigpipe():
    ours, theirs = socket.socketpair()
    theirs.close()
    alive, other = socket.socketpair()
    buffer = bytearray(b"hello")
    try:
        results = RING.send([(ours.fileno(), address_of(buffer), 5), (alive.fileno(), address_of(buffer), 5)])
        assert results == [-errno.EPIPE, 5]   # the process is still here: MSG_NOSIGNAL
        assert other.recv(10) == b"hello"
    finally:
        for end in (ours, alive, other):
            end.close()


class Connections:
    """A TCP server on a real loop, ``count`` clients connected to it, and the server side's
    transports, whose writes go through ``sends``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, ring: SendRing | None,
                 receive_buffer: int | None = None) -> None:
        self.loop = loop
        self.sends = TurnSends(loop, ring)
        self.transports: list[asyncio.Transport] = []
        self.clients: list[socket.socket] = []
        self.server = loop.run_until_complete(loop.create_server(lambda: _Accepting(self.transports), "127.0.0.1", 0))
        port = self.server.sockets[0].getsockname()[1]
        for _ in range(count):
            client = socket.socket()
            if receive_buffer is not None:   # before connecting: it sets the window the server sees
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            client.connect(("127.0.0.1", port))
            self.clients.append(client)
        loop.run_until_complete(_until(lambda: len(self.transports) == count))
        self.fds = [ring_socket(t) for t in self.transports]

    def turn(self, writes) -> None:
        """Run ``writes`` as one callback of the loop, then let the loop send."""
        self.loop.call_soon(writes)
        self.loop.run_until_complete(asyncio.sleep(0.01))

    def read(self, client: int, size: int) -> bytes:
        """Up to ``size`` bytes the client reads (less at the end of the stream), the loop running
        meanwhile (the transports write what they hold)."""
        def reading() -> bytes:
            sock = self.clients[client]
            sock.settimeout(5)
            got = b""
            while len(got) < size:
                chunk = sock.recv(size - len(got))
                if not chunk:
                    break
                got += chunk
            return got
        return self.loop.run_until_complete(self.loop.run_in_executor(None, reading))

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for transport in self.transports:
            transport.abort()
        self.server.close()


class _Accepting(asyncio.Protocol):
    def __init__(self, transports: list) -> None:
        self.transports = transports

    def connection_made(self, transport) -> None:
        self.transports.append(transport)


async def _until(condition) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture(params=["uvloop", "asyncio"])
def loop(request):
    """The gateway's loop (uvloop), and asyncio's own, whose transports differ inside."""
    loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
    yield loop
    loop.close()


@needs_ring
def test_a_turns_writes_to_many_connections_leave_in_one_system_call(loop):
    connections = Connections(loop, 6, RING)
    try:
        def answer_all():
            for i, (transport, fd) in enumerate(zip(connections.transports, connections.fds)):
                connections.sends.write(transport, fd, b"first %d|" % i)
                connections.sends.write(transport, fd, b"second %d|" % i)   # joins the first, in order
        connections.turn(answer_all)
        assert (connections.sends.system_calls, connections.sends.sends) == (1, 6)
        for i in range(6):
            expected = b"first %d|second %d|" % (i, i)
            assert connections.read(i, len(expected)) == expected
    finally:
        connections.close()


@needs_ring
def test_held_bytes_go_before_a_large_write_and_before_a_close(loop):
    connections = Connections(loop, 2, RING)
    large = b"L" * (HELD_BYTES + 1)
    try:
        (first, second), (fd1, fd2) = connections.transports, connections.fds

        def write_then_large_then_close():
            connections.sends.write(first, fd1, b"small|")
            connections.sends.write(first, fd1, large)                 # to the transport: held bytes first
            connections.sends.write(second, fd2, b"last words|")
            connections.sends.release(second)                           # as a connection does before closing
            second.close()
        connections.turn(write_then_large_then_close)
        assert connections.read(0, 6 + len(large)) == b"small|" + large
        assert connections.read(1, 100) == b"last words|"               # then the end of the stream
        assert connections.sends.system_calls == 0   # nothing was left to gather at the turn's end
    finally:
        connections.close()


@needs_ring
def test_what_a_client_has_no_room_for_waits_in_the_transport_and_later_bytes_go_behind_it(loop):
    connections = Connections(loop, 3, RING, receive_buffer=4096)
    chunk = bytes(range(256)) * 200   # 51,200 bytes a turn, to a client that does not read yet
    try:
        (first, second, third), (fd1, fd2, fd3) = connections.transports, connections.fds
        first.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        turns = 0
        while not first.get_write_buffer_size():   # until the socket is full and the transport holds the rest
            turns += 1
            assert turns < 100, "the socket never filled"

            def all_three():
                connections.sends.write(first, fd1, chunk)
                connections.sends.write(second, fd2, b"s")
                connections.sends.write(third, fd3, b"t")
            connections.turn(all_three)
        assert connections.sends.system_calls == turns
        # The client reads a little while the loop stands still: its socket has room again, and
        # the transport still holds bytes. A write now must go behind those, not into the room.
        connections.clients[0].settimeout(5)
        drained = connections.clients[0].recv(8192)

        def behind():
            connections.sends.write(first, fd1, b"after")
            connections.sends.write(second, fd2, b"S")
            connections.sends.write(third, fd3, b"T")
        connections.turn(behind)
        assert connections.sends.system_calls == turns + 1   # second's and third's: first's went to its transport
        assert connections.read(1, turns + 1) == b"s" * turns + b"S"
        assert connections.read(2, turns + 1) == b"t" * turns + b"T"
        rest = connections.read(0, turns * len(chunk) + 5 - len(drained))
        assert drained + rest == chunk * turns + b"after"
    finally:
        connections.close()


@needs_ring
def test_a_connection_aborted_before_the_turn_ends_is_not_written_to(loop):
    connections = Connections(loop, 2, RING)
    try:
        (first, second), (fd1, fd2) = connections.transports, connections.fds

        def write_then_abort():
            connections.sends.write(first, fd1, b"never")
            connections.sends.write(second, fd2, b"kept")
            first.abort()
        connections.turn(write_then_abort)
        assert connections.read(0, 5) == b""   # the end of the stream, nothing before it
        assert connections.read(1, 4) == b"kept"
    finally:
        connections.close()


def test_without_a_ring_each_write_goes_to_its_transport_at_once(loop):
    connections = Connections(loop, 2, None)
    try:
        def answer_both():
            for i, transport in enumerate(connections.transports):
                connections.sends.write(transport, ring_socket(transport), b"at once %d" % i)
                assert transport.get_write_buffer_size() == 0   # written already, not held
        connections.turn(answer_both)
        assert connections.sends.system_calls == 0
        assert [connections.read(i, 9) for i in range(2)] == [b"at once 0", b"at once 1"]
    finally:
        connections.close()


def test_a_tls_connection_is_never_given_to_the_ring(loop, tmp_path):
    ca = CertificateAuthority(tmp_path)
    pem = ca.server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem.cert, pem.key)
    transports: list = []
    server = loop.run_until_complete(loop.create_server(lambda: _Accepting(transports), "127.0.0.1", 0, ssl=context))
    client_context = ssl.create_default_context(cafile=str(ca.root.cert))
    try:
        raw = socket.create_connection(server.sockets[0].getsockname())
        wrapped = client_context.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
        wrapped.setblocking(False)

        async def handshake():
            while True:
                try:
                    wrapped.do_handshake()
                    return
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    await asyncio.sleep(0.01)
        loop.run_until_complete(asyncio.wait_for(handshake(), 10))
        loop.run_until_complete(_until(lambda: transports))
        assert ring_socket(transports[0]) is None
        wrapped.close()
    finally:
        server.close()


def test_a_ring_holding_what_its_caller_did_not_put_there_is_not_used_again(loop):
    ring = SendRing.open()
    if ring is None:
        pytest.skip("this kernel (or its sandbox) offers no io_uring")
    ring._words[ring._sq_tail] += 1   # an entry left behind, as a call cut short would leave it
    ours, theirs = socket.socketpair()
    buffer = bytearray(b"x")
    try:
        assert ring.send([(ours.fileno(), address_of(buffer), 1)]) == [-errno.EAGAIN]   # nothing submitted
        assert ring.broken
        connections = Connections(loop, 2, ring)
        try:
            def both():
                for i, (transport, fd) in enumerate(zip(connections.transports, connections.fds)):
                    connections.sends.write(transport, fd, b"through the transport %d" % i)
            connections.turn(both)
            assert not connections.sends.batching
            assert [connections.read(i, 23) for i in range(2)] == [b"through the transport 0",
                                                                    b"through the transport 1"]
            connections.turn(both)   # and the next turn's at once
            assert connections.sends.system_calls == 1
        finally:
            connections.close()
    finally:
        ours.close()
        theirs.close()
