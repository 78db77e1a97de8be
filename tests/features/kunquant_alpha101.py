"""KunQuant's side of the Alpha101 comparison: run in KunQuant 0.1.12's virtualenv, never imported by the tests.

    python kunquant_alpha101.py CACHE_DIR IN.npz OUT.npz [alpha001 alpha002 ...]

Compiles KunQuant's own predefined Alpha101 (the named alphas, all 82 without names) to a library once per
(names, dtype) and keeps it in CACHE_DIR (a compile of all 82 takes about 30 s to minutes), then runs it on one
thread over IN's panel ([stocks, time] float64 arrays open, high, low, close, volume, vwap; stocks a multiple of
4) and writes each alpha as [stocks, time] float64 to OUT. Prints `ok` and the compile and run seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from KunQuant.Driver import KunCompilerConfig
from KunQuant.jit import cfake
from KunQuant.Op import Builder, Input, Output
from KunQuant.predefined import Alpha101
from KunQuant.runner import KunRunner as kr
from KunQuant.Stage import Function

DTYPE = "double"
INPUTS = ("open", "high", "low", "close", "volume", "vwap")


def library(cache: Path, names: list[str]) -> tuple[object, float]:
    key = hashlib.sha256(" ".join([DTYPE, *INPUTS, *names]).encode()).hexdigest()[:12]
    libname = f"alpha101_{key}"
    folder = cache / libname
    done = folder / "lib"                  # a finished build, renamed into place whole
    found = sorted(done.glob(f"**/{libname}.so"))
    if found:
        return kr.Library.load(str(found[0])), 0.0
    t0 = time.perf_counter()
    builder = Builder()
    with builder:
        data = Alpha101.AllData(**{k: Input(k) for k in INPUTS})      # vwap given: no amount / volume
        for fn in Alpha101.all_alpha:
            if fn.__name__ in names:
                Output(fn(data), fn.__name__)
    # precise statistics and log: the comparison is of formulas, not of KunQuant's fast approximations
    cfg = KunCompilerConfig(dtype=DTYPE, blocking_len=8 if DTYPE == "float" else 4, input_layout="TS",
                            output_layout="TS", options={"opt_reduce": True, "fast_log": False,
                                                         "no_fast_stat": True})
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"build-{os.getpid()}"
    cfake.compileit([("alpha101", Function(builder.ops), cfg)], libname, cfake.CppCompilerConfig(),
                    tempdir=str(tmp), keep_files=True, load=False)
    try:
        tmp.rename(done)
    except OSError:                        # another process finished first: use its build
        shutil.rmtree(tmp, ignore_errors=True)
    return kr.Library.load(str(sorted(done.glob(f"**/{libname}.so"))[0])), time.perf_counter() - t0


def main() -> None:
    cache, path_in, path_out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    names = sys.argv[4:] or [fn.__name__ for fn in Alpha101.all_alpha]
    lib, compile_s = library(cache, sorted(names))
    panel = np.load(path_in)
    inputs = {k: np.ascontiguousarray(panel[k].T, dtype=np.float64) for k in INPUTS}   # TS layout
    n_time = inputs["close"].shape[0]
    executor = kr.createSingleThreadExecutor()
    t0 = time.perf_counter()
    out = kr.runGraph(executor, lib.getModule("alpha101"), inputs, 0, n_time)
    run_s = time.perf_counter() - t0
    np.savez(path_out, **{k: np.asarray(v).T for k, v in out.items()})
    print(f"ok compile {compile_s:.1f} run {run_s:.3f}", flush=True)


if __name__ == "__main__":
    main()
