"""Which headers become request parameters, and as what text."""

from __future__ import annotations

import click
import pytest

from tritium.errors import InvalidArgument
from tritium.gateway.header_forwarding import compile_pattern, forwarded_grpc_metadata, forwarded_http_headers
from tritium.options import HEADER_PATTERN


def test_the_pattern_matches_anywhere_in_the_name_and_ignores_case():
    pattern = compile_pattern("tenant")
    headers = [(b"X-Tenant-Id", b"a"), (b"TENANT", b"b"), (b"x-user", b"c")]
    assert forwarded_http_headers(pattern, headers) == {"X-Tenant-Id": "a", "TENANT": "b"}


def test_a_leading_case_sensitive_flag_is_taken_as_triton_takes_it():
    """Triton's own tests write (?-i)MY_HEADER.*: RE2 reads it after Triton's (?i); Python's re would refuse it."""
    pattern = compile_pattern("(?-i)MY_HEADER.*")
    assert forwarded_http_headers(pattern, [(b"MY_HEADER_A", b"1"), (b"my_header_b", b"2")]) == {"MY_HEADER_A": "1"}


def test_no_pattern_is_no_forwarding():
    assert compile_pattern(None) is None and compile_pattern("") is None


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                                  "headers", "binary_data_output", "triton_enable_empty_final_response",
                                  "triton_anything"])
def test_names_of_parameters_triton_reads_are_refused(name):
    with pytest.raises(InvalidArgument) as refused:
        forwarded_http_headers(compile_pattern(".*"), [(b"x-ok", b"1"), (name.encode(), b"2")])
    assert refused.value.message == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def test_a_repeated_header_keeps_its_last_value():
    assert forwarded_http_headers(compile_pattern("^x-"), [(b"x-a", b"1"), (b"x-a", b"2")]) == {"x-a": "2"}


def test_http_header_values_are_read_as_utf8():
    assert forwarded_http_headers(compile_pattern("x-"), [(b"X-Name", "é".encode()), (b"x-raw", b"\xff")]) == {
        "X-Name": "é", "x-raw": "\ufffd"}


def test_grpc_metadata_from_either_server_is_text_with_bin_values_decoded():
    pattern = compile_pattern("^x-")
    # tritium's own server hands the header block's bytes, a -bin value still in base64
    assert forwarded_grpc_metadata(pattern, [(b"x-a", b"1"), (b"x-k-bin", b"AUFC")]) == {"x-a": "1", "x-k-bin": "\x01AB"}
    # grpc.aio's invocation_metadata: str, and a -bin value already decoded to bytes
    assert forwarded_grpc_metadata(pattern, [("x-a", "1"), ("x-k-bin", b"\x01AB")]) == {"x-a": "1", "x-k-bin": "\x01AB"}


def test_a_bin_value_is_decoded_only_when_forwarded_and_bad_base64_is_a_client_error():
    pattern = compile_pattern("^x-")
    assert forwarded_grpc_metadata(pattern, [(b"other-bin", b"YWJjZ"), (b"x-a", b"1")]) == {"x-a": "1"}
    with pytest.raises(InvalidArgument) as refused:
        forwarded_grpc_metadata(pattern, [(b"x-k-bin", b"YWJjZ")])
    assert refused.value.message == "metadata 'x-k-bin' is not valid base64"


def test_the_command_line_takes_tritons_case_sensitive_form_and_refuses_what_is_no_pattern():
    assert HEADER_PATTERN.convert("(?-i)MY_HEADER.*", None, None) == "(?-i)MY_HEADER.*"
    with pytest.raises(click.BadParameter, match="'x-\\(' is not a regular expression"):
        HEADER_PATTERN.convert("x-(", None, None)
