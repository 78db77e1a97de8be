#!/usr/bin/env python3
"""KunQuant 0.1.12's compiled Alpha158, run in KunQuant's own virtualenv (scripts/_kunquant_env.sh) as a
subprocess of the benchmark and the comparison test: it never imports kline-store.

    python kunquant_side.py IN.npz --dtype double|float [--rounds N] [--out OUT.npz] [--cache DIR] [--fast-stat]
                            [--block N]

IN.npz: open, high, low, close, volume as [symbols, days] arrays (NaN where a symbol has no bar). The
generated library is compiled once per dtype and option set into --cache (the compile time is reported the
run that pays it) and loaded from there afterwards. Each round runs the whole graph on one thread
(createSingleThreadExecutor); printed as one JSON line: process CPU and wall seconds of each round (the
runGraph call alone), compile seconds, peak RSS. --out writes every factor as [symbols, days] float64.
--block N: the symbols N at a time (a multiple of 8; the output buffers of one block reused, what they held
discarded), each round's seconds summed over the blocks: a panel whose whole output would not fit in memory
(5,000 x 2,500 in float64: 15.8 GB).
Alpha158 as Qlib's handler defines it: kbar, OPEN0/HIGH0/LOW0 (no VWAP0: the stores carry no amount), the
rolling families over windows 5, 10, 20, 30, 60.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def build(dtype: str, fast_stat: bool, cache: str) -> tuple[str, float | None]:
    from KunQuant.Driver import KunCompilerConfig
    from KunQuant.jit import cfake
    from KunQuant.Op import Builder, Input, Output
    from KunQuant.predefined.Alpha158 import AllData
    from KunQuant.Stage import Function

    simd = 8 if dtype == "float" else 4  # AVX2 lanes
    libname = f"alpha158_{dtype}_{'fast' if fast_stat else 'exact'}_b{simd}"
    path = os.path.join(cache, libname, f"{libname}.so")
    if os.path.exists(path):
        return path, None
    t0 = time.perf_counter()
    builder = Builder()
    with builder:
        pack = AllData(low=Input("low"), high=Input("high"), close=Input("close"), open=Input("open"),
                       amount=Input("amount"), volume=Input("volume"))
        factors, names = pack.build({
            "kbar": {},
            "price": {"windows": [0], "feature": [("OPEN", pack.open), ("HIGH", pack.high), ("LOW", pack.low)]},
            "rolling": {"windows": [5, 10, 20, 30, 60]},
        })
        for v, k in zip(factors, names):
            Output(v, k)
    options = {"opt_reduce": True, "fast_log": True, "no_fast_stat": False if fast_stat else "no_warn"}
    target = [("alpha158", Function(builder.ops), KunCompilerConfig(
        dtype=dtype, blocking_len=simd, partition_factor=4, output_layout="TS", input_layout="TS",
        options=options))]
    os.makedirs(cache, exist_ok=True)
    built = cfake.compileit(target, libname, cfake.CppCompilerConfig(), tempdir=cache, keep_files=True,
                            load=False)
    return built, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs")
    ap.add_argument("--dtype", choices=["double", "float"], default="double")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "kline-store", "kunquant"))
    ap.add_argument("--fast-stat", action="store_true", help="KunQuant's fast (running) window statistics")
    ap.add_argument("--block", type=int, help="symbols per runGraph call (a multiple of 8), outputs discarded")
    a = ap.parse_args()
    from KunQuant.runner import KunRunner as kr

    path, compile_s = build(a.dtype, a.fast_stat, a.cache)
    lib = kr.Library.load(path)
    mod = lib.getModule("alpha158")
    np_dtype = np.float64 if a.dtype == "double" else np.float32
    data = np.load(a.inputs)
    n_sym, n_days = data["close"].shape
    simd = 8 if a.dtype == "float" else 4
    padded = -(-n_sym // simd) * simd  # KunQuant's TS layout takes whole SIMD blocks of symbols
    if a.block and (a.block % 8 or a.out):
        raise SystemExit("--block takes a multiple of 8 symbols, and no --out")
    width = min(padded, -(-a.block // simd) * simd) if a.block else padded
    fields = [data[name] for name in ("open", "high", "low", "close", "volume")]
    executor = kr.createSingleThreadExecutor()
    names = list(mod.getOutputNames())
    outs = {k: np.empty((n_days, width), dtype=np_dtype) for k in names}
    inputs = {name: np.full((n_days, width), np.nan, dtype=np_dtype)
              for name in ("open", "high", "low", "close", "volume", "amount")}
    cpu, wall = [], []
    for _ in range(a.rounds):
        c_sum = w_sum = 0.0
        for s0 in range(0, n_sym, width):
            s1 = min(n_sym, s0 + width)
            for name, v in zip(("open", "high", "low", "close", "volume"), fields):
                inputs[name][:, : s1 - s0] = v[s0:s1].T   # the layout copy is not timed (KunQuant's input)
                inputs[name][:, s1 - s0:] = np.nan
            t0, c0 = time.perf_counter(), time.process_time()
            kr.runGraph(executor, mod, inputs, 0, n_days, outs)
            w_sum += time.perf_counter() - t0
            c_sum += time.process_time() - c0
        wall.append(w_sum)
        cpu.append(c_sum)
    if a.out:
        np.savez(a.out, **{k: v[:, :n_sym].T.astype(np.float64) for k, v in outs.items()})
    peak = [int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")]
    print(json.dumps({"compile_s": compile_s, "library": path, "cpu_s": cpu, "wall_s": wall, "names": names,
                      "symbols": n_sym, "days": n_days, "block": width, "peak_rss_mib": peak[0] if peak else None}))


if __name__ == "__main__":
    sys.exit(main())
