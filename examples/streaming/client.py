"""Stream a decoupled model's responses as they come, over gRPC, with tritium.client (sync and asyncio).

    python examples/streaming/client.py [--url grpc://localhost:8001]
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

import tritium.client

TEXT = "responses arrive one word at a time"


def words(url: str, text: str) -> list[str]:
    """Each response's word, in the order they came."""
    request = np.array([text.encode()], dtype=object)
    with tritium.client.connect(url) as client:
        return [out["WORD"][0].decode() for out in client.stream("word_stream", TEXT=request)]


async def words_async(url: str, text: str) -> list[str]:
    """The same with the asyncio client."""
    request = np.array([text.encode()], dtype=object)
    async with tritium.client.connect_async(url) as client:
        return [out["WORD"][0].decode() async for out in client.stream("word_stream", TEXT=request)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="grpc://localhost:8001")
    url = parser.parse_args().url
    print(words(url, TEXT))
    print(asyncio.run(words_async(url, TEXT)))
