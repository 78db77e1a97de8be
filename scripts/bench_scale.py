"""The loader over a store bigger than the memory it may use: block order vs uniform order, against the disk.

    .venv/bin/python scripts/bench_scale.py --memory-limit 1G --ratio 3 --seconds 120      (as root, quiet machine)

What it does, all in one run, then prints one table and cleans up (store, cgroup):

1. makes a synthetic minute-like store of ``ratio x memory-limit`` bytes (40,000 bars a symbol; or --store PATH);
2. measures the disk's read ceiling: the best of one sequential reader and 8 threads of 1 MiB preads at random
   offsets, each for up to --seconds/4, the file's pages dropped from the page cache first (POSIX_FADV_DONTNEED);
3. for order=blocks and order=uniform: drops the store's pages from the cache, starts a child process that joins a
   memory cgroup limited to --memory-limit (v1 memory.limit_in_bytes or v2 memory.max: made as a child of this
   process's cgroup; needs root) and runs ``ds.loader(order=...)`` for one epoch or --seconds. The child reports
   windows/s, the bytes it read from disk (/proc/self/io read_bytes, every thread), its private memory growth
   (RssAnon) and the cgroup's peak charge; a loader that cannot fit says so in one line, and that line is printed.

Columns: ``window MB/s`` is windows/s x the bytes of a window's bars, compared with the disk ceiling (target for
the block order: >= 80%); ``store MB/s`` is windows/s x the bytes of one bar (each window brings one new bar of the
store: an epoch's windows are about its bars), the rate the store itself is consumed at. ``of CPU ceiling``
compares windows/s with the bare gather of the same windows from memory (``index_select`` in 2 threads out of a
resident array the size of the block pool), measured in the same run: where that is below the disk ceiling, the
cores, not the disk, bound any loader of these windows.
``read amp`` is disk bytes / the store bytes the delivered windows need: for the block order the share of the
epoch delivered times the store's bytes; for the uniform order the expected distinct bytes of k random windows of
w bars among n, ``store x (1 - (1 - k/n)^w)`` (target for the block order: <= 1.2). Timing figures are only
meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def data_file(store: Path) -> Path:
    import kline_store as ks
    st = ks.open_store(store, verify=False)
    try:
        return Path(st.data_file)
    finally:
        st.close()


def disk_ceiling(path: Path, seconds: float, threads: int = 8) -> dict[str, float]:
    """Bytes/s of one sequential 1 MiB reader, and of ``threads`` threads of 1 MiB preads at random offsets."""
    total = path.stat().st_size
    out = {}
    drop_cache(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0, n, off = time.perf_counter(), 0, 0
        while time.perf_counter() - t0 < seconds and off < total:
            n += len(os.pread(fd, MiB, off))
            off += MiB
        out["sequential"] = n / (time.perf_counter() - t0)
    finally:
        os.close(fd)
    drop_cache(path)

    def reader(k: int, stop: float) -> int:
        rng, n = random.Random(k), 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while time.perf_counter() < stop:
                n += len(os.pread(fd, MiB, rng.randrange(0, max(1, total - MiB)) // 4096 * 4096))
        finally:
            os.close(fd)
        return n

    out[f"random x{threads}"] = rate_in_threads(reader, threads, seconds)
    return out


def rate_in_threads(work: Callable[[int, float], int], threads: int, seconds: float) -> float:
    """Units per second of ``threads`` threads each running ``work(k, stop) -> units done`` until ``stop``."""
    got = [0] * threads
    stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        got[k] = work(k, stop)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(got) / (time.perf_counter() - t0)


def gather_ceiling(window: int, n_fields: int, resident_bytes: int, seconds: float, threads: int = 2,
                   chunk: int = 5461) -> float:
    """Windows/s of the bare gather the loader does, from memory: ``threads`` threads (the loader's default gather
    threads) each copying chunks of ``chunk`` random windows (``torch.index_select`` of overlapping rows) out of a
    resident array of ``resident_bytes`` (the block pool's size: the bytes the block order gathers from at a
    time). The ceiling of any loader of these windows on this machine's cores, whatever the disk."""
    import numpy as np
    import torch

    bars = max(window + 1, resident_bytes // (4 * n_fields))
    flat = torch.rand(bars, n_fields)
    rows = torch.as_strided(flat, (bars - window + 1, window * n_fields), (n_fields, 1))

    def copier(k: int, stop: float) -> int:
        idx = torch.from_numpy(np.random.default_rng(k).integers(0, rows.shape[0], chunk * 16))
        out = torch.empty(chunk, window * n_fields)
        i = n = 0
        while time.perf_counter() < stop:
            torch.index_select(rows, 0, idx[i * chunk: (i + 1) * chunk], out=out)
            n += chunk
            i = (i + 1) % 16
        return n

    torch.set_num_threads(1)
    return rate_in_threads(copier, threads, seconds)


def child(args: argparse.Namespace) -> None:
    """One run inside the memory cgroup; prints one JSON line."""
    import numpy as np  # noqa: F401
    import torch  # noqa: F401   (imported before joining the cgroup: the interpreter's own memory is not the loader's)
    import kline_store as ks
    from kline_store.errors import InputError
    from kline_store import memory
    from kline_store.samples import dataset  # noqa: F401

    memory.join_cgroup(Path(args.cgroup))   # what the imports took is not charged; the loader's memory is
    before = memory.private_bytes()

    def io_read() -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
        return 0

    import resource
    r0 = io_read()
    out: dict = {"order": args.order, "available": str(memory.available())}
    t0 = time.perf_counter()
    try:
        ds = ks.KlineDataset(args.store, window=args.window)
        out["index"] = "full" if ds.keeps_full_index else "blocks"
        extra = {"pool_blocks": args.pool_blocks} if args.pool_blocks and args.order == "blocks" else {}
        ld = ds.loader(batch_size=args.batch, order=args.order, **extra)
        out["setup_s"] = time.perf_counter() - t0
        out["setup_disk_bytes"] = io_read() - r0   # the dataset's pass counting valid windows per segment
        r0 = io_read()
        out["n"] = len(ds)
        k, t1 = 0, time.perf_counter()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        for b in ld:
            k += len(b["t"])
            if time.perf_counter() - t1 > args.seconds:
                break
        out["major_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0
        out.update(windows=k, seconds=time.perf_counter() - t1, block_bytes=getattr(ld.batch_sampler,
                                                                                   "block_bytes", 0))
        out["window_bytes"] = args.window * len(ds.store.fields) * 4
        out["bar_bytes"] = len(ds.store.fields) * 4
        out["store_bytes"] = ds.read_bytes()
    except InputError as e:
        out["refused"] = str(e)
    out["disk_bytes"] = io_read() - r0
    out["private_growth"] = memory.private_bytes() - before
    print(json.dumps(out), flush=True)


def needed_bytes(r: dict) -> float:
    k, n, w, store = r["windows"], r["n"], r.get("window", 64), r["store_bytes"]
    if r["order"] == "blocks":
        return store * k / max(n, 1)
    return store * (1 - (1 - k / max(n, 1)) ** w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory-limit", default="1G", help="cgroup memory limit of the loader's process")
    ap.add_argument("--ratio", type=float, default=3.0, help="store bytes / memory limit (>= 3)")
    ap.add_argument("--bars", type=int, default=40_000, help="bars per symbol of the synthetic store")
    ap.add_argument("--store", help="use this store instead of making one (kept)")
    ap.add_argument("--dir", default=None, help="where to make the store (default: a temporary folder on disk)")
    ap.add_argument("--seconds", type=float, default=120.0, help="time limit of each loader run")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--orders", default="blocks,uniform")
    ap.add_argument("--pool-blocks", type=int, default=None, help="K of the block order (default: the loader's)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--order", help=argparse.SUPPRESS)
    ap.add_argument("--cgroup", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from kline_store import memory
    from kline_store.measure.synthetic import make_store

    limit = size(args.memory_limit)
    made = None
    if args.store:
        store = Path(args.store)
    else:
        made = Path(tempfile.mkdtemp(prefix="kline-scale-", dir=args.dir))
        n_sym = max(1, -(-int(limit * args.ratio) // (args.bars * 6 * 4)))
        print(f"making a store of {n_sym:,} symbols x {args.bars:,} bars x 6 fields "
              f"({n_sym * args.bars * 24 / 2**30:.2f} GiB) in {made}", file=sys.stderr)
        store = make_store(made / "store", n_sym, args.bars, seed=0)
    cg = memory.make_cgroup(limit, f"kline-bench-scale-{os.getpid()}")
    try:
        if cg is None:
            sys.exit("bench_scale: no writable memory cgroup (run as root, cgroup v1 memory or v2 with the memory "
                     "controller enabled)")
        path = data_file(store)
        ceiling = disk_ceiling(path, max(2.0, args.seconds / 4))
        best = max(ceiling.values())
        from kline_store.feed.block_feed import POOL_FRACTION
        n_fields = 6 if args.store is None else None
        if n_fields is None:
            import kline_store as ks
            st = ks.open_store(store, verify=False)
            n_fields = len(st.fields)
            st.close()
        cpu = gather_ceiling(args.window, n_fields, int(limit * POOL_FRACTION), max(2.0, args.seconds / 8))
        rows = []
        for order in args.orders.split(","):
            drop_cache(path)
            cmd = [sys.executable, __file__, "--child", "--order", order, "--cgroup", str(cg[0]), "--store",
                   str(store), "--seconds", str(args.seconds), "--window", str(args.window), "--batch",
                   str(args.batch)] + (["--pool-blocks", str(args.pool_blocks)] if args.pool_blocks else [])
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
            if res.returncode != 0 or not lines:
                rows.append({"order": order, "refused": f"exit {res.returncode} (-9: the OOM killer) "
                                                        f"{res.stderr.strip()[-300:]}"})
            else:
                r = json.loads(lines[-1])
                r["window"] = args.window
                rows.append(r)
        import kline_store as ks
        st = ks.open_store(store, verify=False)
        st_bytes = st.logical_bytes
        st.close()
        print(f"\nstore {st_bytes / 2**30:.2f} GiB, memory limit {limit / 2**30:.2f} GiB "
              f"({st_bytes / limit:.1f}x), window {args.window}, batch {args.batch}; disk ceiling "
              + ", ".join(f"{k} {v / MiB:.0f} MB/s" for k, v in ceiling.items())
              + f"; CPU ceiling (bare gather, 2 threads, from {limit * POOL_FRACTION / MiB:.0f} MiB resident) "
              f"{cpu:,.0f} windows/s = {cpu * args.window * n_fields * 4 / MiB:,.0f} window MB/s")
        print("| order | windows/s | window MB/s | of disk ceiling | of CPU ceiling | store MB/s | read amp "
              "| private growth | windows | note |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            if "refused" in r:
                print(f"| {r['order']} | - | - | - | - | - | - | {r.get('private_growth', 0) / MiB:.0f} MiB | - | "
                      f"{r['refused']} |")
                continue
            wps = r["windows"] / max(r["seconds"], 1e-9)
            mbs = wps * r["bar_bytes"]
            wbs = wps * r["window_bytes"]
            amp = r["disk_bytes"] / max(needed_bytes(r), 1)
            note = (f"index {r['index']}, setup {r['setup_s']:.1f} s reading "
                    f"{r['setup_disk_bytes'] / 2**30:.2f} GiB; {r['major_faults']:,} major faults "
                    f"({r['disk_bytes'] / max(r['major_faults'], 1) / 1024:,.0f} KiB read per fault)")
            if r.get("block_bytes"):
                note += f", blocks of {r['block_bytes'] / 1024:.0f} KiB"
            print(f"| {r['order']} | {wps:,.0f} | {wbs / MiB:,.0f} | {wbs / best:.0%} | {wps / cpu:.0%} | "
                  f"{mbs / MiB:.1f} | {amp:.2f} | {r['private_growth'] / MiB:.0f} MiB | {r['windows']:,} of {r['n']:,} | {note} |")
    finally:
        if cg is not None:
            memory.remove_cgroup(cg[0])
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    main()
