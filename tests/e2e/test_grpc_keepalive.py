"""Triton's gRPC keepalive, ping-policy and connection-age flags on tritium's own gRPC server:
a silent connection is pinged and closed when nothing answers, a live one stays; a client
that pings too often is told too_many_pings; an old connection is told GOAWAY, keeps its
calls for the grace period, and real clients carry on over a new one.
"""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner
from tritonclient.grpc import service_pb2

from tests.e2e.rawh2 import ACK, DATA, END_STREAM, GOAWAY, PING, RawH2, grpc_message
from tests.e2e.grpc_requests import add_sub_request, check_add_sub, whoami_request
from tests.models import add_sub_model
from tests.servers import TritiumServer
from tritium.cli import gateway, grpc_keepalive
from tritium.gateway.grpc_keepalive import GrpcKeepalive
from tritium.options import OPTIONS

WHOAMI = Path(__file__).parent / "cluster_repo" / "whoami"   # answers after DELAY_MS
KEEPALIVE_MS, TIMEOUT_MS = 300, 500
AGE_MS, GRACE_MS = 1000, 1500


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub")
    shutil.copytree(WHOAMI, repo / "whoami")
    return repo


@pytest.fixture(scope="module")
def pinging(repo):
    """Pings every connection silent for 300 ms, calls in flight or not."""
    with TritiumServer(repo, f"--grpc-keepalive-time={KEEPALIVE_MS}", f"--grpc-keepalive-timeout={TIMEOUT_MS}",
                       "--grpc-keepalive-permit-without-calls=true") as running:
        yield running


@pytest.fixture(scope="module")
def aging(repo):
    """Connections live about a second; pings only connections with calls in flight (Triton's default)."""
    with TritiumServer(repo, f"--grpc-keepalive-time={KEEPALIVE_MS}", f"--grpc-max-connection-age={AGE_MS}",
                       f"--grpc-max-connection-age-grace={GRACE_MS}") as running:
        yield running


def pings(raw: RawH2) -> list[bytes]:
    return [payload for kind, flags, _, payload in raw.frames if kind == PING and not flags]


def goaways(raw: RawH2) -> list[tuple[int, int]]:
    """(last stream id, error code) of each GOAWAY received."""
    return [struct.unpack(">II", payload[:8]) for kind, _, _, payload in raw.frames if kind == GOAWAY]


def infer(client: grpcclient.InferenceServerClient, seed: int) -> None:
    request, a, b = add_sub_request(seed=seed)
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)


# -- keepalive ---------------------------------------------------------------------------------

def test_a_client_that_went_silent_is_pinged_then_closed(pinging):
    raw = RawH2(pinging.grpc_url)   # acknowledges nothing
    try:
        closed_after = raw.read_until_closed(timeout_s=10)
    finally:
        raw.close()
    assert pings(raw) == [b"tritium\x00"]
    assert closed_after is not None and (KEEPALIVE_MS + TIMEOUT_MS) / 1000 * 0.9 < closed_after < 5
    assert goaways(raw) == []   # dropped as dead, not told to go


def test_a_client_that_answers_pings_stays_and_is_pinged_twice_without_data(pinging):
    raw = RawH2(pinging.grpc_url, answer_pings=True)
    try:
        assert raw.read_until_closed(timeout_s=2.0) is None
        assert len(pings(raw)) == 2   # --grpc-http2-max-pings-without-data's default
        request, a, b = add_sub_request(seed=3)
        answer = raw.call("ModelInfer", request.SerializeToString())
        assert answer.status == 0
        check_add_sub(service_pb2.ModelInferResponse.FromString(answer.messages[0]), a, b)
        assert raw.read_until_closed(timeout_s=1.0) is None
        assert len(pings(raw)) >= 3   # the answer's data let the pings start again
    finally:
        raw.close()


def test_tritonclient_calls_go_on_across_keepalive_pings(pinging):
    client = grpcclient.InferenceServerClient(pinging.grpc_url)
    try:
        for seed in range(3):
            infer(client, seed)
            time.sleep(KEEPALIVE_MS / 1000 * 2)
    finally:
        client.close()


# -- clients that ping too often (Triton's defaults: 5 minutes with calls in flight, 2 hours
# without, 2 strikes) ----------------------------------------------------------------------

def ping_until_answered(raw: RawH2, count: int) -> None:
    for number in range(count):
        raw.send(PING, 0, 0, b"client%02d" % number)
    deadline = time.monotonic() + 5
    while len([f for f in raw.frames if f[0] == PING and f[1] == ACK]) < count and not goaways(raw):
        assert time.monotonic() < deadline, raw.frames
        raw.read_some()


def test_a_client_pinging_too_often_is_told_too_many_pings_and_dropped(aging):
    raw = RawH2(aging.grpc_url)
    try:
        ping_until_answered(raw, 3)           # the first is free; two strikes are tolerated
        assert (0, 0xB) not in goaways(raw)
        raw.send(PING, 0, 0, b"client03")     # the third strike
        closed_after = raw.read_until_closed(timeout_s=5)
    finally:
        raw.close()
    assert closed_after is not None
    calm = [payload for kind, _, _, payload in raw.frames if kind == GOAWAY and payload[4:8] == b"\x00\x00\x00\x0b"]
    assert calm == [b"\x00\x00\x00\x00\x00\x00\x00\x0btoo_many_pings"]   # ENHANCE_YOUR_CALM, no stream taken


def test_data_sent_by_the_server_clears_the_strikes(pinging):
    raw = RawH2(pinging.grpc_url, answer_pings=True)
    try:
        for round_number in range(3):
            ping_until_answered(raw, 3)       # two strikes each round
            request, a, b = add_sub_request(seed=round_number)
            answer = raw.call("ModelInfer", request.SerializeToString())   # headers and data: strikes cleared
            assert answer.status == 0
        assert goaways(raw) == []
    finally:
        raw.close()


# -- connection age ----------------------------------------------------------------------------

def test_an_idle_connection_past_its_age_is_told_goaway_and_closed_and_never_pinged(aging):
    raw = RawH2(aging.grpc_url)
    try:
        closed_after = raw.read_until_closed(timeout_s=10)
    finally:
        raw.close()
    assert goaways(raw) == [(0, 0)]   # no stream taken, NO_ERROR
    assert closed_after is not None and AGE_MS / 1000 * 0.85 < closed_after < AGE_MS / 1000 * 1.1 + 2
    assert pings(raw) == []           # no calls in flight: no keepalive pings by default


def test_a_call_in_flight_past_the_age_is_answered_within_the_grace(aging):
    raw = RawH2(aging.grpc_url, answer_pings=True)
    try:
        stream = raw.start_call("ModelInfer")
        raw.send(DATA, END_STREAM, stream, grpc_message(whoami_request(1300)))
        answer = raw.wait(stream, timeout_s=10)
        assert answer.status == 0
        assert goaways(raw) == [(stream, 0)]   # told while the call was in flight; it still finished
        assert pings(raw)                      # a call in flight: pinged
        assert raw.read_until_closed(timeout_s=5) is not None
    finally:
        raw.close()


def test_a_call_still_running_when_the_grace_ends_is_cut(aging):
    raw = RawH2(aging.grpc_url, answer_pings=True)
    try:
        stream = raw.start_call("ModelInfer")
        raw.send(DATA, END_STREAM, stream, grpc_message(whoami_request(4000)))
        closed_after = raw.read_until_closed(timeout_s=10)
    finally:
        raw.close()
    assert closed_after is not None and closed_after < (AGE_MS * 1.1 + GRACE_MS) / 1000 + 1
    assert goaways(raw) == [(stream, 0)]
    assert raw.answers.get(stream) is None or raw.answers[stream].status is None


def test_tritonclient_carries_on_over_a_new_connection(aging):
    client = grpcclient.InferenceServerClient(aging.grpc_url)
    try:
        started = time.monotonic()
        seed = 0
        while time.monotonic() - started < 3 * AGE_MS / 1000:
            infer(client, seed)
            seed += 1
            time.sleep(0.1)
    finally:
        client.close()
    assert seed >= 10


def test_unset_flags_are_triton_s_defaults_and_bad_values_are_usage_errors(tmp_path):
    defaults = {option.key: option.settings.get("default") for option in OPTIONS}
    assert grpc_keepalive(defaults) == GrpcKeepalive(time_ms=7_200_000, timeout_ms=20_000, permit_without_calls=False,
                                                     max_pings_without_data=2, max_age_ms=0, max_age_grace_ms=0,
                                                     min_recv_ping_interval_ms=300_000, max_ping_strikes=2)
    result = CliRunner().invoke(gateway, ["--broker", "ipc:///nowhere", "--grpc-keepalive-time=-1"])
    assert result.exit_code == 2 and "--grpc-keepalive-time" in result.output
