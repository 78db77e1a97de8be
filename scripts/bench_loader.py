#!/usr/bin/env python
"""Loader benchmark beside the loader: `kline-store bench`'s table, then a sweep of batch sizes and gather threads,
each against the ceiling measured for that batch size, on a store at least 4x the L3 cache.

    python scripts/bench_loader.py [STORE] [--samples 1000000] [--batch-sizes 256,1024,4096] [--json]

Without STORE (or with one smaller than 4x L3) it measures a synthetic store of that size. Nothing here asserts a
timing; it prints figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kline_store import KlineDataset, open_store
from kline_store.measure import synthetic  # noqa: E402
from kline_store.measure.bench import bench, ceiling, format_table  # noqa: E402
from kline_store.measure.timing import shut_down, time_batches  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", nargs="?", help="store directory (default: a synthetic store of 4x L3)")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-sizes", default="256,1024,4096", help="batch sizes for the sweep")
    p.add_argument("--threads", default="0,1,2,4", help="num_workers values for the sweep")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def sweep(store: Path, args: argparse.Namespace) -> list[dict]:
    ds = KlineDataset(store, window=args.window)
    n = min(args.samples, len(ds))
    order = np.random.default_rng(0).permutation(len(ds))[:n]
    s, t = ds.locate(order)
    start = torch.from_numpy(s * ds.store.date_capacity + t - (args.window - 1))
    rows = []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        best_ceiling, how = max(ceiling(ds, start, bs) for _ in range(args.rounds))
        print(f"  batch {bs:>5}  ceiling {best_ceiling:>12,.0f} windows/s [{how}]", flush=True)
        for k in [int(x) for x in args.threads.split(",")]:
            rates = []
            for _ in range(args.rounds):
                ld = ds.loader(batch_size=bs, seed=0, num_workers=k)
                rates.append(time_batches(ld, samples=n, warmup_batches=4).samples_per_s)
                shut_down(ld)
            rate = max(rates)
            rows.append({"batch_size": bs, "num_workers": k, "windows_per_s": rate, "ceiling": best_ceiling,
                         "of_ceiling": rate / best_ceiling, "spread": [min(rates), max(rates)]})
            print(f"  batch {bs:>5}  num_workers {k}  {rate:>12,.0f} windows/s  {100 * rate / best_ceiling:5.1f}% "
                  f"of the ceiling (rounds {min(rates):,.0f}-{max(rates):,.0f})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kline-bench-") as tmp:
        store = Path(args.store) if args.store else None
        l3 = synthetic.l3_bytes()
        if store is None or open_store(store, verify=False).logical_bytes < 4 * l3:
            n_sym, n_dates, _ = synthetic.shape_for(int(4.2 * l3))
            print(f"== synthetic store: {n_sym} symbols x {n_dates} days x 6 fields (4.2 x L3 of "
                  f"{l3 / 2**20:.0f} MiB)", flush=True)
            store = synthetic.make_store(Path(tmp) / "store", n_sym, n_dates)
        print(f"== kline-store bench on {store}", flush=True)
        res = bench(store, window=args.window, samples=args.samples, rounds=args.rounds, min_cache_multiple=0)
        print(format_table(res))
        print("\n== loader sweep (device=cpu)", flush=True)
        rows = sweep(store, args)
        if args.json:
            print(json.dumps({"bench": res.as_dict(), "sweep": rows}))


if __name__ == "__main__":
    main()
