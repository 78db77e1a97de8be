#!/usr/bin/env python3
"""Ingest speed and memory: `kline-store ingest` of an input against a bare polars read of the same file.

Four inputs, each measured against the bare read of that same file (``polars.read_csv`` or ``read_parquet``):

* ``daily-csv``: a long CSV, tushare-like columns (default 1,000 symbols x 2,500 days = 2.5M rows);
* ``daily-parquet``: the same bars as a Parquet file;
* ``minute-csv``: 1-minute A-share bars, ``symbol,dt,open,...`` with ``dt`` as ``YYYY-MM-DD HH:MM:SS`` text
  (default 100 symbols x 104 days x 240 bars = 2.5M rows);
* ``minute-parquet``: 1-minute bars with a timestamp column (default 200 symbols x 250 days x 240 = 12M rows).

Children run with a bytecode cache (as an installed package has), after one unmeasured round. Each round runs
the bare read and the ingest as separate processes, one after the other (and, with
``--baseline DIR``, the ingest of another checkout, its ``kline_store`` first on the path), so a ratio is
taken between runs under the same load. Reported per input: the median over rounds of the paired ratio
ingest / bare read, median wall times, CPU seconds (user + system) and their paired ratio, and the peak RSS of
each (the largest over rounds). On a machine of few cores the CPU ratio bounds the wall ratio from below: polars
parses on every core, so the ingest's own work cannot hide beside it.

    python scripts/bench_ingest.py [--inputs daily-csv,minute-parquet] [--repeat 3] [--json]
                                   [--baseline ../old-checkout] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

INPUTS = ("daily-csv", "daily-parquet", "minute-csv", "minute-parquet")
ROOT = Path(__file__).resolve().parents[1]


def daily_frame(n_sym: int, n_days: int, seed: int = 0):
    """Long daily bars: symbol, date (YYYYMMDD int), OHLC, vol, amount; grouped by symbol, newest first."""
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
    return pl.concat(frames)


def make_csv(path: Path, n_sym: int, n_days: int, seed: int = 0) -> int:
    """The daily long CSV (see :func:`daily_frame`); returns its rows."""
    df = daily_frame(n_sym, n_days, seed)
    df.write_csv(path)
    return df.height


def minute_frame(n_sym: int, n_days: int, seed: int = 0, text_stamps: bool = True):
    """1-minute A-share bars (09:31-11:30, 13:01-15:00, stamped at the bar's end), grouped by symbol, oldest
    first; ``dt`` as text (a vendor CSV) or as a timestamp column (a Parquet file)."""
    import polars as pl
    rng = np.random.default_rng(seed)
    days = np.arange(np.datetime64("2020-01-02"), np.datetime64("2020-01-02") + n_days * 7 // 5 + 10)
    days = days[np.is_busday(days)][:n_days]
    tod = np.r_[np.arange(9 * 60 + 31, 11 * 60 + 31), np.arange(13 * 60 + 1, 15 * 60 + 1)].astype("timedelta64[m]")
    stamps = (days.astype("datetime64[m]")[:, None] + tod[None, :]).ravel()
    n = len(stamps)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.001, (n_sym, n)), axis=1))
    o = close * (1 + rng.normal(0, 0.0005, (n_sym, n)))
    hi = np.maximum(o, close) * (1 + rng.random((n_sym, n)) * 0.001)
    lo = np.minimum(o, close) * (1 - rng.random((n_sym, n)) * 0.001)
    vol = rng.integers(100, 500_000, (n_sym, n)).astype(np.float64)
    dt = pl.Series("dt", np.tile(stamps, n_sym).astype("datetime64[ms]"))
    df = pl.DataFrame({
        "symbol": pl.Series(np.repeat([f"{s:06d}.XSHE" for s in range(n_sym)], n)),
        "dt": dt.dt.strftime("%Y-%m-%d %H:%M:%S") if text_stamps else dt,
        "open": o.ravel().round(2), "high": hi.ravel().round(2), "low": lo.ravel().round(2),
        "close": close.ravel().round(2), "volume": vol.ravel(), "amount": (vol * close).ravel().round(2)})
    return df


def write_input(kind: str, path: Path, shape: tuple[int, int]) -> None:
    if kind == "daily-csv":
        make_csv(path, *shape)
    elif kind == "daily-parquet":
        daily_frame(*shape).write_parquet(path)
    elif kind == "minute-csv":
        minute_frame(*shape).write_csv(path)
    else:
        minute_frame(*shape, text_stamps=False).write_parquet(path)


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + system, every thread) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {proc.stderr.read().decode()[-500:]}")
    return wall, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


def _shape(text: str) -> tuple[int, int]:
    a, b = text.lower().split("x")
    return int(a), int(b)


def bench_one(kind: str, path: Path, work: Path, a: argparse.Namespace) -> dict:
    """The rounds of one input: bare read, ingest (and baseline ingest), paired."""
    py = sys.executable
    reader = "read_parquet" if kind.endswith("parquet") else "read_csv"
    bare = [py, "-c", f"import polars; polars.{reader}({str(path)!r})"]
    exe = [py, "-m", "kline_store.cli", "ingest", str(path), "-q", "-o"]
    runs: dict[str, list[tuple[float, float]]] = {"polars": [], "ingest": []}
    # Each checkout's package first on the path, the children started in the work folder: `python -m` puts the
    # current folder first, which would be this checkout's package for both when run from it.
    envs = {"ingest": _env(ROOT, work, "ingest")}
    if a.baseline:
        runs["baseline"] = []
        envs["baseline"] = _env(a.baseline.resolve(), work, "baseline")
    bare_env = _env(None, work, "bare")
    run(bare, bare_env, cwd=work)   # a first, unmeasured round: bytecode caches written, the input file cached
    for name, e in envs.items():
        shutil.rmtree(work / f"store-{name}", ignore_errors=True)
        run(exe + [str(work / f"store-{name}")], e, cwd=work)
    for _ in range(a.repeat):
        runs["polars"].append(run(bare, bare_env, cwd=work))
        for name, e in envs.items():
            out = work / f"store-{name}"
            shutil.rmtree(out, ignore_errors=True)   # a fresh ingest each time, as a first run would be
            runs[name].append(run(exe + [str(out)], e, cwd=work))
    med = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    res = {"input": kind, "mib": round(path.stat().st_size / 2**20, 1),
           "polars_s": round(med["polars"], 3), "ingest_s": round(med["ingest"], 3),
           "ratio": round(statistics.median(i[0] / p[0] for i, p in zip(runs["ingest"], runs["polars"])), 2),
           "polars_cpu_s": round(statistics.median(r[2] for r in runs["polars"]), 3),
           "ingest_cpu_s": round(statistics.median(r[2] for r in runs["ingest"]), 3),
           "cpu_ratio": round(statistics.median(i[2] / p[2] for i, p in zip(runs["ingest"], runs["polars"])), 2),
           "polars_rss_mib": round(max(r[1] for r in runs["polars"])),
           "ingest_rss_mib": round(max(r[1] for r in runs["ingest"])),
           "all_s": {k: [round(r[0], 3) for r in v] for k, v in runs.items()}}
    if a.baseline:
        res.update(baseline_s=round(med["baseline"], 3),
                   baseline_ratio=round(statistics.median(
                       b[0] / p[0] for b, p in zip(runs["baseline"], runs["polars"])), 2),
                   baseline_rss_mib=round(max(r[1] for r in runs["baseline"])))
    for name in ("ingest", "baseline"):
        shutil.rmtree(work / f"store-{name}", ignore_errors=True)
    return res


def _env(checkout: Path | None, work: Path, name: str) -> dict:
    """The child's environment: the checkout first on the path, and a bytecode cache of its own (an installed
    package has one: pip compiles on install; a session that sets PYTHONDONTWRITEBYTECODE would otherwise charge
    every run the compilation of our modules from source, ~0.3 s, which a bare polars read never pays)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / f"pycache-{name}")
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated, of {', '.join(INPUTS)}")
    ap.add_argument("--symbols", type=int, default=1000, help="daily inputs: symbols")
    ap.add_argument("--days", type=int, default=2500, help="daily inputs: days")
    ap.add_argument("--minute-csv", default="100x104", help="SYMBOLSxDAYS of the minute CSV (240 bars a day)")
    ap.add_argument("--minute-parquet", default="200x250", help="SYMBOLSxDAYS of the minute Parquet file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the inputs in this folder (reused by a later run)")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with (e.g. `git worktree add` of main)")
    ap.add_argument("--write", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    shapes = {"daily-csv": (a.symbols, a.days), "daily-parquet": (a.symbols, a.days),
              "minute-csv": _shape(a.minute_csv), "minute-parquet": _shape(a.minute_parquet)}
    if a.write:
        write_input(a.write[0], Path(a.write[1]), shapes[a.write[0]])
        return
    kinds = [k.strip() for k in a.inputs.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in INPUTS]
    if unknown:
        ap.error(f"--inputs: unknown {', '.join(unknown)} (known: {', '.join(INPUTS)})")
    work = a.keep or Path(tempfile.mkdtemp(prefix="kline-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for kind in kinds:
        s = shapes[kind]
        path = work / f"{kind}-{s[0]}x{s[1]}.{'parquet' if kind.endswith('parquet') else 'csv'}"
        if not path.exists():
            # In a child process: a child's peak RSS counts the pages it shares with its parent at fork, so a
            # parent that built the input in memory would inflate every figure measured after.
            subprocess.run([sys.executable, __file__, "--symbols", str(a.symbols), "--days", str(a.days),
                            "--minute-csv", a.minute_csv, "--minute-parquet", a.minute_parquet,
                            "--write", kind, str(path)], check=True)
        r = bench_one(kind, path, work, a)
        r["shape"] = f"{s[0]}x{s[1]}"
        results.append(r)
        if not a.json:
            print(_line(r, a), flush=True)
    if a.json:
        print(json.dumps({"cpus": os.cpu_count(), "repeat": a.repeat, "results": results}))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)


def _line(r: dict, a: argparse.Namespace) -> str:
    bare = "read_parquet" if r["input"].endswith("parquet") else "read_csv"
    text = (f"{r['input']:<15} {r['shape']:>9} {r['mib']:>7.1f} MiB  polars.{bare} {r['polars_s']:.3f} s "
            f"({r['polars_rss_mib']} MiB)  ingest {r['ingest_s']:.3f} s ({r['ingest_rss_mib']} MiB)  "
            f"ratio {r['ratio']:.2f} (CPU s {r['polars_cpu_s']:.2f} vs {r['ingest_cpu_s']:.2f}: {r['cpu_ratio']:.2f}x)")
    if a.baseline:
        text += (f"  | baseline {r['baseline_s']:.3f} s ({r['baseline_rss_mib']} MiB) ratio "
                 f"{r['baseline_ratio']:.2f}")
    return text + f"  [median of {a.repeat} paired rounds]"


if __name__ == "__main__":
    main()
