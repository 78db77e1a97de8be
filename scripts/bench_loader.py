#!/usr/bin/env python
"""Loader benchmark beside the loader: the classic table, then kline-store's loader across configurations.

    python scripts/bench_loader.py [STORE] [--samples 1000000] [--plot bench.png] [--json]

Without STORE it ingests sample_data/us_yahoo_daily into a temporary store. Part 1 is exactly
`kline-store bench` (classic recipes vs kline-store vs memcpy). Part 2 sweeps kline-store's own loader over
batch sizes and gather threads on the CPU, so a regression in the batch path shows up as a number, and says how
close each gets to the memcpy ceiling. Nothing here asserts a timing; it prints figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kline_store import KlineDataset  # noqa: E402
from kline_store.bench import bench, format_table, memcpy_bandwidth, plot  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", nargs="?", help="store directory (default: sample data ingested to a temp dir)")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--fields", help="comma-separated fields (default: the store's first 6)")
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--classic-samples", type=int, default=20_000)
    p.add_argument("--batch-sizes", default="256,1024,4096", help="batch sizes for the sweep")
    p.add_argument("--threads", default="0,1,2", help="gather threads for the sweep")
    p.add_argument("--plot", help="PNG of the classic table")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def sweep(store: Path, args: argparse.Namespace, fields: list[str] | None, memcpy: float) -> list[dict]:
    ds = KlineDataset(store, window=args.window, fields=fields)
    sample_bytes = args.window * len(ds.fields) * 4
    rows = []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        for threads in [int(t) for t in args.threads.split(",")]:
            cfg = {"backend": "threads", "num_workers": threads, "prefetch": 4}
            ld = ds.loader(batch_size=bs, shuffle=True, seed=0, device="cpu", config=cfg)
            n, t0 = 0, None
            while n < args.samples:
                for b in ld:
                    if t0 is None:  # the first batch pays thread start-up and first-touch faults
                        t0 = time.perf_counter()
                        continue
                    n += b["x"].shape[0]
                    if n >= args.samples:
                        break
            dt = time.perf_counter() - (t0 or time.perf_counter())
            rate = n / dt
            rows.append({"batch_size": bs, "threads": threads, "samples_per_s": rate, "seconds": dt,
                         "memcpy_fraction": rate * sample_bytes / memcpy})
            print(f"  batch {bs:>5}  threads {threads}  {rate:>12,.0f} samples/s  {dt:6.3f}s for {n:,}  "
                  f"{100 * rate * sample_bytes / memcpy:5.1f}% of memcpy", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    with tempfile.TemporaryDirectory(prefix="kline-bench-") as tmp:
        store = Path(args.store) if args.store else None
        if store is None:
            from kline_store import ingest

            store = Path(tmp) / "sample"
            ingest([str(ROOT / "sample_data" / "us_yahoo_daily")], store, quiet=True)
        print(f"== classic table on {store}", flush=True)
        res = bench(store, window=args.window, fields=fields, samples=args.samples,
                    classic_samples=args.classic_samples)
        print(format_table(res))
        if args.plot:
            print(f"plot: {plot(res, args.plot)}")
        print("\n== kline-store loader sweep (device=cpu)", flush=True)
        rows = sweep(store, args, fields or res.settings["fields"], memcpy_bandwidth())
        if args.json:
            print(json.dumps({"bench": res.as_dict(), "sweep": rows}))


if __name__ == "__main__":
    main()
