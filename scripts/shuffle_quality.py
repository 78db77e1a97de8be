"""Shuffle quality of the block order against a uniform permutation on the same store (orders only, no gathers).

    .venv/bin/python scripts/shuffle_quality.py [STORE] [--symbols 2000 --bars 2500] [--batch 512] [--pool 4096]

Per batch: distinct blocks (against K (1 - e^(-b/K))), symbols and dates, the median interquartile range of dates;
over the epoch: rank correlation of delivery position and sample index, exactly-once coverage over 4 ranks,
disjoint ranks, and a resumed order equal to the original.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", nargs="?")
    ap.add_argument("--symbols", type=int, default=2000)
    ap.add_argument("--bars", type=int, default=2500)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--pool", type=int, default=None)
    ap.add_argument("--block-bytes", type=int, default=64 << 10)
    args = ap.parse_args()
    import kline_store as ks
    from kline_store.feed import block_order as B
    from kline_store.feed import sampling as S
    from kline_store.feed.block_feed import BlockBatches, default_pool
    from kline_store.measure import shuffle as Q
    from kline_store.measure.synthetic import make_store

    store = args.store or make_store(Path(tempfile.mkdtemp()) / "s", args.symbols, args.bars)
    ds = ks.KlineDataset(store, window=args.window, index="blocks")
    seg_counts, seg_bytes = ds.block_segments()
    per = max(1, args.block_bytes // seg_bytes)
    counts = B.group_segments(seg_counts, per)
    off = B.offsets(counts)
    pool = args.pool or default_pool(args.batch)
    n = len(ds)
    print(f"{n:,} windows in {int((counts > 0).sum()):,} blocks of {per * seg_bytes >> 10} KiB; batch {args.batch}, "
          f"K {pool}")

    def row(name: str, order: np.ndarray, k: int | None) -> str:
        head = order[: args.batch * 4000]     # per-batch figures from the first 4,000 batches (all of the epoch:
        cells = ds._index()[head]             # the same, at several times the memory)
        sym, t = np.divmod(cells, ds.store.n_dates)
        q = Q.quality(head, sym, t, np.searchsorted(off, head, "right") - 1, args.batch, k)
        q["rank corr"] = Q.rank_correlation(order)
        return (f"| {name} | {q['blocks/batch']:.1f} | {q.get('K(1-e^-b/K)', float('nan')):.1f} | "
                f"{q['symbols/batch']:.1f} | {q['dates/batch']:.1f} | {q['date IQR']:.0f} | {q['rank corr']:+.4f} |")

    print("| order | blocks/batch | K(1-e^-b/K) | symbols/batch | dates/batch | date IQR (bars) | rank corr |")
    print("|---|---|---|---|---|---|---|")
    uni = S.permutation(n, 0, 0).astype(np.int64)
    print(row("uniform", uni, None))
    blk = BlockBatches(counts, args.batch, pool=pool).indices()
    print(row(f"blocks (K={pool})", blk, pool))
    orders = [BlockBatches(counts, args.batch, pool=pool, rank=r, world_size=4, tail="drop").indices()
              for r in range(4)]
    cov = Q.coverage(orders, n)
    s = BlockBatches(counts, args.batch, pool=pool)
    s.advance(args.batch * 1000)
    resumed = BlockBatches(counts, args.batch, pool=pool)
    resumed.load_state_dict(s.state_dict())
    same = np.array_equal(np.concatenate(list(resumed)), blk[args.batch * 1000:])
    print(f"exactly once: whole epoch {len(np.unique(blk)) == n == len(blk)}; 4 ranks (tail=drop): missing "
          f"{cov['missing']} (n % 4 = {n % 4}), repeated {cov['repeated']}, overlap {cov['overlap']}; "
          f"resumed after 1,000 batches equals the original: {same}")


if __name__ == "__main__":
    main()
