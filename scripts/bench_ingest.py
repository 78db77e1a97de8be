#!/usr/bin/env python3
"""Ingest speed and memory: `kline-store ingest` of a long CSV against a bare `polars.read_csv` process.

Writes a synthetic long-format CSV (default 1,000 symbols x 2,500 days = 2.5M rows, tushare-like columns),
then runs both as separate processes, alternating, and reports wall time, the ratio, and peak RSS of each.
``--baseline DIR`` also runs the ingest of another checkout (its ``kline_store`` package first on the path)
in the same rounds, so a change is measured against what it changes under the same load.

    python scripts/bench_ingest.py [--symbols 1000 --days 2500 --repeat 3 --json] [--baseline ../old-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_csv(path: Path, n_sym: int, n_days: int, seed: int = 0) -> int:
    """A long CSV with symbol, date (YYYYMMDD int), OHLC, vol, amount; rows grouped by symbol, newest first."""
    import polars as pl
    rng = np.random.default_rng(seed)
    days = np.arange(np.datetime64("2010-01-04"), np.datetime64("2010-01-04") + n_days * 7 // 5 + 10)
    days = days[np.is_busday(days)][:n_days]
    ymd = np.array([int(str(d).replace("-", "")) for d in days], dtype=np.int64)
    frames = []
    for s in range(n_sym):
        close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, n_days)))
        o = close * (1 + rng.normal(0, 0.005, n_days))
        hi = np.maximum(o, close) * (1 + rng.random(n_days) * 0.01)
        lo = np.minimum(o, close) * (1 - rng.random(n_days) * 0.01)
        vol = rng.integers(1_000, 5_000_000, n_days).astype(np.float64)
        frames.append(pl.DataFrame({
            "ts_code": f"{s:06d}.SZ", "trade_date": ymd[::-1], "open": o[::-1].round(2),
            "high": hi[::-1].round(2), "low": lo[::-1].round(2), "close": close[::-1].round(2),
            "vol": vol[::-1], "amount": (vol * close)[::-1].round(3)}))
    df = pl.concat(frames)
    df.write_csv(path)
    return df.height


def run(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {proc.stderr.read().decode()[-500:]}")
    return wall, ru.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--symbols", type=int, default=1000)
    ap.add_argument("--days", type=int, default=2500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the CSV and store in this folder")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with (e.g. `git worktree add` of main)")
    ap.add_argument("--write-csv", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.write_csv:
        make_csv(a.write_csv, a.symbols, a.days)
        return
    work = a.keep or Path(tempfile.mkdtemp(prefix="kline-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    csv = work / "long.csv"
    if not csv.exists():
        # In a child process: a child's peak RSS counts the pages it shares with its parent at fork, so a parent
        # that built the CSV in memory would inflate every figure measured after.
        subprocess.run([sys.executable, __file__, "--symbols", str(a.symbols), "--days", str(a.days),
                        "--write-csv", str(csv)], check=True)
    rows = sum(1 for _ in open(csv, "rb")) - 1
    py = sys.executable
    exe = [py, "-m", "kline_store.cli"]
    polars_cmd = [py, "-c", f"import polars; polars.read_csv({str(csv)!r})"]
    res: dict[str, list] = {"polars": [], "ingest": []}
    if a.baseline:
        res["baseline"] = []
        base_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(a.baseline.resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for _ in range(a.repeat):
        res["polars"].append(run(polars_cmd))
        shutil.rmtree(work / "store", ignore_errors=True)  # a fresh ingest each time, as a first run would be
        res["ingest"].append(run(exe + ["ingest", str(csv), "-o", str(work / "store"), "-q"]))
        if a.baseline:
            shutil.rmtree(work / "base", ignore_errors=True)
            res["baseline"].append(run(exe + ["ingest", str(csv), "-o", str(work / "base"), "-q"], base_env))
    best = {k: min(v, key=lambda x: x[0]) for k, v in res.items()}
    out = {"rows": rows, "csv_mib": round(csv.stat().st_size / 2**20, 1),
           "polars_read_csv_s": round(best["polars"][0], 3), "ingest_s": round(best["ingest"][0], 3),
           "ratio": round(best["ingest"][0] / best["polars"][0], 2),
           "polars_peak_rss_mib": round(max(r[1] for r in res["polars"]), 1),
           "ingest_peak_rss_mib": round(max(r[1] for r in res["ingest"]), 1),
           "store_mib": round(sum(f.stat().st_blocks * 512 for f in (work / "store").glob("data-*")) / 2**20, 1),
           "cpus": os.cpu_count(), "repeat": a.repeat}
    if a.baseline:
        out.update({"baseline_s": round(best["baseline"][0], 3),
                    "baseline_ratio": round(best["baseline"][0] / best["polars"][0], 2),
                    "baseline_peak_rss_mib": round(max(r[1] for r in res["baseline"]), 1),
                    "all_s": {k: [round(r[0], 3) for r in v] for k, v in res.items()}})
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{rows} rows, CSV {out['csv_mib']} MiB, {out['cpus']} CPUs, best of {a.repeat}")
        print(f"  polars.read_csv process : {out['polars_read_csv_s']:.3f} s, peak RSS {out['polars_peak_rss_mib']} MiB")
        print(f"  kline-store ingest      : {out['ingest_s']:.3f} s, peak RSS {out['ingest_peak_rss_mib']} MiB")
        print(f"  ratio ingest / read_csv : {out['ratio']:.2f}  (target <= 2.0)")
        if a.baseline:
            print(f"  baseline ingest         : {out['baseline_s']:.3f} s, peak RSS {out['baseline_peak_rss_mib']} MiB,"
                  f" ratio {out['baseline_ratio']:.2f}  ({a.baseline})")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
