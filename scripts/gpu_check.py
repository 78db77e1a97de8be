#!/usr/bin/env python
"""One self-contained check of device feeding, for when a GPU machine is lent (at most ~5 minutes).

    python scripts/gpu_check.py                      # builds a synthetic store (--gb 0.25) in a temp dir
    python scripts/gpu_check.py --store STORE --batch-size 1024

Prints:
  1. host memcpy GB/s (the CPU ceiling);
  2. host-to-device GB/s from pinned vs pageable memory (CUDA only);
  3. device copy bandwidth and GPU-resident gather GB/s against it (CUDA only);
  4. gather GB/s of the loader for each placement;
  5. data-wait % of a small training loop at B=1024 for each placement (kline_store.watch).
On a machine without CUDA it runs what it can on the CPU and says SKIP for each CUDA-only part.
Every section checks the remaining time budget (--budget-s) and skips itself rather than overrun.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kline_store import KlineDataset, watch  # noqa: E402
from kline_store.measure.bench import memcpy_bandwidth  # noqa: E402

FIELDS = ["open", "high", "low", "close", "volume", "amount", "adj_factor", "turnover"]
RESULTS: dict[str, object] = {}
CONFIG = "auto"  # the tuned loader config when `kline-store tune` ran on this store, else the defaults


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", help="an existing store (default: build a synthetic one in a temp dir)")
    p.add_argument("--gb", type=float, default=0.25, help="size of the synthetic store in GB (default 0.25)")
    p.add_argument("--dates", type=int, default=2520, help="dates of the synthetic store (default 2520)")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fields", type=int, default=6, help="fields per window (the first N of the store)")
    p.add_argument("--steps", type=int, default=150, help="training steps per placement")
    p.add_argument("--seconds", type=float, default=8.0, help="measuring time per placement for the gather")
    p.add_argument("--budget-s", type=float, default=270.0, help="overall time budget in seconds")
    p.add_argument("--json", action="store_true", help="print all figures as one JSON line at the end")
    return p.parse_args(argv)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def allows(self, seconds: float, what: str) -> bool:
        if self.left() >= seconds:
            return True
        print(f"  SKIP {what}: only {self.left():.0f}s of the time budget left")
        return False


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def skip_cuda(what: str) -> None:
    print(f"  SKIP {what}: needs CUDA (torch.cuda.is_available() is False)")
    RESULTS[what] = "skipped: no CUDA"


def synthetic_store(root: Path, gb: float, n_dates: int) -> Path:
    """A random-walk market of about ``gb`` gigabytes, with listings and delistings as NaN."""
    from kline_store.store import create_store

    n_fields = len(FIELDS)
    n_sym = max(8, int(gb * 1e9 / (n_dates * n_fields * 4)))
    rng = np.random.default_rng(0)
    panel = np.empty((n_sym, n_dates, n_fields), dtype=np.float32)
    step = 4096 // max(1, n_dates // 512) or 1
    for a in range(0, n_sym, step):  # in blocks: bounded temporary memory
        b = min(n_sym, a + step)
        close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (b - a, n_dates)), axis=1)).astype(np.float32)
        spread = np.abs(rng.normal(0, 0.01, (b - a, n_dates))).astype(np.float32)
        panel[a:b, :, 0] = close * (1 + rng.normal(0, 0.005, (b - a, n_dates)))
        panel[a:b, :, 1] = close * (1 + spread)
        panel[a:b, :, 2] = close * (1 - spread)
        panel[a:b, :, 3] = close
        panel[a:b, :, 4] = rng.lognormal(12, 1, (b - a, n_dates))
        panel[a:b, :, 5] = panel[a:b, :, 4] * close
        panel[a:b, :, 6] = 1.0
        panel[a:b, :, 7] = rng.uniform(0, 0.05, (b - a, n_dates))
    listed = rng.integers(0, n_dates // 2, n_sym)
    for s in np.flatnonzero(rng.random(n_sym) < 0.3):
        panel[s, : listed[s]] = np.nan
    dates = np.busday_offset(np.datetime64("2005-01-03"), np.arange(n_dates), roll="forward")
    symbols = [f"S{i:05d}" for i in range(n_sym)]
    path = root / "store"
    t0 = time.perf_counter()
    create_store(path, panel, symbols, dates, FIELDS)
    print(f"  synthetic store: {n_sym} symbols x {n_dates} dates x {n_fields} fields "
          f"({panel.nbytes / 1e9:.2f} GB) built in {time.perf_counter() - t0:.1f}s at {path}")
    return path


def cuda_copy_gbps(src: torch.Tensor, dst: torch.Tensor, reps: int = 5) -> float:
    """Best-of GB/s of dst.copy_(src) timed with CUDA events."""
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return src.numel() * src.element_size() / best / 1e9


def h2d(budget: Budget) -> None:
    section("host -> device copy (256 MiB)")
    if not torch.cuda.is_available():
        skip_cuda("h2d_pinned_vs_pageable")
        return
    if not budget.allows(10, "h2d"):
        return
    n = (256 << 20) // 4
    dev = torch.empty(n, device="cuda")
    pageable = torch.ones(n)
    pinned = torch.ones(n, pin_memory=True)
    for name, src in (("pinned", pinned), ("pageable", pageable)):
        gbps = cuda_copy_gbps(src, dev)
        RESULTS[f"h2d_{name}_gbps"] = gbps
        print(f"  {name:<9} {gbps:7.1f} GB/s")
    ratio = RESULTS["h2d_pinned_gbps"] / RESULTS["h2d_pageable_gbps"]  # type: ignore[operator]
    print(f"  pinned / pageable: {ratio:.2f}x")


def device_copy(budget: Budget) -> float | None:
    section("device copy bandwidth (1 GiB)")
    if not torch.cuda.is_available():
        skip_cuda("device_copy")
        return None
    if not budget.allows(10, "device copy"):
        return None
    n = (1 << 30) // 4
    a = torch.ones(n, device="cuda")
    b = torch.empty_like(a)
    gbps = cuda_copy_gbps(a, b)
    RESULTS["device_copy_gbps"] = gbps
    print(f"  {gbps:7.1f} GB/s (bytes copied per second, as memcpy counts them)")
    del a, b
    torch.cuda.empty_cache()
    return gbps


def placements() -> list[str]:
    return ["device", "pinned", "memmap"] if torch.cuda.is_available() else ["memmap", "device"]


def loader_gather(ds: KlineDataset, args: argparse.Namespace, budget: Budget, copy_gbps: float | None) -> None:
    section(f"loader gather throughput, batch {args.batch_size} (x only)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sample_bytes = args.window * len(ds.fields) * 4
    for placement in placements():
        if not budget.allows(20, f"gather/{placement}"):
            continue
        loader = ds.loader(batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True, device=device,
                           placement=placement, config=CONFIG)
        n = batches = 0
        t0 = None
        deadline = time.perf_counter() + min(args.seconds, budget.left() / 4)
        while time.perf_counter() < deadline:
            for batch in loader:
                x = batch["x"]
                batches += 1
                if batches == 5:  # warm-up: upload, thread start, first-touch faults
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0, n = time.perf_counter(), 0
                    continue
                n += x.shape[0]
                if time.perf_counter() > deadline:
                    break
        if device == "cuda":
            torch.cuda.synchronize()
        if t0 is None or n == 0:
            print(f"  {placement:<7} too few batches to measure")
            continue
        gbps = n * sample_bytes / (time.perf_counter() - t0) / 1e9
        RESULTS[f"gather_{placement}_gbps"] = gbps
        extra = ""
        if placement == "device" and copy_gbps:
            extra = f"  ({100 * gbps / copy_gbps:.1f}% of device copy bandwidth)"
        print(f"  {placement:<7} {gbps:7.2f} GB/s  {n / (time.perf_counter() - t0):>12,.0f} samples/s "
              f"[placement resolved: {getattr(loader, 'placement', placement)}]{extra}", flush=True)
        del loader


def train_wait(ds: KlineDataset, args: argparse.Namespace, budget: Budget) -> None:
    section(f"training loop data-wait at batch {args.batch_size}, {args.steps} steps per placement")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n_f = len(ds.fields)
    for placement in placements():
        if not budget.allows(30, f"train/{placement}"):
            continue
        torch.manual_seed(0)
        model = nn.LSTM(n_f, 64, batch_first=True).to(device)
        head = nn.Linear(64, 1).to(device)
        opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
        loader = ds.loader(batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True, device=device,
                           placement=placement, config=CONFIG)
        meter = watch(loader, warmup=5)
        step = 0
        deadline = time.perf_counter() + min(60.0, budget.left() / 3)
        while step < args.steps and time.perf_counter() < deadline:
            for batch in meter:
                x = torch.nan_to_num(torch.log1p(batch["x"].clamp_min(0)))
                out, _ = model(x)
                loss = head(out[:, -1]).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                if step >= args.steps or time.perf_counter() > deadline:
                    break
        if device.type == "cuda":
            torch.cuda.synchronize()
        rep = meter.report()
        RESULTS[f"train_{placement}"] = rep.as_dict()
        print(f"  {placement:<7} {step:4d} steps | {rep}", flush=True)


def features(store: Path, tmp: Path, budget: Budget) -> None:
    """Alpha158 + LABEL0 over the store's first 1,000 symbols, on the CPU and (when there is one) the GPU."""
    section("features: alpha158 on the panel")
    if not budget.allows(60, "features"):
        return
    import numpy as np

    from kline_store import compute_features, open_store

    with open_store(store, verify=False) as st:
        n = min(1000, st.n_symbols)
        sub = tmp / "sub"
        from kline_store.store import create_store
        create_store(sub, np.asarray(st.panel[:n]), st.symbols[:n], st.dates, st.fields)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        compute_features(sub, tmp / f"f_{dev}", sets=["alpha158"], device=dev, replace=True)   # warm
        t0 = time.perf_counter()
        rep = compute_features(sub, tmp / f"f_{dev}", sets=["alpha158"], device=dev, replace=True)
        dt = time.perf_counter() - t0
        RESULTS[f"alpha158_{dev}_s"] = dt
        print(f"  {dev:4s}: {rep.n_symbols} symbols x {rep.n_dates} days x 159 fields in {dt:6.2f} s "
              f"({rep.n_symbols * rep.n_dates / dt / 1e3:,.0f}k symbol-days/s)")
    if len(devices) == 2:
        a = np.asarray(open_store(tmp / "f_cpu").panel)
        b = np.asarray(open_store(tmp / "f_cuda").panel)
        close = np.isclose(a, b, rtol=1e-4, atol=1e-5) | (np.isnan(a) & np.isnan(b))
        RESULTS["alpha158_cuda_vs_cpu_agree"] = float(close.mean())
        print(f"  cuda vs cpu: {100 * close.mean():.4f}% of cells agree (rtol 1e-4)")
    else:
        skip_cuda("features on the GPU")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    budget = Budget(args.budget_s)
    section("machine")
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"  CUDA device 0: {p.name}, {p.total_memory / 2**30:.0f} GiB")
        RESULTS["device"] = p.name
    else:
        print("  no CUDA device: CPU-only parts run, CUDA parts are skipped")
        RESULTS["device"] = "cpu"
    section("host memcpy (1 thread, 256 MiB)")
    mc = memcpy_bandwidth()
    RESULTS["memcpy_gbps"] = mc / 1e9
    print(f"  {mc / 1e9:7.1f} GB/s")
    h2d(budget)
    copy_gbps = device_copy(budget)
    with tempfile.TemporaryDirectory(prefix="kline-gpu-check-") as tmp:
        section("store")
        store = Path(args.store) if args.store else synthetic_store(Path(tmp), args.gb, args.dates)
        from kline_store import open_store

        with open_store(store, verify=False) as st:
            fields = st.fields[: args.fields]
        ds = KlineDataset(store, window=args.window, fields=fields)
        print(f"  {store}: {len(ds):,} windows of {args.window} x {fields}")
        loader_gather(ds, args, budget, copy_gbps)
        train_wait(ds, args, budget)
        features(store, Path(tmp), budget)
    print(f"\ndone in {args.budget_s - budget.left():.0f}s")
    if args.json:
        print(json.dumps(RESULTS, default=float))


if __name__ == "__main__":
    main()
