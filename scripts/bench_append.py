#!/usr/bin/env python3
"""Daily append cost: one new day for every symbol of a 1,500 x 2,500 store, against that store's full ingest.

Both run as `kline-store` processes (start-up included, as a user runs them), best of --repeat.

    python scripts/bench_append.py [--symbols 1500 --days 2500 --repeat 3 --json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import make_csv, run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--symbols", type=int, default=1500)
    ap.add_argument("--days", type=int, default=2500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kline-append-"))
    try:
        full = work / "all.csv"
        make_csv(full, a.symbols, a.days + 1)
        df = pl.read_csv(full, schema_overrides={"trade_date": pl.Int64})
        last = df["trade_date"].max()
        df.filter(pl.col("trade_date") < last).write_csv(work / "history.csv")
        df.filter(pl.col("trade_date") == last).write_csv(work / "day.csv")
        from kline_store import append, ingest
        exe = [sys.executable, "-m", "kline_store.cli"]
        t = {"ingest": [], "append": [], "ingest_proc": [], "append_proc": []}
        for _ in range(a.repeat):
            # In process (the library calls a scheduler or notebook makes) ...
            shutil.rmtree(work / "store", ignore_errors=True)
            t0 = time.perf_counter()
            ingest([work / "history.csv"], work / "store")
            t["ingest"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            rep = append(work / "store", [work / "day.csv"])
            t["append"].append(time.perf_counter() - t0)
            assert rep.extra["mode"] == "tail", rep.extra
            # ... and as CLI processes, interpreter and import start-up (~0.3 s) included.
            shutil.rmtree(work / "store", ignore_errors=True)
            t["ingest_proc"].append(run(exe + ["ingest", str(work / "history.csv"), "-o", str(work / "store"), "-q"])[0])
            t["append_proc"].append(run(exe + ["append", str(work / "store"), str(work / "day.csv"), "-q"])[0])
        b = {k: min(v) for k, v in t.items()}
        out = {"symbols": a.symbols, "days": a.days, **{f"{k}_s": round(v, 3) for k, v in b.items()},
               "ratio": round(b["append"] / b["ingest"], 4),
               "ratio_processes": round(b["append_proc"] / b["ingest_proc"], 4)}
        if a.json:
            print(json.dumps(out))
        else:
            print(f"store {a.symbols} symbols x {a.days} days; best of {a.repeat}")
            print(f"  in process: full ingest {b['ingest']:.3f} s, append one day {b['append']:.3f} s, "
                  f"ratio {out['ratio'] * 100:.1f}%  (target <= 5%)")
            print(f"  processes : full ingest {b['ingest_proc']:.3f} s, append one day {b['append_proc']:.3f} s, "
                  f"ratio {out['ratio_processes'] * 100:.1f}%  (start-up included)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
