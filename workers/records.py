"""``read_record`` for records whose kind the protocol fixes by their place: the first record of a
BATCH message, the INFER records after it, the BATCH_DONE an executor answers with, and the
RESPONSE_PART and RESPONSE of each response it sends on.

``read_record`` gives any ``Message``; checking each record's kind where nothing else can come
would cost the request path a check per record. These names are ``read_record`` itself, typed
for mypy as returning the kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritium.protocol import read_record

if TYPE_CHECKING:
    from tritium.protocol import Batch, BatchDone, Infer, Response, ResponsePart

    def read_batch(frame) -> tuple[Batch, memoryview, int]: ...
    def read_infer(frame) -> tuple[Infer, memoryview, int]: ...
    def read_batch_done(frame) -> tuple[BatchDone, memoryview, int]: ...
    def read_response_part(frame) -> tuple[ResponsePart, memoryview, int]: ...
    def read_response(frame) -> tuple[Response, memoryview, int]: ...
else:
    read_batch = read_infer = read_batch_done = read_response_part = read_response = read_record
