"""The memory a default loader's process takes, against what it should take.

A fresh process (nothing else allocated, so every byte it gains is the loader's) opens a dataset with the defaults,
makes ``ds.loader(batch_size=B)`` and runs its first epoch; its memory is read from /proc at each step (tracemalloc
does not see torch's allocations). What it should hold: its own memory for the valid-window index, two epoch
orders (the current one and the next, computed ahead) and the chunk buffers, plus the store's stored days mapped
once (page cache, shared with every process reading the store). Growth beyond that is a leak, a copy or a second
mapping.

    python -m kline_store.measure.footprint STORE [--window 64] [--batch-size 256] [--fields F,..] [--cold] [--json]

``kline-store bench`` prints it under the loader table, measured on the same store in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20
_STATUS = ("VmRSS", "RssAnon", "RssFile")
_ROLLUP = ("Private_Clean", "Private_Dirty")


def memory_now(data_file: str | None = None) -> dict[str, int]:
    """This process's memory in bytes: ``VmRSS``, ``RssAnon``, ``RssFile`` (/proc/self/status), ``Private_Clean``,
    ``Private_Dirty`` (/proc/self/smaps_rollup) and, given the store's data file, ``store`` (the resident pages of
    every mapping of it)."""
    out: dict[str, int] = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in _STATUS:
            out[key] = int(rest.split()[0]) * 1024
    for line in open("/proc/self/smaps_rollup"):
        key, _, rest = line.partition(":")
        if key in _ROLLUP:
            out[key] = int(rest.split()[0]) * 1024
    if data_file is not None:
        out["store"], inside = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:   # a mapping's header
                inside = len(head) >= 6 and head[5] == data_file
            elif inside and head and head[0] == "Rss:":
                out["store"] += int(head[1]) * 1024
    return out


def cached_bytes(path: str | os.PathLike) -> int:
    """Bytes of a file in the page cache (``mincore`` over a fresh mapping of it); 0 where that cannot be read."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return 0
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return 0
            return int(sum(v & 1 for v in vec)) * mmap.PAGESIZE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@dataclass
class Footprint:
    """What a default loader's first epoch took (bytes), step by step, and its allowance."""

    steps: dict[str, dict[str, int]] = field(default_factory=dict)   # step -> memory_now() - the start
    index: int = 0          # the valid-window index (or block index)
    orders: int = 0         # the current epoch's order and the next one
    buffers: int = 0        # the chunk buffers the loader allocated
    panel: int = 0          # the store's stored days (page cache, mapped once)
    cached: int = 0         # the store's data file in the page cache after the epoch (its reserved room too)
    windows: int = 0
    loader: str = ""

    @property
    def allowance(self) -> int:
        """Private memory a loader should need: index, two orders, buffers."""
        return self.index + self.orders + self.buffers

    @property
    def end(self) -> dict[str, int]:
        return self.steps["first epoch"]

    def private(self) -> int:
        """Private growth: anonymous memory (copies, arrays, buffers; never the store's page cache)."""
        return self.end["RssAnon"]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "allowance": self.allowance, "private": self.private()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Footprint:
        return cls(**{k: v for k, v in d.items() if k not in ("allowance", "private")})


def measure_here(store: str | os.PathLike, window: int = 64, batch_size: int = 256, cold: bool = False,
                 fields: list[str] | None = None) -> Footprint:
    """The footprint measured in this process (call it in a fresh one: see :func:`measure`). ``cold``: the data
    file's pages dropped from the page cache first (those no other process maps)."""
    import torch  # noqa: F401  (imported before the start: the interpreter's own memory is not the loader's)

    from ..system.indexes import index_dtype
    from ..samples.dataset import KlineDataset
    from ..store import open_store

    with open_store(store, verify=False) as st:
        data_file = str(st.data_file.resolve())
    if cold:
        fd = os.open(data_file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    start = memory_now(data_file)
    fp = Footprint()

    def step(name: str) -> None:
        now = memory_now(data_file)
        fp.steps[name] = {k: now[k] - start.get(k, 0) for k in now}

    ds = KlineDataset(store, window=window, fields=fields)
    step("dataset")
    ld = ds.loader(batch_size=batch_size)
    step("loader")
    it = iter(ld)
    next(it)
    step("first batch")
    for _ in it:
        pass
    step("first epoch")
    n = len(ds)
    fp.windows, fp.loader = n, repr(ld)
    fp.index = int(ds._index().nbytes)
    fp.orders = 2 * n * index_dtype(n).itemsize if ld.order == "uniform" else 0
    recycler = ld._host._recycler
    fp.buffers = sum(a.nbytes for slot in (recycler.slots if recycler else []) for a in slot.values())
    fp.panel = ds.store.logical_bytes
    fp.cached = cached_bytes(data_file)
    ld.close()
    return fp


def measure(store: str | os.PathLike, window: int = 64, batch_size: int = 256, cold: bool = False,
            fields: list[str] | None = None, timeout: float = 600) -> Footprint:
    """The footprint measured in a fresh Python process (its start is the baseline)."""
    cmd = [sys.executable, "-m", "kline_store.measure.footprint", str(store), "--window", str(window),
           "--batch-size", str(batch_size), "--json"] + (["--cold"] if cold else []) \
        + (["--fields", ",".join(fields)] if fields else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=True).stdout
    return Footprint.from_dict(json.loads(out.strip().splitlines()[-1]))


def describe(fp: Footprint) -> list[str]:
    """The footprint as lines under the loader table."""
    end, mib = fp.end, lambda b: f"{b / MIB:,.0f} MiB"
    beyond = fp.private() - fp.allowance
    return [f"memory of a fresh process, `ds.loader(batch_size=B)` over {fp.windows:,} windows, first epoch: "
            f"private (anonymous) growth {mib(fp.private())} against an allowance of {mib(fp.allowance)} (index "
            f"{mib(fp.index)} + two orders {mib(fp.orders)} + buffers {mib(fp.buffers)}): "
            f"{fp.private() / max(1, fp.allowance):.2f}x, {mib(beyond)} beyond;",
            f"  store pages mapped {mib(end.get('store', 0))} for {mib(fp.panel)} of stored days, {mib(fp.cached)} of "
            f"the data file in the page cache; RSS growth {mib(end['VmRSS'])} against "
            f"{mib(fp.allowance + fp.panel)} (allowance + stored days once)"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fields", help="comma-separated fields (default: the dataset's default)")
    p.add_argument("--cold", action="store_true", help="drop the data file from the page cache first")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    fields = args.fields.split(",") if args.fields else None
    fp = measure_here(args.store, args.window, args.batch_size, args.cold, fields)
    if args.json:
        print(json.dumps(fp.as_dict()))
        return
    steps = ["step"] + [f"{k} MiB" for k in ("VmRSS", "RssAnon", "RssFile", "store")]
    print("  ".join(f"{s:>14}" for s in steps))
    for name, m in fp.steps.items():
        print("  ".join([f"{name:>14}"] + [f"{m.get(k, 0) / MIB:>14.1f}" for k in ("VmRSS", "RssAnon", "RssFile",
                                                                                    "store")]))
    print("\n".join(describe(fp)))


if __name__ == "__main__":
    main()


__all__ = ["Footprint", "cached_bytes", "describe", "measure", "measure_here", "memory_now"]
