#!/usr/bin/env python
"""Intraday scale benchmark: 1,000 symbols x 60,000 one-minute bars (a 1.4 GB store) from Parquet.

    python scripts/bench_intraday.py [--symbols 1000] [--days 250] [--keep DIR]

Writes a synthetic A-share minute file (240 bars a day, end-stamped sessions) in a child process, then times
and measures, each in its own process so peak RSS is that step's alone:
  1. a bare ``polars.read_parquet`` of the file (the floor any reader pays);
  2. ``kline-store ingest FILE --sessions ashare`` (bounded memory: the file is decoded a slice at a time);
  3. the loader's windows/s (window 240 bars, batch 256) against the ceiling measured in the same process;
  4. ``kline-store append`` of one more day (240 bars per symbol) against the full ingest.
Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_minutes(path: str, symbols: int, days: int, first_day: int, seed: int) -> None:
    """Random-walk minute bars of an A-share day (09:31-11:30, 13:01-15:00) for ``days`` weekdays."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    clock = np.r_[np.arange(9 * 60 + 31, 11 * 60 + 31), np.arange(13 * 60 + 1, 15 * 60 + 1)].astype(np.int64)
    day0 = np.busday_offset(np.datetime64("2021-01-04"), first_day, roll="forward")
    dates = np.busday_offset(day0, np.arange(days), roll="forward").astype(np.int64)
    stamps = (dates[:, None] * 1440 + clock[None, :]).reshape(-1) * 60_000   # ms since epoch
    n = len(stamps)
    schema = pa.schema([("symbol", pa.string()), ("time", pa.timestamp("ms")), ("open", pa.float32()),
                        ("high", pa.float32()), ("low", pa.float32()), ("close", pa.float32()),
                        ("volume", pa.float32()), ("amount", pa.float32())])
    with pq.ParquetWriter(path, schema) as w:
        for s in range(symbols):
            close = (10 * np.exp(np.cumsum(rng.normal(0, 0.001, n)))).astype(np.float32)
            opens = close * (1 + rng.normal(0, 0.0005, n)).astype(np.float32)
            vol = rng.integers(100, 10_000, n).astype(np.float32)
            w.write_table(pa.table({"symbol": pa.array([f"S{s:05d}"] * n), "time": pa.array(stamps, pa.timestamp("ms")),
                                    "open": opens, "high": np.maximum(opens, close) * 1.001,
                                    "low": np.minimum(opens, close) * 0.999, "close": close, "volume": vol,
                                    "amount": vol * close}, schema=schema))


def run_child(code: str) -> tuple[dict, float]:
    """Run Python code in a child process; the JSON it prints last, and its own peak RSS in MiB."""
    code = code.replace("print(json.dumps(", "import resource; print(json.dumps({'rss': "
                        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, **")
    code = code[: code.rindex("))")] + "}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res, res["rss"] / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--symbols", type=int, default=1000)
    p.add_argument("--days", type=int, default=250)
    p.add_argument("--keep", help="work in this folder and keep it")
    args = p.parse_args()
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="kline-intraday-"))
    tmp.mkdir(parents=True, exist_ok=True)
    data, extra, store = tmp / "minutes.parquet", tmp / "next_day.parquet", tmp / "store"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                    f"from scripts.bench_intraday import write_minutes; "
                    f"write_minutes({str(data)!r}, {args.symbols}, {args.days}, 0, 0); "
                    f"write_minutes({str(extra)!r}, {args.symbols}, 1, {args.days}, 1)"], check=True)
    print(f"wrote {data} ({data.stat().st_size / 2**20:,.0f} MiB, {args.symbols} symbols x {args.days * 240:,} "
          f"bars) in {time.perf_counter() - t0:.0f}s", flush=True)
    read, read_rss = run_child(f"import time, json, polars as pl; t=time.perf_counter(); df=pl.read_parquet({str(data)!r}); "
                               f"print(json.dumps({{'s': time.perf_counter()-t, 'rows': df.height}}))")
    ing, ing_rss = run_child(f"import time, json; from kline_store import ingest; t=time.perf_counter(); "
                             f"ingest([{str(data)!r}], {str(store)!r}, sessions='ashare', replace=True); "
                             f"print(json.dumps({{'s': time.perf_counter()-t}}))")
    app, app_rss = run_child(f"import time, json; from kline_store import append; t=time.perf_counter(); "
                             f"r=append({str(store)!r}, [{str(extra)!r}]); "
                             f"print(json.dumps({{'s': time.perf_counter()-t, 'mode': r.extra['mode']}}))")
    load, _ = run_child(
        "import json, numpy as np, torch; from kline_store import KlineDataset; from kline_store.measure.bench import ceiling;"
        "from kline_store.measure.timing import time_batches, shut_down;"
        f"ds=KlineDataset({str(store)!r}, window=240); n=min(1_000_000, len(ds));"
        "o=np.random.default_rng(0).permutation(len(ds))[:n]; s,t=ds.locate(o);"
        "start=torch.from_numpy(s*ds.store.date_capacity+t-239); c,how=ceiling(ds,start,256);"
        "ld=ds.loader(batch_size=256); r=time_batches(ld, samples=n, warmup_batches=8).samples_per_s; shut_down(ld);"
        "print(json.dumps({'windows': len(ds), 'ceiling': c, 'how': how, 'loader': r}))")
    size = args.symbols * (args.days + 1) * 240 * 6 * 4
    print(f"\n{'step':<44}{'seconds':>9}{'peak RSS':>12}")
    print(f"{'polars.read_parquet (bare read)':<44}{read['s']:>9.1f}{read_rss:>9,.0f} MiB")
    print(f"{'kline-store ingest --sessions ashare':<44}{ing['s']:>9.1f}{ing_rss:>9,.0f} MiB   "
          f"({ing['s'] / read['s']:.1f}x the bare read; store {size / 2**30:.2f} GiB)")
    print(f"{'kline-store append one day (' + app['mode'] + ')':<44}{app['s']:>9.2f}{app_rss:>9,.0f} MiB   "
          f"({100 * app['s'] / ing['s']:.1f}% of the full ingest)")
    print(f"\nloader, window 240 bars x 6 fields, batch 256, {load['windows']:,} windows: "
          f"{load['loader']:,.0f} windows/s, ceiling {load['ceiling']:,.0f} ({load['how']}): "
          f"{100 * load['loader'] / load['ceiling']:.0f}%")
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
