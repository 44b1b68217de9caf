"""Reading an instance's BATCH_DONE message back: the record and each request's outputs as arrays."""

from __future__ import annotations

import numpy as np

from tritium.protocol import read_record, tensor_views


def parse_done(parts: list):
    """(BatchDone, [(Response, {name: array or BYTES bytes}) per request])."""
    done, _, _ = read_record(parts[0])
    responses, position = [], 1
    for count in done.response_frames:
        header, record, offset = read_record(parts[position])
        assert header.external == count
        external = parts[position + 1:position + 1 + count]
        position += 1 + count
        descriptors = header.outputs or []
        arrays = {}
        for descriptor, view in zip(descriptors, tensor_views(descriptors, record, offset, external)):
            name, datatype, shape = descriptor[0], descriptor[1], descriptor[2]
            assert descriptor[3] == len(view)
            if datatype == "BYTES":
                arrays[name] = bytes(view)
            else:
                dtype = {"FP32": "<f4", "INT64": "<i8"}[datatype]
                arrays[name] = np.frombuffer(bytes(view), dtype=dtype).reshape(shape)
        responses.append((header, arrays))
    assert position == len(parts)           # every frame accounted for
    assert len(done.ok) == len(done.response_frames)
    return done, responses
