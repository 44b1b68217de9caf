"""model_warmup run through a BatchExecutor with an in-test instance: what a decoupled model's
response senders send during warmup, whenever it comes, is the warmup's, not a client's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.errors import InternalError
from tritium.workers.backends.base import InferenceResponse, Instance
from tritium.workers.executor import BatchExecutor
from tritium.workers.warmup import WarmupFailed, warm_up

DECOUPLED_WITH_WARMUP = """
name: "m"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
model_transaction_policy { decoupled: true }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]
"""


class FailsFromAThreadAsItReturns(Instance):
    """Its thread sends the one request's final response, an error, while execute returns."""

    def execute(self, requests):
        sender = requests[0].response_sender
        threading.Thread(target=sender, args=(InferenceResponse(error=InternalError("late failure")), True)).start()
        time.sleep(0.05)   # the thread is inside the send: the request is no longer open, its response not out
        return None


def test_a_final_error_sent_from_a_thread_as_execute_returns_fails_the_warmup_and_reaches_no_client():
    config = text_format.Parse(DECOUPLED_WITH_WARMUP, model_config_pb2.ModelConfig())
    to_broker: list[list] = []
    executor = BatchExecutor(FailsFromAThreadAsItReturns(), config, send=to_broker.append)
    send_part = executor._send_part

    def slow_send_part(batch: int, index: int, parts: list) -> None:   # widens the moment between the two
        time.sleep(0.3)
        send_part(batch, index, parts)

    executor._send_part = slow_send_part
    with pytest.raises(WarmupFailed, match="failed to run warmup sample 'w': late failure; "):
        warm_up(executor, config, Path("/nonexistent"))
    time.sleep(0.4)
    assert to_broker == []
    assert executor.send == to_broker.append
