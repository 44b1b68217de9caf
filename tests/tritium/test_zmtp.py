"""The ZMTP DEALER and ROUTER (tritium/zmtp.py) against libzmq's and each other, over real Unix sockets."""

from __future__ import annotations

import errno
import logging
import os
import random
import resource
import select
import socket
import time

import pytest
import zmq

from tritium.zmtp import _NULL_GREETING, ZmtpDealer, ZmtpError, ZmtpRouter, _Alarm, _command, _Reader, encode


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "link")


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def receive(sock, others=(), timeout_s: float = 5.0) -> list:
    """The next message of a ZMTP socket (or a libzmq one), serving ``others`` meanwhile
    (the raw sockets of the other end, which only move when called)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for other in others:
            other.has_message()
        if isinstance(sock, zmq.Socket):
            if sock.poll(10):
                return sock.recv_multipart()
            continue
        try:
            return [bytes(part) for part in sock.recv_parts()]
        except zmq.Again:
            select.select([sock.fileno()], [], [], 0.01)
    raise TimeoutError("no message")


def libzmq_router(context, path):
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.bind(f"ipc://{path}")
    return sock


def libzmq_dealer(context, path, identity=b""):
    sock = context.socket(zmq.DEALER)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(f"ipc://{path}")
    return sock


def test_a_dealer_talks_to_a_libzmq_router(path, context):
    router = libzmq_router(context, path)
    dealer = ZmtpDealer(path, b"gw-1")
    try:
        big = os.urandom(3_000_000)
        dealer.send_parts([b"record", big, memoryview(bytearray(b"tail"))])
        assert receive(router, [dealer]) == [b"gw-1", b"record", big, b"tail"]
        router.send_multipart([b"gw-1", b"answer", big])
        assert receive(dealer) == [b"answer", big]
        for number in range(300):
            dealer.send_parts([str(number).encode()])
        assert [int(receive(router, [dealer])[1]) for _ in range(300)] == list(range(300))
    finally:
        dealer.close()


def test_a_libzmq_dealer_talks_to_a_router(path, context):
    router = ZmtpRouter(path)
    named, anonymous = libzmq_dealer(context, path, b"in-7"), libzmq_dealer(context, path)
    try:
        big = os.urandom(2_000_000)
        named.send_multipart([b"hello", big])
        assert receive(router) == [b"in-7", b"hello", big]
        anonymous.send_multipart([b"who?"])
        identity, body = receive(router)
        assert body == b"who?" and identity not in (b"", b"in-7")
        router.send_parts([identity, b"you"])
        router.send_parts([b"in-7", b"back", big])
        assert receive(anonymous, [router]) == [b"you"]
        assert receive(named, [router]) == [b"back", big]
        with pytest.raises(zmq.ZMQError) as error:
            router.send_parts([b"nobody", b"x"])
        assert error.value.errno == zmq.EHOSTUNREACH
    finally:
        router.close()


def test_a_dealer_and_a_router_talk_without_libzmq(path):
    router = ZmtpRouter(path)
    dealer = ZmtpDealer(path, b"gw-2")
    try:
        big = os.urandom(5_000_000)
        dealer.send_parts([b"a", big])
        assert receive(router, [dealer]) == [b"gw-2", b"a", big]
        for number in range(500):
            router.send_parts([b"gw-2", str(number).encode(), b"x" * (number * 300)])
        got = [receive(dealer, [router]) for _ in range(500)]
        assert [int(m[0]) for m in got] == list(range(500))
        assert [len(m[1]) for m in got] == [n * 300 for n in range(500)]
    finally:
        dealer.close()
        router.close()
    assert not os.path.exists(path)   # the socket file goes with the ROUTER, as libzmq's


def test_messages_sent_before_the_router_binds_arrive_when_it_does(path, context):
    dealer = ZmtpDealer(path, b"early", reconnect_ivl_s=0.02, reconnect_ivl_max_s=0.05)
    try:
        dealer.send_parts([b"first"])
        dealer.send_parts([b"second"])
        time.sleep(0.1)
        router = libzmq_router(context, path)
        assert receive(router, [dealer]) == [b"early", b"first"]
        assert receive(router, [dealer]) == [b"early", b"second"]
    finally:
        dealer.close()


def test_the_dealer_reconnects_to_a_restarted_router(path):
    router = ZmtpRouter(path)
    dealer = ZmtpDealer(path, b"gw-3", reconnect_ivl_s=0.02, reconnect_ivl_max_s=0.05)
    try:
        dealer.send_parts([b"one"])
        assert receive(router, [dealer]) == [b"gw-3", b"one"]
        router.close()
        router = ZmtpRouter(path)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            dealer.has_message()   # sees the old connection end, reconnects when its timer says
            router.has_message()
            try:
                router.send_parts([b"gw-3", b"welcome back"])
                break
            except zmq.ZMQError:
                time.sleep(0.01)
        assert receive(dealer, [router]) == [b"welcome back"]
    finally:
        dealer.close()
        router.close()


def test_an_identity_held_by_a_live_peer_is_refused_and_passes_on_when_it_ends(path, context):
    refused = []
    router = ZmtpRouter(path, on_refused=lambda endpoint, exc: refused.append(str(exc)))
    old = libzmq_dealer(context, path, b"same")
    try:
        old.send_multipart([b"old"])
        assert receive(router) == [b"same", b"old"]
        impostor = libzmq_dealer(context, path, b"same")
        impostor.send_multipart([b"impostor"])
        deadline = time.monotonic() + 5
        while not refused and time.monotonic() < deadline:
            router.has_message()
            time.sleep(0.01)
        assert refused == ["the identity b'same' is another live peer's"]   # as libzmq's ROUTER
        router.send_parts([b"same", b"to the first"])
        assert receive(old, [router]) == [b"to the first"]
        impostor.close(0)
        old.close(0)
        # libzmq closes the connection later, in its I/O thread: a new peer connecting before the
        # router has read the old one's end is refused, and libzmq drops the message it had sent.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            router.has_message()
            try:
                router.send_parts([b"same", b"still there?"])
            except zmq.ZMQError:   # EHOSTUNREACH: the router has seen the old connection end
                break
            time.sleep(0.01)
        new = libzmq_dealer(context, path, b"same")
        new.send_multipart([b"new"])
        assert receive(router) == [b"same", b"new"]   # the first one's connection ended: it passes on
    finally:
        router.close()


def said_hello(path, **dealer_options) -> tuple[ZmtpRouter, ZmtpDealer]:
    """A ZMTP ROUTER and a DEALER named gw, connected: the router has had the dealer's first message."""
    router = ZmtpRouter(path)
    dealer = ZmtpDealer(path, b"gw", **dealer_options)
    dealer.send_parts([b"hello"])
    assert receive(router, [dealer]) == [b"gw", b"hello"]
    return router, dealer


def test_what_arrived_before_the_peer_closed_is_still_read(path):
    router, dealer = said_hello(path)
    try:
        last = [os.urandom(70_000), os.urandom(100_000)]
        router.send_parts([b"gw", last[0]])
        router.send_parts([b"gw", last[1]])
        router.close()   # the broker's last answers, then it goes: the dealer reads both and the end at once
        assert receive(dealer) == [last[0]]
        assert receive(dealer) == [last[1]]
    finally:
        dealer.close()


def test_a_curve_broker_is_reported_and_retried(path, context):
    router = context.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = zmq.curve_keypair()
    router.bind(f"ipc://{path}")
    refusals = []
    dealer = ZmtpDealer(path, b"gw", reconnect_ivl_s=0.02, reconnect_ivl_max_s=0.05,
                        on_refused=lambda endpoint, exc: refusals.append((endpoint, exc)))
    try:
        deadline = time.monotonic() + 5
        while dealer._cut_short < 4 and time.monotonic() < deadline:
            dealer.has_message()
            select.select([dealer.fileno()], [], [], 0.01)
        assert len(refusals) == 1   # reported once it is no accident, and tried again since
        endpoint, error = refusals[0]
        assert endpoint == f"ipc://{path}" and isinstance(error, ZmtpError) and "requires CURVE" in str(error)
    finally:
        dealer.close()


def test_the_router_drops_a_client_that_is_not_zeromq_and_goes_on(path, context):
    refused = []
    router = ZmtpRouter(path, on_refused=lambda endpoint, exc: refused.append(str(exc)))
    stranger = socket.socket(socket.AF_UNIX)
    stranger.connect(path)
    try:
        stranger.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
        dealer = libzmq_dealer(context, path, b"ok")
        dealer.send_multipart([b"still serving"])
        assert receive(router) == [b"ok", b"still serving"]
        assert refused == ["the peer is not a ZeroMQ socket"]
        stranger.settimeout(2)
        assert stranger.recv(4096)[:1] == b"\xff"   # our greeting, then the end
        assert stranger.recv(4096) == b""
    finally:
        stranger.close()
        router.close()


@pytest.mark.parametrize("garbage", [b"\x04\x00", b"\x04\x01\x09", b"\x06" + (1 << 62).to_bytes(8, "big"),
                                     b"\x04\x08\x05READY\x0bS", b"\x00\x01x"])
def test_a_malformed_peer_is_dropped_and_the_router_goes_on(path, context, garbage):
    refused = []
    router = ZmtpRouter(path, on_refused=lambda endpoint, exc: refused.append(str(exc)))
    bad = socket.socket(socket.AF_UNIX)
    bad.connect(path)
    try:
        bad.sendall(_NULL_GREETING + garbage)
        good = libzmq_dealer(context, path, b"good")
        good.send_multipart([b"fine"])
        assert receive(router) == [b"good", b"fine"]
        assert len(refused) == 1 and any(word in refused[0] for word in ("malformed", "a frame of", "before its READY"))
    finally:
        bad.close()
        router.close()


def test_a_peer_that_does_not_read_never_blocks_the_router(path):
    router = ZmtpRouter(path, hwm=50)
    sleeper = socket.socket(socket.AF_UNIX)   # says hello by hand, then never reads
    sleeper.connect(path)
    try:
        sleeper.sendall(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"DEALER", b"Identity": b"sleeper"})
                        + b"".join(bytes(segment) for segment in encode([b"hi"])))
        assert receive(router) == [b"sleeper", b"hi"]
        chunk = bytes(1_000_000)
        started, sent = time.monotonic(), 0
        with pytest.raises(zmq.Again):
            for _ in range(1000):
                router.send_parts([b"sleeper", chunk])
                sent += 1
        assert time.monotonic() - started < 2   # queued, then refused: never blocked
        assert 50 <= sent < 60   # the kernel's buffers took a few, the router held 50
    finally:
        sleeper.close()
        router.close()


def test_the_descriptor_is_readable_while_a_message_waits(path, context):
    router = libzmq_router(context, path)
    dealer = ZmtpDealer(path, b"gw")
    try:
        dealer.send_parts([b"hello"])
        assert receive(router, [dealer]) == [b"gw", b"hello"]
        poller = select.poll()
        poller.register(dealer.fileno(), select.POLLIN)
        assert poller.poll(0) == []
        router.send_multipart([b"gw", b"one"])
        router.send_multipart([b"gw", b"two"])
        time.sleep(0.2)   # libzmq's I/O thread writes them when it gets the CPU: both there before the read
        assert poller.poll(2000) != []
        assert [bytes(p) for p in dealer.recv_parts()] == [b"one"]
        assert dealer.has_message()   # read already, so no longer on the descriptor
        assert [bytes(p) for p in dealer.recv_parts()] == [b"two"]
        with pytest.raises(zmq.Again):
            dealer.recv_parts()
    finally:
        dealer.close()


def test_the_reader_finds_the_same_messages_however_the_bytes_arrive():
    messages = [[b"a"], [b"", b"b" * 255, b"c" * 256], [os.urandom(200_000), b"end"], [b"x" * 70_000]]
    stream = _NULL_GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"})
    stream += b"".join(bytes(segment) for m in messages for segment in encode(m))
    rng = random.Random(7)
    for cut in ("bytes", "random"):
        reader, position = _Reader(), 0
        while position < len(stream):
            size = 1 if cut == "bytes" and position < 2000 else rng.randint(1, 90_000)
            room = reader.big_room()
            if room is not None:   # as the sockets do: a large frame is read in place
                size = min(size, len(room), len(stream) - position)
                room[:size] = stream[position:position + size]
                reader.big_read(size)
            else:
                reader.feed(stream[position:position + size])
            position += size
        assert reader.ready and reader.properties == {b"Socket-Type": b"ROUTER"}
        assert [[bytes(p) for p in m] for m in reader.messages] == messages


def test_a_reconnection_timer_that_fires_late_leaves_the_descriptor_quiet(path):
    router, dealer = said_hello(path)
    try:
        dealer._alarm._ring(dealer._alarm._setting)   # as a timer does that fires after a send has reconnected already
        poller = select.poll()
        poller.register(dealer.fileno(), select.POLLIN)
        assert poller.poll(100) == []   # nothing to do: an owner's loop would sleep, not spin
        router.send_parts([b"gw", b"still here"])
        assert receive(dealer, [router]) == [b"still here"]
    finally:
        dealer.close()
        router.close()


@pytest.mark.parametrize("said", [b"", _NULL_GREETING], ids=["nothing", "a greeting without READY"])
def test_the_router_drops_a_client_that_never_finishes_its_handshake(path, context, said):
    router = ZmtpRouter(path, handshake_s=0.2)
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(path)
    try:
        silent.sendall(said)
        started = time.monotonic()
        while router._connections or time.monotonic() - started < 0.05:   # as an owner: called in only when readable
            assert time.monotonic() - started < 3, "the router's descriptor never woke its owner"
            if select.select([router.fileno()], [], [], 0.5)[0]:
                router.has_message()
        assert time.monotonic() - started >= 0.15
        silent.settimeout(2)
        assert silent.recv(4096)[:1] == b"\xff"   # our greeting, then the end
        assert silent.recv(4096) == b""
        poller = select.poll()
        poller.register(router.fileno(), select.POLLIN)
        assert poller.poll(300) == []   # no handshake left to time: quiet again
        good = libzmq_dealer(context, path, b"good")
        good.send_multipart([b"fine"])
        assert receive(router) == [b"good", b"fine"]
    finally:
        silent.close()
        router.close()


def test_the_dealer_reconnects_when_the_peer_never_greets(path):
    mute = socket.socket(socket.AF_UNIX)   # accepts, says nothing
    mute.bind(path)
    mute.listen(8)
    refused = []
    dealer = ZmtpDealer(path, b"gw", reconnect_ivl_s=0.02, reconnect_ivl_max_s=0.05, handshake_s=0.2,
                        on_refused=lambda endpoint, exc: refused.append(exc))
    accepted = []
    try:
        dealer.send_parts([b"waits"])
        deadline = time.monotonic() + 3
        mute.settimeout(0.01)
        while len(accepted) < 3 and time.monotonic() < deadline:
            if select.select([dealer.fileno()], [], [], 0.05)[0]:
                dealer.has_message()
            try:
                accepted.append(mute.accept()[0])
            except TimeoutError:
                pass
        assert len(accepted) >= 3   # dropped after 0.2 s each time, and connected again
        assert refused == []        # a peer that is slow to greet is no refusal (as a CURVE broker's close is)
        connection = dealer._connection
        waiting = list(dealer._unsent) + ([m for m in connection.out if m is not connection.greeting] if connection else [])
        assert waiting, "the message waiting for a handshake was lost"
    finally:
        for sock in accepted:
            sock.close()
        dealer.close()
        mute.close()


def test_a_client_that_leaves_before_its_handshake_leaves_the_router_quiet(path):
    router = ZmtpRouter(path, handshake_s=0.1)
    brief = socket.socket(socket.AF_UNIX)
    brief.connect(path)
    try:
        router.has_message()   # accepts it: a handshake to time
        brief.close()
        deadline = time.monotonic() + 2
        while router._connections and time.monotonic() < deadline:
            if select.select([router.fileno()], [], [], 0.05)[0]:
                router.has_message()   # sees it gone
        assert not router._connections
        time.sleep(0.2)   # past the deadline its timer was set for
        poller = select.poll()
        poller.register(router.fileno(), select.POLLIN)
        assert poller.poll(100) == []   # nothing left to time: an owner's loop would sleep, not spin
    finally:
        router.close()


@pytest.fixture
def few_descriptors():
    """Lowers this process's descriptor limit so that a test can run out of them; yields a
    function that opens descriptors until none is left, and closes them all afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened: list[int] = []

    def exhaust() -> None:
        while True:
            try:
                opened.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                return

    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    try:
        yield exhaust, opened
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_router_out_of_descriptors_waits_instead_of_spinning_and_accepts_afterwards(path, few_descriptors, caplog):
    exhaust, opened = few_descriptors
    router = ZmtpRouter(path)
    client = socket.socket(socket.AF_UNIX)
    try:
        exhaust()
        client.connect(path)   # waits in the listener's backlog: nothing left to accept it with
        client.sendall(_NULL_GREETING)
        poller = select.poll()
        poller.register(router.fileno(), select.POLLIN)
        with caplog.at_level(logging.WARNING, logger="tritium.zmtp"):
            started = time.monotonic()
            wakeups = 0
            while time.monotonic() - started < 0.35:   # as an owner: called in only when readable
                if poller.poll(10):
                    wakeups += 1
                    assert not router.has_message()
        assert wakeups <= 10, "the owner's loop spun on a listener it could not accept from"
        assert [r.getMessage() for r in caplog.records] == [
            f"cannot accept a connection on ipc://{path} ([Errno 24] Too many open files): trying again every 0.1 s"]
        for fd in opened:
            os.close(fd)
        opened.clear()
        assert poller.poll(1000), "the router never tried again"
        router.has_message()
        client.settimeout(2)
        assert client.recv(1)[:1] == b"\xff"   # accepted at last: our greeting
        assert len(router._connections) == 1
    finally:
        client.close()
        router.close()


def test_a_cancelled_alarm_does_not_ring_even_from_a_timer_already_woken():
    poller = select.epoll()
    alarm = _Alarm(poller)
    try:
        alarm.ring_in(60)
        woken = alarm._setting   # what its timer thread holds once it wakes
        alarm.cancel()
        alarm._ring(woken)       # the timer, woken just before the cancel, rings late
        assert not alarm.rang()
        alarm.ring_in(0.01)
        time.sleep(0.1)
        assert alarm.rang()
        alarm.ring_in(0.01)      # rang but not read off: cancelling reads it off
        time.sleep(0.1)
        alarm.cancel()
        assert not alarm.rang()
    finally:
        alarm.close()
        poller.close()


def test_a_dealer_out_of_descriptors_keeps_trying_to_reconnect(path, few_descriptors):
    exhaust, opened = few_descriptors
    router, dealer = said_hello(path, reconnect_ivl_s=0.02, reconnect_ivl_max_s=0.05)
    try:
        router.close()
        deadline = time.monotonic() + 5
        while dealer._connection is not None and time.monotonic() < deadline:   # sees its connection end
            if select.select([dealer.fileno()], [], [], 0.02)[0]:
                dealer.has_message()
        router = ZmtpRouter(path)
        exhaust()
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:   # its reconnections cannot make a socket: tried again later
            if select.select([dealer.fileno()], [], [], 0.02)[0]:
                assert not dealer.has_message()
        assert dealer._connection is None
        for fd in opened:
            os.close(fd)
        opened.clear()
        dealer.send_parts([b"two"])
        assert receive(router, [dealer]) == [b"gw", b"two"]
    finally:
        dealer.close()
        router.close()
