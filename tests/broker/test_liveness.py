"""Which peers the broker still hears from, and a broker that was itself stopped."""

from __future__ import annotations

import pytest

from tritium.broker.liveness import PeerLiveness
from tritium.protocol import MISSED_HEARTBEATS, own_stall

INTERVAL_S = 1.0


def test_a_peer_silent_past_the_limit_is_reported_once():
    liveness = PeerLiveness(INTERVAL_S)
    liveness.heard(b"gw", 10.0)
    assert liveness.silent(10.0 + INTERVAL_S * MISSED_HEARTBEATS) == []
    assert liveness.silent(10.1 + INTERVAL_S * MISSED_HEARTBEATS) == [b"gw"]
    assert liveness.silent(20.0) == []


def test_the_usual_lateness_of_a_heartbeat_is_no_stall():
    assert own_stall(10.0, 11.0, INTERVAL_S) == 0.0
    assert own_stall(10.0, 11.4, INTERVAL_S) == 0.0
    assert own_stall(10.0, 13.9, INTERVAL_S) == pytest.approx(2.9)


def test_a_short_stop_of_the_broker_does_not_drop_a_peer_heard_just_before_it():
    """Heard 0.4 s before the previous heartbeat, the broker stopped (Ctrl-Z) for 2.9 s: the peer
    was silent 4.4 s by the clock, but only 1.5 of them while the broker listened."""
    liveness = PeerLiveness(INTERVAL_S)
    liveness.heard(b"gw", -0.4)
    last_beat, now = 0.0, 0.05 + 2.9 + INTERVAL_S
    liveness.excuse(own_stall(last_beat, now, INTERVAL_S), now)
    assert liveness.silent(now) == []


def test_a_peer_that_went_silent_is_still_dropped_after_a_stop():
    liveness = PeerLiveness(INTERVAL_S)
    liveness.heard(b"gw", 0.0)
    liveness.excuse(own_stall(0.0, 10.0, INTERVAL_S), 10.0)   # stopped 9 s
    assert liveness.silent(10.0) == []
    assert liveness.silent(10.0 + INTERVAL_S * MISSED_HEARTBEATS + 0.1) == [b"gw"]


def test_an_excuse_never_dates_a_peer_after_now():
    liveness = PeerLiveness(INTERVAL_S)
    liveness.heard(b"gw", 9.9)   # heard in the turn that found the stall
    liveness.excuse(5.0, 10.0)
    assert liveness.silent(10.0 + INTERVAL_S * MISSED_HEARTBEATS + 0.05) == [b"gw"]
