"""The BLS client against a scripted broker: a ROUTER that reads the client's
INFER records and answers as the broker does, every answer of one batch to the same socket in
one message."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest
import zmq

from tritium.pb_utils import types as pb
from tritium.pb_utils.triton_names.triton_python_backend_utils import get_output_tensor_by_name
from tritium.protocol import Cancel, Heartbeat, Infer, Response, read_record, tensor_views
from tritium.workers.bls import BlsClient
from tritium.zmqio import recv_parts, send_parts
from tritium.zmtp import ZmtpDealer

_names = itertools.count()


@pytest.fixture(params=["inproc", "ipc"])
def broker_and_client(request, tmp_path):
    """Over inproc the client's DEALER is a libzmq socket; over ipc, tritium's own ZMTP socket."""
    name = f"bls-broker-{next(_names)}"
    address = f"inproc://{name}" if request.param == "inproc" else f"ipc://{tmp_path}/{name}"
    router = zmq.Context.instance().socket(zmq.ROUTER)   # inproc: the client's context
    router.setsockopt(zmq.LINGER, 0)
    router.bind(address)
    client = BlsClient(address, "instance-1/bls")
    yield router, client
    client.sock.close(0)
    router.close(0)


def received(router: zmq.Socket, count: int) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
    """The client's identity and ``count`` INFERs' (rid, first input) as they arrive."""
    requests = []
    identity = b""
    while len(requests) < count:
        assert router.poll(5000), "the client sent nothing"
        identity, *records = recv_parts(router)
        for part in records:
            header, view, offset = read_record(part)
            assert isinstance(header, Infer)
            (data, *_) = tensor_views(header.inputs, view, offset, [])
            requests.append((header.rid, np.frombuffer(data, dtype=np.float32)))
    return identity, requests


def answer(rid: int, values: np.ndarray, final: bool | None = None) -> bytes:
    return Response(rid, [["Y", "FP32", [len(values)], values.nbytes, False]], final=final).encode(
        [values.tobytes()])


def request_for(values: np.ndarray) -> pb.InferenceRequest:
    return pb.InferenceRequest(model_name="m", requested_output_names=["Y"], inputs=[pb.Tensor("X", values)])


def test_async_calls_answered_together_in_one_message_each_get_their_answer(broker_and_client):
    router, client = broker_and_client
    inputs = [np.full(4, k, dtype=np.float32) for k in range(1, 4)]

    async def calls():
        return await asyncio.gather(*(client.execute_async(request_for(values)) for values in inputs))

    async def broker_then_calls():
        task = asyncio.ensure_future(calls())
        await asyncio.sleep(0)   # the three INFERs go out
        identity, requests = await asyncio.get_running_loop().run_in_executor(None, received, router, 3)
        # As Scheduler._route_responses does: one message, each answer its request's input doubled.
        send_parts(router, [identity, *(answer(rid, 2 * values) for rid, values in requests)])
        return await asyncio.wait_for(task, 5)

    answers = asyncio.run(broker_then_calls())
    for values, response in zip(inputs, answers):
        assert not response.has_error()
        np.testing.assert_array_equal(get_output_tensor_by_name(response, "Y").as_numpy(), 2 * values)


def test_a_decoupled_models_responses_in_one_message_are_all_seen(broker_and_client):
    router, client = broker_and_client
    responses = client.execute(request_for(np.zeros(2, dtype=np.float32)), decoupled=True)
    seen: list = []
    # The model reads its responses at once, as models do. A lost response would leave the
    # reading blocked: it runs in a thread the test does not wait for.
    reader = threading.Thread(target=lambda: seen.extend(responses), daemon=True)
    reader.start()
    identity, [(rid, _)] = received(router, 1)
    send_parts(router, [identity, *(answer(rid, np.full(2, i, dtype=np.float32), final=False) for i in range(3)),
                        Response(rid, final=True, empty=True).encode()])
    reader.join(5)
    # The flags-only final response is the last one, without outputs, as from Triton.
    assert [len(response.output_tensors()) for response in seen] == [1, 1, 1, 0]
    assert [get_output_tensor_by_name(response, "Y").as_numpy()[0] for response in seen[:3]] == [0.0, 1.0, 2.0]


class ScriptedBroker:
    """A thread answering every INFER as it comes: ``stream`` with ``responses`` RESPONSE
    messages and a flags-only final one, any other model with one answer."""

    def __init__(self, router: zmq.Socket, responses: int) -> None:
        self.router = router
        self.responses = responses
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(20):
                continue
            identity, *records = recv_parts(self.router)
            for part in records:
                header = read_record(part)[0]
                if header.model != "stream":
                    send_parts(self.router, [identity, answer(header.rid, np.zeros(2, dtype=np.float32))])
                    continue
                for index in range(self.responses):   # each its own message, as a decoupled model's
                    send_parts(self.router, [identity, answer(header.rid, np.full(2, index, dtype=np.float32),
                                                                final=False)])
                send_parts(self.router, [identity, Response(header.rid, final=True, empty=True).encode()])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def test_threads_calling_at_once_each_get_their_answers_in_order_and_at_once(broker_and_client):
    """One thread reads a decoupled call's 50 responses while three others make calls of their
    own: the responses arrive complete and in order, and no call waits on an answer another
    thread already read."""
    router, client = broker_and_client
    broker = ScriptedBroker(router, responses=50)
    slowest: list[float] = []

    def caller():
        for _ in range(40):
            started = time.monotonic()
            client.execute(request_for(np.zeros(2, dtype=np.float32)))
            slowest.append(time.monotonic() - started)

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(3)]
    for thread in callers:
        thread.start()
    try:
        for _ in range(5):
            stream = client.execute(pb.InferenceRequest(model_name="stream", requested_output_names=["Y"],
                                                        inputs=[pb.Tensor("X", np.zeros(2, dtype=np.float32))]),
                                    decoupled=True)
            seen = [get_output_tensor_by_name(r, "Y").as_numpy()[0] if r.output_tensors() else -1 for r in stream]
            assert seen == [*range(50), -1]
    finally:
        for thread in callers:
            thread.join(20)
        broker.close()
    assert len(slowest) == 120 and max(slowest) < 0.5, f"{len(slowest)} calls, the slowest {max(slowest):.2f} s"


def test_a_thread_calling_beside_an_async_execute_is_not_kept_waiting(broker_and_client):
    """An event loop's reader (``execute_async``) and a thread calling ``exec`` may each read the
    other's answer: both still get theirs at once."""
    router, client = broker_and_client
    broker = ScriptedBroker(router, responses=0)
    done = threading.Event()
    async_answers = []

    async def async_calls():
        while not done.is_set():
            async_answers.append(await client.execute_async(request_for(np.zeros(2, dtype=np.float32))))

    looping = threading.Thread(target=lambda: asyncio.run(async_calls()), daemon=True)
    looping.start()
    slowest = 0.0
    try:
        time.sleep(0.05)   # the loop's reader is registered
        for _ in range(60):
            started = time.monotonic()
            client.execute(request_for(np.zeros(2, dtype=np.float32)))
            slowest = max(slowest, time.monotonic() - started)
    finally:
        done.set()
        looping.join(5)
        broker.close()
    assert slowest < 0.5, f"a call waited {slowest:.2f} s"
    assert not looping.is_alive(), "an async call never got its answer"
    assert len(async_answers) > 10


def boundary_asked(router: zmq.Socket) -> tuple[bytes, int]:
    """The client's question to a new broker process: its identity and the ``nr`` it sent."""
    assert router.poll(5000), "the client asked nothing"
    identity, record = recv_parts(router)
    beat = read_record(record)[0]
    assert isinstance(beat, Heartbeat) and beat.next_rid is not None, beat
    return identity, beat.next_rid


def test_calls_in_flight_when_the_broker_restarts_are_answered_unavailable_naming_the_model(broker_and_client):
    """The broker process holding the calls is gone and the new one heard none of them: a waiting
    ``exec``, ``async_exec`` and decoupled iterator each get an error as soon as it says so (none
    would ever be answered), and their large inputs' shared memory is free again. The same boot
    told twice fails nothing new."""
    router, client = broker_and_client
    big = np.ones(1 << 16, dtype=np.float32)   # 256 KiB: placed in shared memory over a local link
    results: dict[str, object] = {}
    blocked = threading.Thread(target=lambda: results.update(exec=client.execute(request_for(big))), daemon=True)
    blocked.start()
    stream = client.execute(request_for(np.zeros(2, dtype=np.float32)), decoupled=True)
    reader = threading.Thread(target=lambda: results.update(stream=list(stream)), daemon=True)
    reader.start()

    async def async_call():
        return await client.execute_async(request_for(np.zeros(2, dtype=np.float32)))

    looping = threading.Thread(target=lambda: results.update(exec_async=asyncio.run(async_call())), daemon=True)
    looping.start()
    rids = []
    while len(rids) < 3:   # all three are with the "broker", which will never answer
        assert router.poll(5000), "the client sent nothing"
        _, *parts = recv_parts(router)
        position = 0
        while position < len(parts):
            header = read_record(parts[position])[0]
            rids.append(header.rid)
            position += 1 + header.external
    if isinstance(client.sock, ZmtpDealer):
        assert client.pool_usage().used >= big.nbytes
    client.broker_restarted(7)
    identity, next_rid = boundary_asked(router)
    assert next_rid == max(rids) + 1
    time.sleep(0.3)
    assert blocked.is_alive() and reader.is_alive() and looping.is_alive(), "failed before the broker said"
    started = time.monotonic()
    send_parts(router, [identity, Heartbeat(7, since=next_rid).encode()])   # it heard none of them
    for thread in (blocked, reader, looping):
        thread.join(5)
    took = time.monotonic() - started
    assert took < 2, f"the calls waited {took:.1f} s after the restart was known"
    results["stream"], = results["stream"]   # one response: the error, which is final
    expected = f"the broker at {client.broker} restarted; the BLS request to model 'm' was lost"
    for name in ("exec", "stream", "exec_async"):
        response = results[name]
        assert response.has_error(), name
        assert (response.error().message(), response.error().code()) == (expected, pb.TritonError.UNAVAILABLE), name
    if isinstance(client.sock, ZmtpDealer):
        assert client.pool_usage().used == 0

    # A call to the new broker process that is waiting when the same restart is told again is not
    # failed: it gets its answer.
    later: dict[str, object] = {}
    waiting = threading.Thread(target=lambda: later.update(exec=client.execute(request_for(np.ones(2, np.float32)))),
                               daemon=True)
    waiting.start()
    identity, [(rid, values)] = received(router, 1)
    client.broker_restarted(7)
    assert not router.poll(200), "the same boot was asked about again"
    send_parts(router, [identity, answer(rid, 2 * values)])
    waiting.join(5)
    response = later["exec"]
    assert not response.has_error()
    np.testing.assert_array_equal(get_output_tensor_by_name(response, "Y").as_numpy(), [2.0, 2.0])


def test_only_the_calls_below_the_new_processs_first_are_failed_the_others_get_their_answers(broker_and_client):
    """Two calls went to the process that is gone, a third reached the new one before the client
    heard of it: the new process names the third as the first it heard, and only the two below
    it fail; the third, and a call made after the question, get their answers."""
    router, client = broker_and_client
    results: dict[int, object] = {}

    def call(key: int, value: float) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update(
            {key: client.execute(request_for(np.full(2, value, dtype=np.float32)))}), daemon=True)
        thread.start()
        return thread

    threads = {key: call(key, float(key)) for key in (1, 2, 3)}
    identity, requests = received(router, 3)
    # The threads may send in any order: the two lowest rids went to the process that is gone.
    by_rid = sorted((rid, int(values[0])) for rid, values in requests)
    assert [rid for rid, _ in by_rid] == [1, 2, 3]
    (_, lost_a), (_, lost_b), (third_rid, third) = by_rid
    client.broker_restarted(8)
    _, next_rid = boundary_asked(router)
    assert next_rid == 4
    threads[4] = call(4, 4.0)
    _, [(fourth, values)] = received(router, 1)
    assert fourth == 4
    send_parts(router, [identity, Heartbeat(8, since=third_rid).encode()])
    for key in (lost_a, lost_b):
        threads[key].join(5)
        assert not threads[key].is_alive()
        assert results[key].has_error(), key
        assert "restarted; the BLS request to model 'm' was lost" in results[key].error().message()
    assert threads[third].is_alive() and threads[4].is_alive(), "a call the new process got was failed"
    send_parts(router, [identity, answer(third_rid, np.full(2, 10.0 * third, np.float32)),
                        answer(fourth, np.full(2, 40.0, np.float32))])
    for key in (third, 4):
        threads[key].join(5)
        np.testing.assert_array_equal(get_output_tensor_by_name(results[key], "Y").as_numpy(), [10.0 * key] * 2)


def test_an_unanswered_question_fails_the_calls_sent_before_it_once_its_time_is_up(broker_and_client):
    """The new process never says which calls it got: the heartbeat's ``tick`` fails the calls
    sent before the question once ``wait_s`` and the socket's longest reconnect interval have
    passed, not before; an answer to an earlier boot's question changes nothing."""
    router, client = broker_and_client
    results: dict[str, object] = {}
    waiting = threading.Thread(target=lambda: results.update(exec=client.execute(request_for(np.ones(2, np.float32)))),
                               daemon=True)
    waiting.start()
    identity, [(rid, _)] = received(router, 1)
    client.broker_restarted(9, wait_s=0.5)
    boundary_asked(router)
    send_parts(router, [identity, Heartbeat(8, since=rid + 1).encode()])   # another process's answer
    client.tick()
    time.sleep(1.0)   # wait_s, and up to the socket's longest reconnect interval more
    client.tick()
    assert waiting.is_alive(), "failed before its time was up"
    time.sleep(0.8)
    client.tick()
    waiting.join(5)
    assert not waiting.is_alive()
    message = results["exec"].error().message()
    assert message == (f"the broker at {client.broker} restarted and did not say which calls it got; the BLS "
                       "request to model 'm' was lost")


def test_an_awaited_call_given_up_by_wait_for_is_cancelled_and_its_late_answer_dropped(broker_and_client):
    """A model that bounds its call (``asyncio.wait_for``) cancels it at the called model, and the
    answer that still comes is not kept for a caller that left."""
    router, client = broker_and_client

    async def give_up():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.execute_async(request_for(np.ones(2, dtype=np.float32))), 0.2)

    asyncio.run(give_up())
    seen = []
    identity = b""
    while len(seen) < 2:
        assert router.poll(5000), "the client sent no cancel"
        identity, *records = recv_parts(router)
        seen.extend(read_record(part)[0] for part in records)
    infer, cancel = seen
    assert isinstance(infer, Infer) and isinstance(cancel, Cancel)
    assert (cancel.rid, cancel.model) == (infer.rid, "m")
    send_parts(router, [identity, answer(infer.rid, np.zeros(2, dtype=np.float32))])
    client._pump(5000)   # the answer read and dropped
    assert infer.rid not in client._replies and not client.sock.has_message()
