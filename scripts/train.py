#!/usr/bin/env python
"""Train a small sequence model on a store for a few hundred steps, printing loss and the starvation meter.

    python scripts/train.py STORE [--steps 300] [--model lstm|transformer] [--device auto|cpu|cuda]

The model predicts the next-day return of the close (in percent) from the last ``--window`` days; the dataset
normalises each window by its own last close and mean volume (no look-ahead), the model sees their logs.
Every ``--log-every`` steps it prints the loss, samples/s and the data-wait share measured by
``kline_store.watch`` over the last 100 steps, and a summary at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from kline_store import KlineDataset, watch  # noqa: E402
from kline_store.errors import KlineStoreError  # noqa: E402

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="store directory (kline-store ingest ... -o STORE)")
    p.add_argument("--window", type=int, default=32, help="days per sample (default 32)")
    p.add_argument("--fields", default="open,high,low,close,volume", help="comma-separated input fields")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--model", choices=("lstm", "transformer"), default="lstm")
    p.add_argument("--hidden", type=int, default=32, help="model width (default 32)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1")
    p.add_argument("--placement", default="auto", choices=("auto", "device", "pinned", "memmap"))
    p.add_argument("--config", default="auto", help="loader config: auto (tuned if any), none, or a JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="steps between log lines (default 50)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads for the model (0: keep)")
    p.add_argument("--json", action="store_true", help="print a final JSON summary line")
    return p.parse_args(argv)


class LSTMModel(nn.Module):
    def __init__(self, n_in: int, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(n_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)


class TransformerModel(nn.Module):
    def __init__(self, n_in: int, hidden: int, window: int) -> None:
        super().__init__()
        self.proj = nn.Linear(n_in, hidden)
        self.pos = nn.Parameter(torch.zeros(window, hidden))
        layer = nn.TransformerEncoderLayer(hidden, nhead=4, dim_feedforward=2 * hidden, batch_first=True,
                                           dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.proj(x) + self.pos[: x.shape[1]])
        return self.head(h[:, -1]).squeeze(-1)


def make_features(x: torch.Tensor) -> torch.Tensor:
    """Windows normalised by the dataset (prices / last close, volume / window mean) -> log scale, NaN -> 0."""
    return torch.nan_to_num(torch.log(x.clamp_min(1e-6)), nan=0.0, posinf=0.0, neginf=0.0)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train.py: --device cuda requested but CUDA is not available; use --device cpu")
    return dev


def _placement(loader, device) -> str:
    """The placement in words: "device" on a CPU is a RAM copy of the fields used, not a GPU."""
    p = getattr(loader, "placement", "?")
    if p == "device" and torch.device(device).type == "cpu":
        return "device (a RAM copy of the fields used; no GPU)"
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    # label: next-day return of the close; inputs normalised per window, so no look-ahead and no scale
    ds = KlineDataset(args.store, window=args.window, fields=fields, horizon=1, label="return",
                      normalize="window")
    n_in = len(ds.fields)

    if args.model == "lstm":
        model: nn.Module = LSTMModel(n_in, args.hidden)
    else:
        model = TransformerModel(n_in, args.hidden, args.window)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    config = None if args.config == "none" else args.config

    loader = ds.loader(batch_size=args.batch_size, shuffle=True, seed=args.seed, drop_last=True,
                       device=device, placement=args.placement, config=config)
    print(f"store {args.store}: {len(ds):,} windows of {args.window} x {ds.fields}; model {args.model} "
          f"(hidden {args.hidden}, {sum(p.numel() for p in model.parameters()):,} params) on {device}; "
          f"placement {_placement(loader, device)}, loader config {getattr(loader, 'config', None)}",
          flush=True)

    meter = watch(loader, warmup=2)
    step, epoch, final_loss = 0, 0, math.nan
    # Sums stay on the device between log lines: no host sync per step.
    loss_sum = torch.zeros((), device=device)
    zero_sum = torch.zeros((), device=device)
    since = 0
    t0 = time.perf_counter()
    while step < args.steps:
        loader.set_epoch(epoch)
        for batch in meter:
            feats = make_features(batch["x"])
            tgt = batch["y"].clamp(-0.5, 0.5) * 100.0  # next-day return in percent
            loss = nn.functional.mse_loss(model(feats), tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
            zero_sum += tgt.pow(2).mean()
            step += 1
            since += 1
            if step % args.log_every == 0 or step == args.steps:
                final_loss = loss_sum.item() / since
                print(f"step {step:5d}  loss {final_loss:7.4f} (predict-0: {zero_sum.item() / since:7.4f})  | "
                      f"{meter.report(recent=True)}", flush=True)
                loss_sum.zero_()
                zero_sum.zero_()
                since = 0
            if step >= args.steps:
                break
        epoch += 1
    wall = time.perf_counter() - t0
    rep = meter.report()
    print(f"done: {step} steps in {wall:.1f}s | overall {rep}", flush=True)
    summary = {"steps": step, "seconds": wall, "final_loss": final_loss, "device": str(device), **rep.as_dict()}
    if args.json:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    try:
        main()
    except KlineStoreError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        sys.exit(1)
