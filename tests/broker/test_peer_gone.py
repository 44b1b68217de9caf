"""What the broker says when a peer it sends to has left: a departed gateway is forgotten
quietly; answers lost to a vanished peer are warned about, once per peer."""

from __future__ import annotations

import logging

import pytest
import zmq

from tritium.broker.server import Broker, BrokerSettings
from tritium.protocol import ControlReply, Heartbeat


@pytest.fixture
def broker(tmp_path):
    context = zmq.Context()
    server = Broker(BrokerSettings((str(tmp_path),), f"ipc://{tmp_path}/frontend", f"ipc://{tmp_path}/backend",
                                   metrics=None), context)
    yield server
    server.frontend.close(0)
    server.backend.close(0)
    context.term()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_gateway_that_left_is_forgotten_without_a_warning(broker, caplog):
    broker.gateways.add(b"gw-gone")
    with caplog.at_level(logging.INFO, logger="tritium.broker.server"):
        for _ in range(3):
            broker._send(broker.frontend, [b"gw-gone", Heartbeat(7, 1.0).encode()])
    assert b"gw-gone" not in broker.gateways
    assert _warnings(caplog) == []
    assert [r.getMessage() for r in caplog.records] == ["gateway gw-gone disconnected"]


def test_answers_lost_to_a_vanished_peer_are_warned_about_once(broker, caplog):
    answer = ControlReply(1, {}).encode()
    with caplog.at_level(logging.INFO, logger="tritium.broker.server"):
        for _ in range(3):
            broker._send(broker.frontend, [b"asker", answer])
            broker._send(broker.frontend, [b"asker", Heartbeat().encode(), answer])
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("cannot send to peer b'asker'")
