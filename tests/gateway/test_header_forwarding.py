"""Which headers become request parameters, and as what text."""

from __future__ import annotations

import pytest

from tritium.errors import InvalidArgument
from tritium.gateway.header_forwarding import (compile_pattern, forwarded_headers, grpc_metadata_text,
                                               http_header_text)


def test_the_pattern_matches_anywhere_in_the_name_and_ignores_case():
    pattern = compile_pattern("tenant")
    headers = [("X-Tenant-Id", "a"), ("TENANT", "b"), ("x-user", "c")]
    assert forwarded_headers(pattern, headers) == {"X-Tenant-Id": "a", "TENANT": "b"}


def test_no_pattern_is_no_forwarding():
    assert compile_pattern(None) is None and compile_pattern("") is None


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                  "headers", "binary_data_output", "triton_enable_empty_final_response",
                                  "triton_anything"])
def test_names_of_parameters_triton_reads_are_refused(name):
    with pytest.raises(InvalidArgument) as refused:
        forwarded_headers(compile_pattern(".*"), [("x-ok", "1"), (name, "2")])
    assert refused.value.message == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def test_a_repeated_header_keeps_its_last_value():
    assert forwarded_headers(compile_pattern("^x-"), [("x-a", "1"), ("x-a", "2")]) == {"x-a": "2"}


def test_http_headers_are_text_with_utf8_values():
    assert list(http_header_text([(b"X-Name", "é".encode()), (b"x-raw", b"\xff")])) == [
        ("X-Name", "é"), ("x-raw", "\ufffd")]


def test_grpc_metadata_from_either_server_is_text_with_bin_values_decoded():
    # tritium's own server hands the header block's bytes, a -bin value still in base64
    assert list(grpc_metadata_text([(b"x-a", b"1"), (b"x-k-bin", b"AUFC")])) == [("x-a", "1"), ("x-k-bin", "\x01AB")]
    # grpc.aio's invocation_metadata: str, and a -bin value already decoded to bytes
    assert list(grpc_metadata_text([("x-a", "1"), ("x-k-bin", b"\x01AB")])) == [("x-a", "1"), ("x-k-bin", "\x01AB")]
