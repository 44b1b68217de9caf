"""The generate extension's request reading: a repeated input key is refused, as Triton refuses it."""

from __future__ import annotations

import pytest

from tests.gateway.test_validation import spec, tensor_config
from tritium.errors import InvalidArgument
from tritium.gateway.generate import generate_request, repeated_inputs

MODEL = spec(inputs=[tensor_config("A", data_type="TYPE_STRING", dims=(1,))], max_batch_size=0)


@pytest.mark.parametrize("body", [
    rb'{"A": "x", "A": "y"}',
    rb'{"A": "x", "\u0041": "y"}',   # the same key written with an escape
])
def test_an_input_given_twice_is_refused_however_its_key_is_written(body):
    with pytest.raises(InvalidArgument) as refused:
        generate_request(MODEL, None, {"A": "y"}, body)
    assert refused.value.message == "input 'A' already exists in request"


def test_an_input_name_that_appears_again_as_a_value_is_no_repeat():
    assert repeated_inputs(MODEL, rb'{"A": "x", "B": ["A"]}') == []
