#!/usr/bin/env python3
"""process_features' cost per cell on a long panel against a short one, in one run (issue 25: linear in cells).

Two synthetic bar stores (random walks, a few suspensions) of --long (default 11 x 11,752: symbols x days) and
--short (3 x 4,097) shapes get Alpha158 features (compute_features, once); then process_features runs Qlib's
benchmark pipeline (RobustZScoreNorm + Fillna, DropnaLabel + CSRankNorm, fitted on the first half) on each,
best of --repeat. Printed: wall and CPU seconds, per-cell cost (cells = symbols x dates x fields) of each shape,
and the long/short ratio of per-cell costs (target: within 1.3).

    python scripts/bench_process.py [--repeat 3] [--long 11x11752] [--short 3x4097] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kline_store import compute_features, open_store  # noqa: E402
from kline_store.features.process import process_features  # noqa: E402
from kline_store.store import create_store  # noqa: E402


def bar_store(path: Path, n_sym: int, n_days: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_days)), 1))
    close[rng.random(close.shape) < 0.03] = np.nan
    opn = close * (1 + rng.normal(0, 0.005, close.shape))
    panel = np.stack([opn, np.fmax(opn, close) * 1.01, np.fmin(opn, close) * 0.99, close,
                      rng.integers(1000, 10**6, close.shape).astype(float), close * 0.998], axis=2)
    days = np.busday_offset("1980-01-02", np.arange(n_days), roll="forward")
    return create_store(path, panel.astype(np.float32), [f"S{i:03d}" for i in range(n_sym)], days,
                        ["open", "high", "low", "close", "volume", "vwap"])


def shape(text: str) -> tuple[int, int]:
    a, b = text.lower().split("x")
    return int(a), int(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--long", type=shape, default=(11, 11752))
    ap.add_argument("--short", type=shape, default=(3, 4097))
    ap.add_argument("--profile", action="store_true", help="print the long shape's top functions (cProfile)")
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-process-") as tmp:
        for name, (n_sym, n_days) in (("short", args.short), ("long", args.long)):
            base = bar_store(Path(tmp) / f"{name}-bars", n_sym, n_days)
            feats = Path(tmp) / f"{name}-feats"
            compute_features(base, feats, sets=["alpha158"])
            with open_store(feats) as st:
                cells, fit_end = st.n_symbols * st.n_dates * st.n_fields, str(st.dates[st.n_dates // 2])
            best = None
            for k in range(args.repeat):
                out = Path(tmp) / f"{name}-proc{k}"
                t0, c0 = time.perf_counter(), time.process_time()
                process_features(feats, out, fit_end=fit_end)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if best is None or wall < best[0]:
                    best = (wall, cpu)
            if args.profile and name == "long":
                prof = cProfile.Profile()
                prof.runcall(process_features, feats, Path(tmp) / "prof", fit_end=fit_end)
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)
            rows[name] = (n_sym, n_days, cells, *best)
    print(f"{'shape':>6} {'symbols x days':>15} {'cells':>12} {'wall s':>8} {'cpu s':>8} {'ns/cell (wall)':>15} "
          f"{'ns/cell (cpu)':>14}")
    for name, (n_sym, n_days, cells, wall, cpu) in rows.items():
        print(f"{name:>6} {f'{n_sym} x {n_days}':>15} {cells:>12,} {wall:>8.2f} {cpu:>8.2f} "
              f"{wall / cells * 1e9:>15.1f} {cpu / cells * 1e9:>14.1f}")
    (_, _, c_s, w_s, p_s), (_, _, c_l, w_l, p_l) = rows["short"], rows["long"]
    print(f"per-cell cost, long / short: {(w_l / c_l) / (w_s / c_s):.2f} (wall), {(p_l / c_l) / (p_s / c_s):.2f} "
          "(cpu); target <= 1.3. Indicative on a shared machine.")


if __name__ == "__main__":
    main()
