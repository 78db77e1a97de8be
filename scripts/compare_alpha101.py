"""Alpha101 side by side: kline-store's `alpha101` set against a pandas transcription of the paper's formulas
(tests/features/alpha101_pandas.py) and against KunQuant 0.1.12's own Alpha101 (82 alphas, compiled once into
--cache), on a panel without missing days (synthetic random walks, or a store's complete symbols: --store), float32
as a store keeps them, the same vwap given to all three.

    python scripts/compare_alpha101.py [--symbols 64] [--days 600] [--industries 0] [--kunquant PYTHON]

One row per alpha, from the first day all of the alpha's windows are full (before it ours computes, as Qlib, from
the rows there are; the references give NaN): the share of the reference's finite cells where ours agrees
(|ours - ref| <= 1e-6 + 1e-4 |ref|), where ours is NaN, and (last column) where ours under KunQuant's two
conventions, alpha101(ts_rank="count", windows="round"), agrees with KunQuant. KunQuant runs in its own virtualenv
(KLINE_KUNQUANT_PYTHON, scripts/_kunquant_env.sh); without it its columns are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "features")]

from alpha101_pandas import PandasAlpha  # noqa: E402

from kline_store.features.alpha101 import INDUSTRY, PAPER, alpha101  # noqa: E402
from kline_store.features.evaluate import evaluate, lookback  # noqa: E402
from kline_store.features.parse import parse  # noqa: E402

FIELDS = ("open", "high", "low", "close", "volume", "vwap", "cap")


def synthetic(n_sym: int, n_days: int, seed: int, n_ind: int) -> dict[str, np.ndarray]:
    """[symbols, days] float32 bars without missing days, a market cap; industry codes when n_ind > 0."""
    rng = np.random.default_rng(seed)
    close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_days)), axis=1)) * rng.uniform(0.2, 5, (n_sym, 1))
    opn = close * np.exp(rng.normal(0, 0.01, close.shape))
    high = np.maximum(opn, close) * (1 + rng.uniform(0, 0.02, close.shape))
    low = np.minimum(opn, close) * (1 - rng.uniform(0, 0.02, close.shape))
    volume = np.round(rng.lognormal(10, 0.6, close.shape), -2)
    vwap = low + (high - low) * rng.uniform(0.2, 0.8, close.shape)
    cap = close * rng.uniform(1e7, 1e9, (n_sym, 1))
    out = {k: v.astype(np.float32) for k, v in zip(FIELDS, (opn, high, low, close, volume, vwap, cap))}
    if n_ind:
        out["industry"] = np.repeat(rng.integers(0, n_ind, (n_sym, 1)), n_days, axis=1).astype(np.float32)
    return out


def from_store(path: str, n_days: int) -> dict[str, np.ndarray]:
    """The symbols of a bar store with every bar of its last n_days present (a multiple of 4 of them, KunQuant's
    double blocks); vwap as the typical price (high + low + close) / 3 where the store has none."""
    from kline_store import open_store
    with open_store(path) as st:
        arrays = {f: np.asarray(st.array(f))[:, -n_days:] for f in FIELDS if f in st.fields}
    full = np.all([np.isfinite(v).all(axis=1) for v in arrays.values()], axis=0)
    rows = np.flatnonzero(full)[: (int(full.sum()) // 4) * 4]
    out = {k: np.ascontiguousarray(v[rows], dtype=np.float32) for k, v in arrays.items()}
    if "vwap" not in out:
        out["vwap"] = ((out["high"].astype(np.float64) + out["low"] + out["close"]) / 3).astype(np.float32)
    return out


def ours(panel: dict[str, np.ndarray], exprs: dict[str, str]) -> dict[str, np.ndarray]:
    n_sym, n_days = panel["close"].shape
    values = {k: torch.from_numpy(v) for k, v in panel.items()}
    ev = evaluate(exprs, values, torch.zeros(n_sym, dtype=torch.int64), torch.full((n_sym,), n_days - 1),
                  dtype=torch.float64)
    return {name: ev.values[:, :, k].numpy() for k, name in enumerate(ev.names)}


def pandas_side(panel: dict[str, np.ndarray], numbers) -> dict[int, np.ndarray]:
    data = {k: pd.DataFrame(v.T.astype(np.float64)) for k, v in panel.items()}
    calc = PandasAlpha(data)
    return {k: calc(k).to_numpy().T for k in numbers}


def kunquant_side(python: str, cache: Path, panel: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        p64 = {k: v.astype(np.float64) for k, v in panel.items()}
        np.savez(src, **p64)
        proc = subprocess.run([python, str(ROOT / "tests" / "features" / "kunquant_alpha101.py"), str(cache),
                               str(src), str(dst)], capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"KunQuant's side failed: {proc.stderr[-2000:]}")
        return dict(np.load(dst)), proc.stdout.strip().splitlines()[-1]


def agreement(got: np.ndarray, ref: np.ndarray, start: int = 0) -> tuple[float, float, int]:
    """(share of ref's finite cells from day ``start`` on where got agrees, share where got is NaN, ref's finite
    cells there)."""
    finite = np.isfinite(ref)
    finite[:, :start] = False
    n = int(finite.sum())
    if not n:
        return float("nan"), float("nan"), 0
    a, b = got[finite], ref[finite]
    with np.errstate(invalid="ignore"):
        ok = np.abs(a - b) <= 1e-6 + 1e-4 * np.abs(b)
    return float(ok.mean()), float(np.isnan(a).mean()), n


def warm_up(expr: str, n_days: int) -> int:
    """The first day from which every window of the expression is full (ours then reads what the references
    read: before it ours computes from the rows there are, as Qlib, and they give NaN or partial cross-sections)."""
    back = lookback(parse(expr))
    return n_days if back is None else back + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--symbols", type=int, default=64)
    ap.add_argument("--days", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--industries", type=int, default=5, help="industry codes (0: leave the industry alphas out)")
    ap.add_argument("--kunquant", default=os.environ.get("KLINE_KUNQUANT_PYTHON"))
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "kline-store-kunquant"))
    ap.add_argument("--store", help="a bar store instead of the synthetic panel: its symbols with all of the last "
                                    "--days bars (no cap, no industry; vwap the typical price unless stored)")
    ap.add_argument("--float64", action="store_true",
                    help="give ours float64 fields (element-wise steps then round as the references' do)")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.store:
        panel, args.industries = from_store(args.store, args.days), 0
        args.symbols = panel["close"].shape[0]
    else:
        panel = synthetic(args.symbols, args.days, args.seed, args.industries)
    exprs = alpha101(industry="industry" if args.industries else None)
    if args.float64:
        panel = {k: v.astype(np.float64) for k, v in panel.items()}
    t0 = time.process_time()
    mine = ours(panel, exprs)
    ours_s = time.process_time() - t0
    numbers = [k for k in PAPER if f"ALPHA{k:03d}" in exprs and (k != 56 or "cap" in panel)]
    ref = pandas_side(panel, numbers)
    kq, kq_note = ({}, "KunQuant: not run (no --kunquant / KLINE_KUNQUANT_PYTHON)")
    if args.kunquant and Path(args.kunquant).exists():
        kq, kq_note = kunquant_side(args.kunquant, Path(args.cache), panel)
    # ours under KunQuant's two conventions (ts_rank 1 .. d, windows rounded): what is left is formula differences
    kq_exprs = alpha101(industry="industry" if args.industries else None, ts_rank="count", windows="round")
    theirs_way = ours(panel, kq_exprs) if kq else {}
    rows = []
    what = f"store {args.store}" if args.store else f"seed {args.seed}"
    print(f"{args.symbols} symbols x {args.days} days, {what}; ours {ours_s:.2f} CPU s (one thread); {kq_note}")
    print(f"{'alpha':>8} {'vs pandas':>10} {'ours NaN':>9} {'vs KunQuant':>12} {'ours NaN':>9} {'KQ conv.':>9}")
    for k in numbers:
        name = f"ALPHA{k:03d}"
        start = warm_up(exprs[name], args.days)
        p_ok, p_nan, p_n = agreement(mine[name], ref[k], start)
        row = {"alpha": k, "pandas": p_ok, "pandas_ours_nan": p_nan, "pandas_cells": p_n,
               "industry": k in INDUSTRY}
        kname = f"alpha{k:03d}"
        if kname in kq:
            row["kunquant"], row["kunquant_ours_nan"], row["kunquant_cells"] = agreement(mine[name], kq[kname], start)
            row["kunquant_conventions"] = agreement(theirs_way[name], kq[kname], warm_up(kq_exprs[name], args.days))[0]
        rows.append(row)
        kq_text = (f"{row['kunquant'] * 100:11.2f}% {row['kunquant_ours_nan'] * 100:8.2f}% "
                   f"{row['kunquant_conventions'] * 100:8.2f}%" if "kunquant" in row else f"{'-':>12} {'-':>9}")
        print(f"{name:>8} {p_ok * 100:9.2f}% {p_nan * 100:8.2f}% {kq_text}")
    for key in ("pandas", "kunquant", "kunquant_conventions"):
        vals = [r[key] for r in rows if key in r and np.isfinite(r[key])]
        if vals:
            print(f"{key}: {len(vals)} alphas, {sum(v >= 0.999 for v in vals)} agree on >= 99.9% of cells, "
                  f"median {np.median(vals) * 100:.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
