"""The typed fast path for the usual inference body (gateway/http_fast_decode.py) changes
nothing: every body decodes to the same request, or fails with the same error, with it and
without it (the general reader alone)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from tritium.errors import TritiumError
from tritium.gateway import http_codec
from tritium.gateway.http_fast_decode import decode_usual_request

X = np.arange(16, dtype=np.float32).tobytes()
Y = np.arange(16, 32, dtype=np.float32).tobytes()


def binary_input(name: str, size: int = 64, **extra) -> dict:
    return {"name": name, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": size}, **extra}


PERF_ANALYZER = {"inputs": [binary_input("INPUT0"), binary_input("INPUT1")],
                 "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                             {"name": "OUTPUT1", "parameters": {"binary_data": True}}]}

USUAL = {
    "perf_analyzer's": PERF_ANALYZER,
    "with an id": {**PERF_ANALYZER, "id": "req-7"},
    "outputs without parameters": {**PERF_ANALYZER, "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]},
    "JSON outputs": {**PERF_ANALYZER, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]},
    "an empty output list": {**PERF_ANALYZER, "outputs": []},
    "no outputs": {"inputs": PERF_ANALYZER["inputs"]},
    "a leading id, as tritonclient writes it": json.dumps({"id": "req-9", **PERF_ANALYZER}).encode(),
    "a leading id, compact": orjson.dumps({"id": "é-1", **PERF_ANALYZER}),
    "an empty leading id": orjson.dumps({"id": "", **PERF_ANALYZER}),
    "a leading id with an escape (decoded whole)": b'{"id":"a\\"b",' + orjson.dumps(PERF_ANALYZER)[1:],
}

OTHER = {
    "an id with a colon": {**PERF_ANALYZER, "id": "a:b"},
    "a leading id with a colon": orjson.dumps({"id": "a:b", **PERF_ANALYZER}),
    "a leading id given twice": orjson.dumps({"id": "first", **PERF_ANALYZER, "id2": 0}).replace(b'"id2":0', b'"id":"second"'),
    "a leading id that is no UTF-8": b'{"id":"\xff",' + orjson.dumps(PERF_ANALYZER)[1:],
    "a leading id and nothing else": b'{"id":"x",}',
    "a request parameter": {**PERF_ANALYZER, "parameters": {"sequence_id": 3, "sequence_start": True}},
    "binary outputs by default": {**PERF_ANALYZER, "parameters": {"binary_data_output": True}},
    "a classification": {**PERF_ANALYZER, "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
    "JSON data as well": {"inputs": [binary_input("INPUT0", data=[1.0] * 16), binary_input("INPUT1")]},
    "a negative size": {"inputs": [binary_input("INPUT0", -64), binary_input("INPUT1")]},
    "sizes past the bytes": {"inputs": [binary_input("INPUT0", 100), binary_input("INPUT1")]},
    "bytes left over": {"inputs": [binary_input("INPUT0", 32), binary_input("INPUT1")]},
    "a boolean in the shape": {"inputs": [{**binary_input("INPUT0"), "shape": [True, 16]}, binary_input("INPUT1")]},
    "an unknown datatype": {"inputs": [{**binary_input("INPUT0"), "datatype": "FP8"}, binary_input("INPUT1")]},
    "an empty name": {"inputs": [binary_input(""), binary_input("INPUT1")]},
    "a dim past 64 bits": json.dumps({"inputs": [{**binary_input("INPUT0"), "shape": [2**64, 16]},
                                                 binary_input("INPUT1")]}).encode(),   # orjson cannot write it
    "an id that is a number": {**PERF_ANALYZER, "id": 7},
    "no inputs": {"inputs": [], "outputs": PERF_ANALYZER["outputs"]},
    "a shared memory output": {**PERF_ANALYZER, "outputs": [{"name": "OUTPUT0", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 64}}]},
}


def body_of(document: dict | bytes) -> tuple[bytes, int]:
    header = document if isinstance(document, bytes) else orjson.dumps(document)
    return header + X + Y, len(header)


def decoded(body: bytes, header_length: int):
    try:
        return http_codec.decode_infer_request("add_sub", None, body, header_length)
    except TritiumError as exc:
        return type(exc), exc.message


@pytest.mark.parametrize("document", USUAL.values(), ids=USUAL.keys())
def test_the_usual_body_takes_the_fast_path_and_decodes_as_the_general_reader_does(document, monkeypatch):
    body, header_length = body_of(document)
    assert decode_usual_request("add_sub", None, body[:header_length], memoryview(body)[header_length:]) is not None
    fast = decoded(body, header_length)
    monkeypatch.setattr(http_codec, "decode_usual_request", lambda *args: None)
    assert fast == decoded(body, header_length)
    request, _ = fast
    assert [bytes(t.data) for t in request.inputs] == [X, Y][:len(request.inputs)]


@pytest.mark.parametrize("document", OTHER.values(), ids=OTHER.keys())
def test_any_other_body_is_left_to_the_general_reader(document, monkeypatch):
    body, header_length = body_of(document)
    assert decode_usual_request("add_sub", None, body[:header_length], memoryview(body)[header_length:]) is None
    before = decoded(body, header_length)
    monkeypatch.setattr(http_codec, "decode_usual_request", lambda *args: None)
    assert before == decoded(body, header_length)


def test_a_key_given_twice_keeps_its_first_value_as_triton_reads_it(monkeypatch):
    first = orjson.dumps(binary_input("INPUT0")).decode()
    header = ('{"inputs": [' + first + ', ' + orjson.dumps(binary_input("INPUT1")).decode() + '], '
              '"id": "first", "id": "second"}').encode()
    body, header_length = body_of(header)
    assert decode_usual_request("add_sub", None, header, memoryview(body)[header_length:]) is None
    request, _ = decoded(body, header_length)
    assert request.id == "first"


def test_a_header_seen_before_reads_as_it_did_and_shares_nothing_a_caller_may_change():
    header = orjson.dumps({**PERF_ANALYZER, "id": "again"})
    first = decode_usual_request("add_sub", None, header, memoryview(X + Y))
    first.inputs[0].shape.append(99)
    first.outputs[0].parameters["binary_data"] = False
    second = decode_usual_request("m", "2", header, memoryview(Y + X))
    assert (second.model, second.version, second.id) == ("m", "2", "again")
    assert [(t.name, t.shape, bytes(t.data)) for t in second.inputs] == [("INPUT0", [1, 16], Y), ("INPUT1", [1, 16], X)]
    assert [(o.name, o.parameters) for o in second.outputs] == [("OUTPUT0", {"binary_data": True}),
                                                                ("OUTPUT1", {"binary_data": True})]


@pytest.mark.parametrize("binary", [X + Y + b"\x00", X], ids=["bytes left over", "sizes past the bytes"])
def test_a_header_seen_before_with_other_bytes_after_it_is_left_to_the_general_reader(binary):
    header = orjson.dumps(PERF_ANALYZER)
    assert decode_usual_request("add_sub", None, header, memoryview(X + Y)) is not None
    assert decode_usual_request("add_sub", None, header, memoryview(binary)) is None


def test_headers_past_16_kib_are_read_each_time_and_not_kept():
    from tritium.gateway.http_fast_decode import _read
    header = orjson.dumps({**PERF_ANALYZER, "id": "x" * 17_000})
    kept = _read.cache_info().currsize
    request = decode_usual_request("add_sub", None, header, memoryview(X + Y))
    assert request is not None and request.id == "x" * 17_000
    assert _read.cache_info().currsize == kept


def test_a_client_numbering_its_requests_is_remembered_once_for_all_its_ids():
    from tritium.gateway.http_fast_decode import _read
    decode_usual_request("add_sub", None, json.dumps({"id": "n-0", **PERF_ANALYZER}).encode(), memoryview(X + Y))
    kept = _read.cache_info().currsize
    for number in range(1, 50):
        header = json.dumps({"id": f"n-{number}", **PERF_ANALYZER}).encode()
        assert decode_usual_request("add_sub", None, header, memoryview(X + Y)).id == f"n-{number}"
    assert _read.cache_info().currsize == kept
