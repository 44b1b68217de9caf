"""Cost of the hot-path message kinds: building and encoding each as its type, and reading a record
back into its type, against packing and unpacking the same header as a plain dict with msgpack.

    python bench/wire_messages.py [--number 100000]

Prints nanoseconds per message (the best of seven timeit runs).
"""

from __future__ import annotations

import argparse
import timeit

from bench.harness import table
from tritium.protocol import Batch, BatchDone, Infer, Response, ResponsePart, decode, encode, read_record

INPUTS = [["INPUT0", "FP32", [1, 16], 64, False], ["INPUT1", "FP32", [1, 16], 64, False]]
OUTPUTS = [["OUTPUT0", "FP32", [1, 16], 64, False], ["OUTPUT1", "FP32", [1, 16], 64, False]]
INLINE = [b"\0" * 64, b"\0" * 64]

# What the serving path builds per request (INFER, RESPONSE) and per batch of four (BATCH, BATCH_DONE).
BUILDERS = {
    "INFER": (lambda: Infer(7, "add_sub", INPUTS, version=1, batch_size=1), INLINE),
    "BATCH": (lambda: Batch(3, 4), ()),
    "BATCH_DONE": (lambda: BatchDone(3, [True] * 4, [0] * 4, [1000, 2000, 3000]), ()),
    "RESPONSE": (lambda: Response(7, OUTPUTS), INLINE),
    "RESPONSE_PART": (lambda: ResponsePart(3, 1), ()),
}


def nanoseconds(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e9


def measure(number: int) -> list[list]:
    rows = []
    for name, (build, inline) in BUILDERS.items():
        record = build().encode(inline)
        header = build().to_wire()
        rows.append([name,
                     round(nanoseconds(lambda: build().encode(inline), number)),
                     round(nanoseconds(lambda: encode(header, inline), number)),
                     round(nanoseconds(lambda: read_record(record), number)),
                     round(nanoseconds(lambda: decode(record), number))])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=100_000, help="calls per timeit run")
    args = parser.parse_args()
    print(table(["kind", "build + encode (ns)", "msgpack of the dict (ns)", "read_record (ns)",
                 "msgpack to a dict (ns)"], measure(args.number)))


if __name__ == "__main__":
    main()
