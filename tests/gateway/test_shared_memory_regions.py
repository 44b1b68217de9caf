"""A gateway's open shared memory regions: an output region unregistered while its request runs
still gets the request's outputs, as Triton lets requests in flight finish."""

from __future__ import annotations

from multiprocessing import shared_memory

import pytest

from tritium.errors import NotFound
from tritium.gateway.shared_memory import SharedMemoryRef, SharedMemoryRegions
from tritium.protocol import SharedMemoryRegion


@pytest.fixture
def block():
    memory = shared_memory.SharedMemory(create=True, size=64)
    yield memory
    memory.close()
    memory.unlink()


def test_an_output_region_unregistered_while_its_request_runs_still_gets_the_outputs(block):
    regions = SharedMemoryRegions()
    regions.apply([SharedMemoryRegion("out", "/" + block.name, 8, 32)])
    ref = SharedMemoryRef("out", 4, 16)
    held = regions.check(ref)                 # the request starts
    regions.apply([])                         # the client unregisters the region meanwhile
    with pytest.raises(NotFound):
        regions.check(ref)                    # a new request cannot name it
    assert regions.status(None) == []
    regions.write(ref, "OUTPUT0", b"\x07" * 16, held)
    assert bytes(block.buf[12:28]) == b"\x07" * 16 and bytes(block.buf[28:32]) == b"\0" * 4
