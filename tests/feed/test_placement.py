"""placement.py: where a panel lives (GPU, pinned, memmap). The read-ahead of a store's pages moved to system/pages.py
(tests/system/test_pages.py)."""

from __future__ import annotations

import pytest

from kline_store.feed import placement
from kline_store.errors import InputError

GB = 1 << 30


@pytest.mark.parametrize(
    "nbytes, free, avail, expect",
    [
        (3 * GB, 80 * GB, 64 * GB, "device"),      # a whole market fits on one modern GPU
        (30 * GB, 40 * GB, 256 * GB, "pinned"),    # too big for half the GPU, fits in a quarter of RAM
        (30 * GB, 40 * GB, 64 * GB, "memmap"),     # fits nowhere: stream from the memmap
        (1, None, None, "memmap"),                 # unknown sizes: be conservative
        (10 * GB, 20 * GB, 0, "device"),           # exactly half the free device memory still fits
    ],
)
def test_auto_placement_with_cuda(nbytes, free, avail, expect):
    assert placement.choose_placement(nbytes, cuda=True, device_free=free, host_available=avail) == expect


def test_placement_without_cuda_and_forced():
    assert placement.choose_placement(GB, cuda=False, host_available=64 * GB) == "memmap"   # shared page cache
    assert placement.choose_placement(100 * GB, cuda=True, requested="device", device_free=0) == "device"
    assert placement.choose_placement(1, cuda=False, requested="device") == "device"
    assert placement.choose_placement(1, cuda=True, requested="memmap", device_free=80 * GB) == "memmap"
    with pytest.raises(InputError, match="pinned"):
        placement.choose_placement(1, cuda=False, requested="pinned")
    with pytest.raises(InputError, match="placement must be one of"):
        placement.choose_placement(1, cuda=True, requested="gpu")


def test_memory_probes():
    assert placement.host_available_bytes() > 0
    assert placement.device_free_bytes("cpu") is None
    assert placement.usable_cores() >= 1
