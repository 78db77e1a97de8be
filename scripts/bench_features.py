#!/usr/bin/env python3
"""Alpha158 with kline-store against Qlib's own D.features, on the same data and machine, in one run.

1. Real A-share daily files (../shared/data/real/ashare_qfq_daily/data_20251009, 154 symbols) are ingested,
   exported as a Qlib provider directory, and Qlib 0.9.7 (in .venv-qlib) computes the 158 Alpha158 expressions
   and LABEL0 with D.features after qlib.init; ks.compute_features computes the same into a features store in a
   warm process (torch imported, one call made before). Each side's best of --repeat, and each side as a whole
   command (interpreter start-up, imports and init included) with its peak RSS.
2. A synthetic store of --symbols x --days (default 5,000 x 2,500, ~9.5% of the cells missing: late listings
   and suspensions): on one thread compute_features (a child: process CPU s, wall, peak RSS) against KunQuant
   f64 and f32 over the same panel, --kunquant-block symbols a call (outputs discarded; compile time apart);
   then the features command (default threads) as a process, one appended day and `update_features`: the
   update's share of the full time. --scale-only skips 1 and 3; --scale-one-thread-only keeps the one-thread rows.

3. KunQuant 0.1.12 (its own virtualenv, scripts/_kunquant_env.sh): Alpha158 on one thread beside ours on the
   real panel (interleaved rounds, process CPU seconds; see _bench_kunquant.py), evaluate on 1 and 2 threads
   without and with a CPU hog on one core, and with --kunquant-synthetic SxT a synthetic panel with 9.5% NaN.

    python scripts/bench_features.py [--repeat 3] [--symbols 5000 --days 2500] [--skip-qlib] [--skip-scale]
                                     [--skip-kunquant] [--kunquant-synthetic 5000x2500] [--scale-only]
                                     [--scale-one-thread-only] [--kunquant-block 256]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import run  # noqa: E402
import _bench_kunquant as kunquant  # noqa: E402

REAL = Path(os.environ.get("KLINE_REAL_DATA", ROOT.parent / "shared" / "data" / "real"))
QLIB_PY = Path(os.environ.get("KLINE_QLIB_PYTHON", ROOT / ".venv-qlib" / "bin" / "python"))

QLIB_SIDE = r"""
import json, resource, sys, time
t_start = time.perf_counter()
import qlib
from qlib.data import D
uri, exprs_file, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
exprs = json.load(open(exprs_file))
qlib.init(provider_uri=uri, region="cn", expression_cache=None, dataset_cache=None)
t_init = time.perf_counter()
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    df = D.features(D.instruments("all"), exprs, freq="day")
    times.append(time.perf_counter() - t0)
print(json.dumps({"best_s": min(times), "runs_s": times, "cells": int(df.size), "rows": int(len(df)),
                  "init_s": t_init - t_start, "process_s": time.perf_counter() - t_start,
                  "peak_rss_mib": [int(l.split()[1]) / 1024 for l in open("/proc/self/status")
                                   if l.startswith("VmHWM:")][0]}))
"""


HWM = ("import atexit, runpy, sys\n"
       "out = sys.argv.pop(1)\n"
       "def report():\n"
       "    hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
       "    open(out, 'w').write(hwm)\n"
       "atexit.register(report)\n"
       "sys.argv[0] = 'kline-store'\n"
       "runpy.run_module('kline_store.cli', run_name='__main__')\n")


def command(args: list[str], work: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `kline-store ARGS` as a process. The peak is the process's own VmHWM
    (ru_maxrss of a child would inherit this benchmark's high-water mark across fork and exec)."""
    hwm = work / "hwm.txt"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", HWM, str(hwm), *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed: kline-store {' '.join(args)}: {done.stderr[-500:]}")
    return wall, int(hwm.read_text()) / 1024


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def qlib_comparison(work: Path, repeat: int, skip_qlib: bool) -> dict:
    import kline_store as ks
    from kline_store.features.sets import alpha158, label

    src = REAL / "ashare_qfq_daily" / "data_20251009"
    if not src.is_dir():
        return {"skipped": f"real data not found at {src}"}
    store, qdir, feats = work / "ashare", work / "qlib", work / "alpha158"
    ks.ingest([src], store)
    ks.export(store, qdir, fmt="qlib")
    exprs = {**alpha158(), **label()}
    ks.compute_features(store, feats, sets=["alpha158"])                     # warm: imports, first call
    ours = timed(lambda: ks.compute_features(store, feats, sets=["alpha158"], replace=True), repeat)
    # The floor of any features store this size: 159 fields that only copy $close, through the same reads,
    # placing, checksums, fsyncs and manifest; what no engine, however fast, can go below on this disk.
    copies = {f"C{i:03d}": "$close" for i in range(len(exprs))}
    ks.compute_features(store, work / "floor", sets=[], exprs=copies, label=None)
    floor = timed(lambda: ks.compute_features(store, work / "floor", sets=[], exprs=copies, label=None,
                                              replace=True), repeat)
    cli_s, cli_rss = command(["features", str(store), "-o", str(work / "cli"), "-q"], work)
    st = ks.open_store(store)
    out = {"symbols": st.n_symbols, "days": st.n_dates, "ours_best_s": min(ours), "ours_runs_s": ours,
           "floor_best_s": min(floor),
           "ours_command_s": cli_s, "ours_command_peak_rss_mib": cli_rss}
    if skip_qlib or not QLIB_PY.exists():
        out["qlib"] = "skipped" if skip_qlib else f"Qlib's python not found at {QLIB_PY}"
        return out
    (work / "exprs.json").write_text(json.dumps(list(exprs.values())))
    (work / "qlib_side.py").write_text(QLIB_SIDE)
    t0 = time.perf_counter()
    done = subprocess.run([str(QLIB_PY), str(work / "qlib_side.py"), str(qdir), str(work / "exprs.json"),
                           str(repeat)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        out["qlib"] = f"failed: {done.stderr[-400:]}"
        return out
    q = json.loads(done.stdout.strip().splitlines()[-1])
    out.update(qlib_best_s=q["best_s"], qlib_runs_s=q["runs_s"], qlib_init_s=q["init_s"], qlib_command_s=wall,
               qlib_peak_rss_mib=q["peak_rss_mib"], qlib_cells=q["cells"],
               speedup_warm=q["best_s"] / min(ours), speedup_command=wall / cli_s,
               floor_speedup=q["best_s"] / min(floor))
    return out


def _long_frame(data: dict, d0: int, d1: int):
    """The panel's present cells on days d0 .. d1 as long daily bars (ts_code, trade_date, OHLC, vol)."""
    import numpy as np
    import polars as pl

    n_sym, n_all = data["close"].shape
    days = np.arange(np.datetime64("2010-01-04"), np.datetime64("2010-01-04") + n_all * 7 // 5 + 10)
    days = days[np.is_busday(days)][:n_all]
    ymd = (days.astype("datetime64[D]").astype(object))
    ymd = np.array([d.year * 10000 + d.month * 100 + d.day for d in ymd], dtype=np.int64)[d0:d1]
    here = ~np.isnan(data["close"][:, d0:d1])
    sym, day = np.nonzero(here)
    codes = np.array([f"{s:06d}.SZ" for s in range(n_sym)])
    cols = {k: data[k][:, d0:d1][here] for k in ("open", "high", "low", "close")}
    return pl.DataFrame({"ts_code": codes[sym], "trade_date": ymd[day], **cols, "vol": data["volume"][:, d0:d1][here]})


def scale(work: Path, n_sym: int, n_days: int, kq_block: int, one_thread_only: bool = False) -> dict:
    """A synthetic store of n_sym x n_days with ~9.5% of its cells missing (late listings, suspensions): on one
    thread compute_features against KunQuant f64/f32 (in blocks of symbols) over the same panel; then the
    features command (default threads) as a process, one appended day and update_features."""
    import numpy as np

    data = kunquant.synthetic_panel(n_sym, n_days + 1)
    npz = work / "panel.npz"
    np.savez(npz, **{k: data[k][:, :n_days] for k in kunquant.FIELDS})
    _long_frame(data, 0, n_days).write_parquet(work / "history.parquet")
    _long_frame(data, n_days, n_days + 1).write_csv(work / "day.csv")
    nan_rate = float(np.isnan(data["close"][:, :n_days]).mean())
    del data
    exe = [sys.executable, "-m", "kline_store.cli"]
    run(exe + ["ingest", str(work / "history.parquet"), "-o", str(work / "base"), "-q"])
    out = {"symbols": n_sym, "days": n_days, "fields": 159, "nan_rate": nan_rate,
           "one_thread": kunquant.scale_rows(work, work / "base", npz, kq_block)}
    npz.unlink()
    if one_thread_only:
        return out
    full_s, full_rss = command(["features", str(work / "base"), "-o", str(work / "feats"), "-q"], work)
    out_bytes = sum(p.stat().st_blocks * 512 for p in (work / "feats").glob("data-*.f32"))
    run(exe + ["append", str(work / "base"), str(work / "day.csv"), "-q"])
    code = ("import time, json, kline_store as ks; t=time.perf_counter(); "
            f"r=ks.update_features({str(work / 'feats')!r}); "
            "print(json.dumps({'s': time.perf_counter()-t, 'mode': r.mode}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    upd = json.loads(done.stdout.strip().splitlines()[-1])
    upd_cmd_s, _ = command(["features", str(work / "feats"), "--update", "-q"], work)   # nothing new: start-up
    return {**out, "full_command_s": full_s, "full_peak_rss_mib": full_rss, "output_gib": out_bytes / 2**30,
            "update_s": upd["s"], "update_mode": upd["mode"], "update_share_of_full": upd["s"] / full_s,
            "noop_update_command_s": upd_cmd_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--symbols", type=int, default=5000)
    ap.add_argument("--days", type=int, default=2500)
    ap.add_argument("--skip-qlib", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--skip-kunquant", action="store_true")
    ap.add_argument("--kunquant-synthetic", metavar="SxT", help="also a synthetic panel, e.g. 5000x2500")
    ap.add_argument("--scale-only", action="store_true",
                    help="only the synthetic --symbols x --days panel (no real panel, no Qlib)")
    ap.add_argument("--scale-one-thread-only", action="store_true",
                    help="at scale, only the one-thread rows (compute_features against KunQuant)")
    ap.add_argument("--kunquant-block", type=int, default=256,
                    help="symbols a KunQuant call at scale (a multiple of 8; default 256)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kline-features-"))
    try:
        res = {"load_before": os.getloadavg()[0], "qlib_comparison": {"skipped": "--scale-only"} if a.scale_only
               else qlib_comparison(work / "q", a.repeat, a.skip_qlib)}
        if not a.skip_kunquant and (work / "q" / "ashare").is_dir():
            res["kunquant"] = kunquant.side_by_side(work / "q" / "ashare", work, a.repeat)
            res["threads"] = kunquant.threads_rows(work / "q" / "ashare", a.repeat)
        if a.kunquant_synthetic:
            n_sym, n_days = (int(v) for v in a.kunquant_synthetic.lower().split("x"))
            res["kunquant_synthetic"] = kunquant.synthetic(work, n_sym, n_days)
        if not a.skip_scale:
            (work / "s").mkdir()
            res["scale"] = scale(work / "s", a.symbols, a.days, a.kunquant_block, a.scale_one_thread_only)
        res["load_after"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(res, indent=1))
        return
    q = res["qlib_comparison"]
    print(f"load {res['load_before']:.2f} -> {res['load_after']:.2f}")
    if "ours_best_s" in q:
        print(f"alpha158 + LABEL0, {q['symbols']} A-share symbols x {q['days']} days:")
        print(f"  kline-store compute_features (warm process): {q['ours_best_s']:.3f} s (runs "
              f"{', '.join(f'{t:.3f}' for t in q['ours_runs_s'])}); as a command: {q['ours_command_s']:.2f} s, "
              f"peak RSS {q['ours_command_peak_rss_mib']:.0f} MiB")
        if "qlib_best_s" in q:
            print(f"  Qlib D.features (after qlib.init): {q['qlib_best_s']:.2f} s (runs "
                  f"{', '.join(f'{t:.2f}' for t in q['qlib_runs_s'])}); as a command: {q['qlib_command_s']:.2f} s, "
                  f"peak RSS {q['qlib_peak_rss_mib']:.0f} MiB")
            print(f"  speed-up: {q['speedup_warm']:.1f}x warm, {q['speedup_command']:.1f}x as commands")
            print(f"  floor (159 fields copying $close, same writer): {q['floor_best_s']:.3f} s, i.e. at most "
                  f"{q['floor_speedup']:.0f}x Qlib for any engine writing this store")
        else:
            print(f"  Qlib: {q.get('qlib')}")
    else:
        print(f"Qlib comparison: {q}")
    for line in kunquant.lines(res):
        print(line)
    s = res.get("scale")
    if s and "full_command_s" in s:
        print(f"scale: {s['symbols']} x {s['days']} x {s['fields']} fields ({s['output_gib']:.1f} GiB written): "
              f"{s['full_command_s']:.1f} s, peak RSS {s['full_peak_rss_mib']:.0f} MiB; one appended day: "
              f"update {s['update_s']:.2f} s ({s['update_mode']}), {100 * s['update_share_of_full']:.2f}% of the "
              f"full run; a no-op update command {s['noop_update_command_s']:.2f} s")


if __name__ == "__main__":
    main()
