"""The usual inference body in one typed pass: binary inputs, outputs by name.

Most requests (perf_analyzer's, tritonclient's with binary tensors) carry the same few keys:
each input its name, shape, datatype and ``binary_data_size``, each output its name and
perhaps ``binary_data``, and perhaps an ``id``. msgspec decodes exactly that shape into
structs in about a microsecond, where reading a generic document and checking each value in
Python costs ten (measured: 0.9 against 9.9 us for add_sub's two inputs and two outputs).

Anything else, valid or not, is left to the general reader in ``http_codec``, which has every
check and Triton's wording of every error: ``decode_usual_request`` returns None rather than
raise, and what it does return is what the general reader would.

A client sends the same header with every request (only the tensor bytes after it change), so
what a header says is remembered by its bytes (``_read``, the last 256 headers of up to
16 KiB): a header seen before costs a dictionary lookup instead of a decoding. A request id
that leads the header (tritonclient writes it first) is left out of those bytes, so that a
client numbering its requests is remembered too.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, NamedTuple

import msgspec

from tritium import datatypes
from tritium.gateway.inference import InferRequest, InputTensor, RequestedOutput

# orjson, under the general reader, reads integers past 64 bits as floats, which no size or dim may
# be; msgspec bounds stop at 63 bits, and the few between go to the general reader too.
_Unsigned = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Name = Annotated[str, msgspec.Meta(min_length=1)]


class _BinaryInput(msgspec.Struct, forbid_unknown_fields=True):
    binary_data_size: _Unsigned


class _Input(msgspec.Struct, forbid_unknown_fields=True):
    name: _Name
    shape: list[_Unsigned]
    datatype: str
    parameters: _BinaryInput


class _OutputParameters(msgspec.Struct, forbid_unknown_fields=True):
    binary_data: bool


class _Output(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    parameters: _OutputParameters | msgspec.UnsetType = msgspec.UNSET


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    inputs: list[_Input]
    outputs: list[_Output] | msgspec.UnsetType = msgspec.UNSET
    id: str | msgspec.UnsetType = msgspec.UNSET


_DECODER = msgspec.json.Decoder(_Request)


# Headers longer than this are decoded each time, never kept.
_KEPT_BYTES = 16 * 1024
# A leading id that JSON reads as its bytes (no escapes, no control characters; no ':', which
# the count of keys would see): {"id": "...", then the rest of the header.
_LEADING_ID = re.compile(rb'\{"id":[ ]?"([^"\\\x00-\x1f:]*)",[ ]?')


class _UsualHeader(NamedTuple):
    """What a usual header says, read once."""

    inputs: tuple[tuple[str, str, tuple[int, ...], int, int], ...]   # name, datatype, shape, its bytes' span
    size: int   # the binary bytes its inputs take, all of them
    outputs: tuple[tuple[str, bool | None], ...] | None   # name, binary_data (None: not given)
    id: str | None   # None: not given

    def request(self, model: str, version: str | None, binary: memoryview, request_id: str | None = None
                ) -> InferRequest:
        """A new request of this header's, with ``request_id`` if given (nothing shared that a
        caller may change)."""
        inputs = [InputTensor(name, datatype, list(shape), binary[start:stop])
                  for name, datatype, shape, start, stop in self.inputs]
        outputs = None if self.outputs is None else [
            RequestedOutput(name, {} if binary_data is None else {"binary_data": binary_data})
            for name, binary_data in self.outputs]
        return InferRequest(model=model, version=version, inputs=inputs, outputs=outputs,
                            id=request_id if request_id is not None else self.id or "")


def decode_usual_request(model: str, version: str | None, header: bytes, binary: memoryview) -> InferRequest | None:
    """The request in ``header`` (its JSON) and ``binary`` (the tensor bytes after it), or None
    when it is not of the usual shape, or is wrong in any way (the general reader says how)."""
    leading_id = _LEADING_ID.match(header)
    key = header if leading_id is None else b"{" + header[leading_id.end():]
    usual = _read(key) if len(key) <= _KEPT_BYTES else _read.__wrapped__(key)
    if usual is None or usual.size != len(binary):   # sizes past the bytes, or bytes left over
        return None
    if leading_id is None:
        return usual.request(model, version, binary)
    if usual.id is not None:   # an id given twice: Triton keeps the first (the general reader knows)
        return None
    try:
        request_id = leading_id.group(1).decode()
    except UnicodeDecodeError:
        return None
    return usual.request(model, version, binary, request_id)


@functools.lru_cache(maxsize=256)
def _read(header: bytes) -> _UsualHeader | None:
    try:
        document = _DECODER.decode(header)
    except msgspec.DecodeError:   # not JSON, or not of the usual shape (ValidationError)
        return None
    if _keys(document) != header.count(b":"):   # a key given twice (Triton keeps the first), or a ':' in a string
        return None
    inputs, offset = [], 0
    for item in document.inputs:
        if datatypes.from_name(item.datatype) is None:
            return None
        size = item.parameters.binary_data_size
        inputs.append((item.name, item.datatype, tuple(item.shape), offset, offset + size))
        offset += size
    if not inputs:
        return None
    outputs = None
    if document.outputs:   # an empty list asks for every output, as none does
        outputs = tuple((o.name, None if o.parameters is msgspec.UNSET else o.parameters.binary_data)
                        for o in document.outputs)
    return _UsualHeader(tuple(inputs), offset, outputs, None if document.id is msgspec.UNSET else document.id)


def _keys(document: _Request) -> int:
    """The keys the document's text had: every object's own (each followed by one ':').

    Counted from the structs above: a field added to one must be counted here (a miscount
    only sends every body to the general reader).
    """
    keys = 1 + (document.outputs is not msgspec.UNSET) + (document.id is not msgspec.UNSET)
    keys += 5 * len(document.inputs)   # name, shape, datatype, parameters, binary_data_size
    if document.outputs is not msgspec.UNSET:
        keys += sum(1 if o.parameters is msgspec.UNSET else 3 for o in document.outputs)
    return keys
