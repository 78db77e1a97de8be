"""system/pages.py: the background read-ahead of a store's pages: mapped from the shared page cache, never copied
into private memory (moved from tests/feed/test_placement.py with the code)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from kline_store.system import pages


def _mapping_kib(addr: int, key: str) -> int:
    """One field (Rss, Anonymous, ...) of the mapping starting at ``addr``, from /proc/self/smaps."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{addr:x}" and " " in line:
            for field in lines[i + 1:]:
                if field.startswith(key + ":"):
                    return int(field.split()[1])
    raise AssertionError(f"mapping {addr:x} not found")


def _private_map(path) -> np.ndarray:
    """The file as a float32 array over a private mapping, as a store's snapshot maps its data file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.float32)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_readahead_maps_pages_without_private_copies(tmp_path):
    path = tmp_path / "data.f32"
    np.arange(16 << 18, dtype=np.float32).tofile(path)        # 16 MiB
    arr = _private_map(path)
    addr = arr.ctypes.data
    assert _mapping_kib(addr, "Rss") < 1024                     # nothing mapped yet
    th = pages.readahead(arr)
    assert th is not None
    th.join(30)
    assert _mapping_kib(addr, "Rss") >= 16 * 1024 * 0.95       # every page mapped
    assert _mapping_kib(addr, "Anonymous") == 0                # page-cache pages, no copy-on-write copies
    assert pages.readahead(arr, available=1) is None               # too big for memory: left to the page faults
    assert pages.readahead(np.zeros(0, np.float32)) is None
    part = _private_map(path)                                   # a fresh mapping: nothing of it mapped yet
    pages.readahead(part, np.array([0, 8 << 20]), 1 << 20).join(30)   # two 1 MiB rows of the 16 MiB
    # only those (page-cache folios of up to 2 MiB may map a little around them), not the other 14 MiB
    assert 2048 <= _mapping_kib(part.ctypes.data, "Rss") <= 8192
