"""The generate extension's request reading: a repeated input key is refused, as Triton refuses it."""

from __future__ import annotations

import numpy as np
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
    assert refused.value.message == "[request id: <id_unknown>] input 'A' already exists in request"


def test_an_input_name_that_appears_again_as_a_value_is_no_repeat():
    assert repeated_inputs(MODEL, rb'{"A": "x", "B": ["A"]}') == []


# As Triton shapes an input: the top-level array's length is the element count, the fixed dims
# divide it, the innermost variable dim takes the rest, the others 1 (the batch dim included).
# Each case, the empty array and the error texts too, checked side by side with Triton 2.51 (its
# later sources word a count too small differently, and refuse an empty array).
@pytest.mark.parametrize("max_batch_size, dims, value, shape, data", [
    (64, (-1,), [[1], [2]], [1, 2], [1.0, 2.0]),   # nested arrays read flat against that count
    (64, (-1,), [1, 2, 3], [1, 3], [1.0, 2.0, 3.0]),
    (0, (2, -1), [1, 2, 3, 4, 5, 6], [2, 3], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    (8, (4,), [1, 2, 3, 4], [1, 4], [1.0, 2.0, 3.0, 4.0]),
    (0, (-1, -1), 5, [1, 1], [5.0]),
    (64, (-1,), [], [1, 0], []),
    (64, (-1,), [[[[[[[[1.5]]]]]]]], [1, 1], [1.5]),
])
def test_an_input_is_shaped_as_triton_shapes_it(max_batch_size, dims, value, shape, data):
    model = spec(inputs=[tensor_config("X", dims=dims)], max_batch_size=max_batch_size)
    (given,) = generate_request(model, None, {"X": value}).inputs
    assert given.shape == shape
    assert np.frombuffer(given.data, np.float32).tolist() == data


@pytest.mark.parametrize("dims, value, message", [
    ((-1,), [[1, 2]], "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ((-1,), [[1, 2], [3]], "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ((-1,), [[], [1]], "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ((4,), [1, 2, 3], "The schema can not convert input 'X' to tensor with proper shape"),
])
def test_an_input_that_does_not_fit_gets_triton_s_words(dims, value, message):
    model = spec(inputs=[tensor_config("X", dims=dims)], max_batch_size=64)
    with pytest.raises(InvalidArgument) as refused:
        generate_request(model, None, {"X": value})
    assert refused.value.message == message


def test_an_input_nested_deeper_than_python_s_recursion_limit_is_read():
    deep: list = [3]
    for _ in range(2000):
        deep = [deep]
    model = spec(inputs=[tensor_config("X", dims=(-1,))], max_batch_size=64)
    (given,) = generate_request(model, None, {"X": deep}).inputs
    assert np.frombuffer(given.data, np.float32).tolist() == [3.0]
