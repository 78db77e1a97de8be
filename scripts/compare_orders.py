#!/usr/bin/env python3
"""Does the block order train as well as a uniform shuffle? One epoch of a small model, both orders, several seeds.

A synthetic panel with a planted, learnable signal (next-day return = -0.2 x today's return - 0.1 x the close's
distance from its 5-day mean + noise) is ingested into a store that
fits in memory. The block order is run as it runs on a store bigger than memory: blocks of 64 KiB (one
symbol's bars each here) and the default pool K = max(1024, 8 x batch), fewer than the store's blocks, so each
batch is drawn from a pool holding part of the store. Each run trains an MLP over windows normalised by their
last close for one epoch of the train split, then reports the validation loss and the validation IC (the mean
over days of the cross-sectional Pearson correlation of prediction and next-day return).

    python scripts/compare_orders.py [--symbols 2000 --days 1500 --seeds 3 --batch 128 --window 16]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kline_store as ks  # noqa: E402
from kline_store import make_splits  # noqa: E402


def planted_panel(n_sym: int, n_days: int, seed: int = 0):
    """Long-format bars whose next-day return depends on the last return and the distance from the 5-day mean."""
    import polars as pl
    rng = np.random.default_rng(seed)
    r = np.zeros((n_sym, n_days))
    close = np.ones((n_sym, n_days)) * 10 * np.exp(rng.normal(0, 0.5, (n_sym, 1)))
    for t in range(1, n_days):
        lo = max(0, t - 5)
        dist = close[:, t - 1] / close[:, lo:t].mean(1) - 1
        r[:, t] = np.clip(-0.2 * r[:, t - 1] - 0.1 * dist + rng.normal(0, 0.02, n_sym), -0.2, 0.2)
        close[:, t] = close[:, t - 1] * (1 + r[:, t])
    opn = close * (1 + rng.normal(0, 0.005, close.shape))
    days = np.busday_offset("2015-01-05", np.arange(n_days), roll="forward").astype("datetime64[D]")
    return pl.DataFrame({
        "symbol": np.repeat([f"S{s:05d}" for s in range(n_sym)], n_days),
        "date": np.tile(days, n_sym),
        "open": opn.ravel(), "high": (np.maximum(opn, close) * 1.005).ravel(),
        "low": (np.minimum(opn, close) * 0.995).ravel(), "close": close.ravel(),
        "volume": rng.integers(10_000, 1_000_000, n_sym * n_days).astype(float),
    })


def features(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(torch.log(x.clamp_min(1e-6)), nan=0.0, posinf=0.0, neginf=0.0).flatten(1)


def run(splits, order: str, seed: int, batch: int, lr: float) -> dict:
    torch.manual_seed(seed)
    train, valid = splits.train, splits.valid
    n_in = train.window * len(train.fields)
    model = nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    kw = dict(block_bytes=64 << 10) if order == "blocks" else {}
    loader = train.loader(batch_size=batch, seed=seed, drop_last=True, order=order, **kw)
    t0 = time.perf_counter()
    for b in loader:
        loss = nn.functional.mse_loss(model(features(b["x"])).squeeze(-1), b["y"].clamp(-0.5, 0.5) * 100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - t0
    pool = getattr(loader.batch_sampler, "pool", None)
    preds, ys, ts = [], [], []
    with torch.no_grad():
        for b in valid.loader(batch_size=4096, shuffle=False, order="uniform"):
            preds.append(model(features(b["x"])).squeeze(-1).numpy())
            ys.append((b["y"].clamp(-0.5, 0.5) * 100).numpy())
            ts.append(np.asarray(b["t"]))
    p, y, t = np.concatenate(preds), np.concatenate(ys), np.concatenate(ts)
    ics = []
    for day in np.unique(t):
        sel = t == day
        if sel.sum() > 10 and p[sel].std() > 0:
            ics.append(np.corrcoef(p[sel], y[sel])[0, 1])
    return {"order": loader.order, "seed": seed, "val_loss": float(np.mean((p - y) ** 2)),
            "ic": float(np.mean(ics)), "seconds": seconds, "pool": pool, "steps": len(loader)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--symbols", type=int, default=2000)
    ap.add_argument("--days", type=int, default=1500)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="kline-orders-"))
    try:
        store = work / "store"
        ks.ingest(planted_panel(a.symbols, a.days), store, quiet=True)
        with ks.open_store(store) as st:
            dates = st.dates.astype("datetime64[D]")
            size = st.panel.nbytes
        cut = int(len(dates) * 0.8)
        splits = make_splits(store, train=(None, str(dates[cut - 1])), valid=(None, str(dates[-1])),
                             window=a.window, horizon=1, label="return", normalize="window")
        print(f"store: {a.symbols} symbols x {a.days} days ({size / 2**20:.0f} MiB), train {len(splits.train):,} "
              f"windows, valid {len(splits.valid):,}; batch {a.batch}, one epoch, MLP, {a.seeds} seeds")
        rows = [run(splits, order, seed, a.batch, a.lr) for seed in range(a.seeds) for order in ("uniform", "blocks")]
        print("| order | val loss (mean ± sd) | val IC (mean ± sd) | per-seed IC | train s/epoch |")
        print("|---|---|---|---|---|")
        for order in ("uniform", "blocks"):
            rs = [r for r in rows if r["order"] == order]
            loss, ic = np.array([r["val_loss"] for r in rs]), np.array([r["ic"] for r in rs])
            print(f"| {order} | {loss.mean():.4f} ± {loss.std(ddof=1):.4f} | {ic.mean():.4f} ± {ic.std(ddof=1):.4f} "
                  f"| {', '.join(f'{v:.4f}' for v in ic)} | {np.mean([r['seconds'] for r in rs]):.1f} |")
        blocks = [r for r in rows if r["order"] == "blocks"][0]
        print(f"block order: pool K = {blocks['pool']}, {blocks['steps']} steps an epoch")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
