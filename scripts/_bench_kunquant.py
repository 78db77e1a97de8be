"""bench_features.py's side-by-side with KunQuant 0.1.12 and its threads rows (imported by it).

Alpha158 (+ LABEL0 on our side) on one thread: kline-store's compute_features and evaluate in this process,
KunQuant's compiled graph (float64 and float32) in its own virtualenv through scripts/kunquant_side.py;
rounds interleaved (ours, KunQuant f64, KunQuant f32, ...), best of rounds, process CPU seconds of the
computation alone (KunQuant: the runGraph call; ours: the call), wall beside. KunQuant's compile time is
taken the first time (a fresh cache folder in the benchmark's temporary directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KQ_PY = Path(os.environ.get("KLINE_KUNQUANT_PYTHON", ROOT / ".venv-kunquant" / "bin" / "python"))
SIDE = ROOT / "scripts" / "kunquant_side.py"
FIELDS = ("open", "high", "low", "close", "volume")


def _kunquant(npz: Path, dtype: str, cache: Path, rounds: int = 1, block: int | None = None) -> dict:
    done = subprocess.run([str(KQ_PY), str(SIDE), str(npz), "--dtype", dtype, "--rounds", str(rounds),
                           "--cache", str(cache), *(["--block", str(block)] if block else [])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kunquant_side.py failed: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def side_by_side(store: Path, work: Path, rounds: int) -> dict:
    """The real panel: compute_features and evaluate (one thread) against KunQuant f64/f32 (one thread)."""
    import torch

    import kline_store as ks
    from kline_store.features.compute import _sources, evaluate_block
    from kline_store.features.plan import make_plan

    if not KQ_PY.exists():
        return {"skipped": f"KunQuant's python not found at {KQ_PY} (scripts/_kunquant_env.sh builds it)"}
    st = ks.open_store(store)
    panel = np.asarray(st.panel, dtype=np.float64)
    npz = work / "kq_in.npz"
    np.savez(npz, **{f: panel[:, :, st.fields.index(f)] for f in FIELDS})
    cache = work / "kq_cache"
    compile_s = {d: _kunquant(npz, d, cache)["compile_s"] for d in ("double", "float")}
    plan = make_plan(["alpha158"])
    index, _ = _sources(st, plan)
    feats = work / "kq_ours"

    def ours_compute():
        ks.compute_features(store, feats, sets=["alpha158"], replace=True, threads=1)

    def ours_evaluate():
        evaluate_block(st, slice(0, st.n_symbols), 0, plan, index, torch.device("cpu"), threads=1)

    ours_compute()
    ours_evaluate()                                     # warm: numba's cache loaded, first calls made
    rows: dict[str, list[tuple[float, float]]] = {"compute_features": [], "evaluate": [], "kunquant_f64": [],
                                                  "kunquant_f32": []}
    for _ in range(rounds):
        rows["compute_features"].append(_cpu(ours_compute))
        rows["evaluate"].append(_cpu(ours_evaluate))
        for d, key in (("double", "kunquant_f64"), ("float", "kunquant_f32")):
            r = _kunquant(npz, d, cache)
            rows[key].append((r["cpu_s"][0], r["wall_s"][0]))
    best = {k: min(v) for k, v in rows.items()}
    return {"symbols": st.n_symbols, "days": st.n_dates, "rounds": rounds,
            "cpu_s": {k: v[0] for k, v in best.items()}, "wall_s": {k: v[1] for k, v in best.items()},
            "kunquant_compile_s": compile_s,
            "ratio_compute_to_kunquant_f64": best["compute_features"][0] / best["kunquant_f64"][0]}


def _hog() -> subprocess.Popen:
    """A process that keeps one core busy (pinned to CPU 0 where taskset exists)."""
    spin = [sys.executable, "-c", "while True: pass"]
    try:
        return subprocess.Popen(["taskset", "-c", "0", *spin])
    except FileNotFoundError:
        return subprocess.Popen(spin)


def threads_rows(store: Path, rounds: int) -> dict:
    """evaluate (Alpha158 + LABEL0) on 1 and 2 threads, without and with a CPU hog on one core: wall seconds
    (what threads are for), best of interleaved rounds."""
    import torch

    import kline_store as ks
    from kline_store.features.compute import _sources, evaluate_block
    from kline_store.features.plan import make_plan

    st = ks.open_store(store)
    plan = make_plan(["alpha158"])
    index, _ = _sources(st, plan)

    def run(n):
        return lambda: evaluate_block(st, slice(0, st.n_symbols), 0, plan, index, torch.device("cpu"), threads=n)

    run(2)()
    out = {}
    for label in ("quiet", "hog"):
        hog = _hog() if label == "hog" else None
        try:
            times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
            for _ in range(rounds):
                for n in (1, 2):
                    times[n].append(_cpu(run(n)))
        finally:
            if hog:
                hog.kill()
                hog.wait()
        out[label] = {f"{n}_thread_wall_s": min(t[1] for t in v) for n, v in times.items()}
        out[label].update({f"{n}_thread_cpu_s": min(t[0] for t in v) for n, v in times.items()})
    out["load_now"] = os.getloadavg()[0]
    return out


def synthetic_panel(n_sym: int, n_days: int, nan_rate: float = 0.095, seed: int = 0) -> dict[str, np.ndarray]:
    """open, high, low, close, volume [n_sym, n_days] float32 with nan_rate of the cells missing (late
    listings: ~nan_rate / 2 of the cells, suspensions: the other half), and ``first`` (each symbol's listing)."""
    rng = np.random.default_rng(seed)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_days)), axis=1))
    opn = close * np.exp(rng.normal(0, 0.01, close.shape))
    data = {"open": opn, "high": np.maximum(opn, close) * 1.01, "low": np.minimum(opn, close) * 0.99,
            "close": close, "volume": np.round(rng.lognormal(10, 1, close.shape), -2)}
    first = rng.integers(0, int(n_days * nan_rate), n_sym)
    gone = rng.uniform(size=close.shape) < nan_rate / 2
    gone |= np.arange(n_days)[None, :] < first[:, None]
    out = {k: np.where(gone, np.nan, v).astype(np.float32) for k, v in data.items()}
    return {**out, "first": first}


def synthetic(work: Path, n_sym: int, n_days: int, nan_rate: float = 0.095) -> dict:
    """evaluate alone (one thread, a child process: CPU seconds and peak RSS) against KunQuant f64/f32 on a
    synthetic [n_sym, n_days] panel with nan_rate of its cells missing (late listings and suspensions)."""
    if not KQ_PY.exists():
        return {"skipped": f"KunQuant's python not found at {KQ_PY}"}
    npz = work / "syn.npz"
    np.savez(npz, **synthetic_panel(n_sym, n_days, nan_rate))
    code = (
        "import json, sys, time, numpy as np, torch\n"
        "from kline_store.features.evaluate import evaluate\n"
        "from kline_store.features.sets import alpha158, label\n"
        "d = np.load(sys.argv[1]); f = torch.from_numpy(d['first'])\n"
        "vals = {k: torch.from_numpy(d[k]) for k in ('open', 'high', 'low', 'close', 'volume')}\n"
        "ex = {**alpha158(), **label()}\n"
        "evaluate(ex, {k: v[:8] for k, v in vals.items()}, f[:8], torch.full((8,), 10**9), threads=1)\n"
        "c = time.process_time(); t = time.perf_counter()\n"
        "evaluate(ex, vals, f, torch.full(f.shape, 10**9), symbols_per_pass=250, threads=1)\n"
        "c, t = time.process_time() - c, time.perf_counter() - t\n"
        "hwm = [int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "print(json.dumps({'cpu_s': c, 'wall_s': t, 'peak_rss_mib': hwm}))\n")
    done = subprocess.run([sys.executable, "-c", code, str(npz)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"evaluate on the synthetic panel failed: {done.stderr[-600:]}")
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    cache = work / "kq_cache"
    kq = {d: _kunquant(npz, d, cache) for d in ("double", "float")}
    return {"symbols": n_sym, "days": n_days, "nan_rate": nan_rate, "evaluate": ours,
            "kunquant_f64": {k: kq["double"][k] for k in ("cpu_s", "wall_s", "peak_rss_mib", "compile_s")},
            "kunquant_f32": {k: kq["float"][k] for k in ("cpu_s", "wall_s", "peak_rss_mib", "compile_s")}}


# compute_features in a child on one thread: process CPU seconds (its background threads included: the
# writer's, the removal of a replaced version's files) and the peak RSS of the process.
_COMPUTE_CHILD = (
    "import json, sys, time, torch\n"
    "import kline_store as ks\n"
    "from kline_store.features.evaluate import evaluate\n"
    "from kline_store.features.sets import alpha158, label\n"
    "x = torch.rand(8, 80); x[0, :3] = float('nan')\n"        # numba's kernels loaded from its cache
    "evaluate({**alpha158(), **label()}, {k: x + 1 for k in ('open', 'high', 'low', 'close', 'volume')},\n"
    "         torch.zeros(8, dtype=torch.long), torch.full((8,), 79), threads=1)\n"
    "c = time.process_time(); t = time.perf_counter()\n"
    "ks.compute_features(sys.argv[1], sys.argv[2], sets=['alpha158'], threads=1)\n"
    "c, t = time.process_time() - c, time.perf_counter() - t\n"
    "from kline_store.store import reclaim; reclaim.wait()\n"
    "hwm = [int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
    "print(json.dumps({'cpu_s': c, 'wall_s': t, 'peak_rss_mib': hwm}))\n")


def scale_rows(work: Path, store: Path, npz: Path, block: int) -> dict:
    """The synthetic panel at scale, one thread: compute_features (+ LABEL0, the store written; a child) and
    KunQuant's Alpha158 f64 and f32 over the same panel, ``block`` symbols a runGraph call (its outputs of one
    block reused: the whole f64 output of 5,000 x 2,500 would be 15.8 GB), CPU seconds summed over the blocks;
    its compile time taken apart on a small panel."""
    done = subprocess.run([sys.executable, "-c", _COMPUTE_CHILD, str(store), str(work / "feats_1t")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"compute_features on the synthetic panel failed: {done.stderr[-600:]}")
    out = {"compute_features": json.loads(done.stdout.strip().splitlines()[-1])}
    shutil.rmtree(work / "feats_1t", ignore_errors=True)
    if not KQ_PY.exists():
        return {**out, "kunquant": f"skipped: KunQuant's python not found at {KQ_PY}"}
    d = np.load(npz)
    small = work / "kq_small.npz"
    np.savez(small, **{k: d[k][:8, :100] for k in FIELDS})
    cache = work / "kq_cache"
    for dtype, key in (("double", "kunquant_f64"), ("float", "kunquant_f32")):
        compile_s = _kunquant(small, dtype, cache)["compile_s"]
        r = _kunquant(npz, dtype, cache, block=block)
        out[key] = {"cpu_s": r["cpu_s"][0], "wall_s": r["wall_s"][0], "peak_rss_mib": r["peak_rss_mib"],
                    "compile_s": compile_s, "block": r["block"]}
    out["ratio_compute_to_kunquant_f64"] = out["compute_features"]["cpu_s"] / out["kunquant_f64"]["cpu_s"]
    return out


def lines(res: dict) -> list[str]:
    out = []
    k = res.get("kunquant")
    if k and "cpu_s" in k:
        c, w = k["cpu_s"], k["wall_s"]
        out.append(f"Alpha158 on one thread, {k['symbols']} x {k['days']} (best of {k['rounds']} interleaved "
                   "rounds; process CPU s, wall s):")
        for key, name in (("compute_features", "kline-store compute_features (+ LABEL0, store written)"),
                          ("evaluate", "kline-store evaluate (+ LABEL0)"),
                          ("kunquant_f64", "KunQuant 0.1.12 f64"), ("kunquant_f32", "KunQuant 0.1.12 f32")):
            out.append(f"  {name}: {c[key]:.3f} CPU s, {w[key]:.3f} wall s")
        out.append(f"  KunQuant compile: f64 {k['kunquant_compile_s']['double']:.1f} s, f32 "
                   f"{k['kunquant_compile_s']['float']:.1f} s; compute_features / KunQuant f64 CPU: "
                   f"{k['ratio_compute_to_kunquant_f64']:.2f}")
    elif k:
        out.append(f"KunQuant: {k}")
    t = res.get("threads")
    if t:
        for label in ("quiet", "hog"):
            r = t[label]
            out.append(f"  evaluate {label}{' (a CPU hog on one core)' if label == 'hog' else ''}: 1 thread "
                       f"{r['1_thread_wall_s']:.3f} s wall ({r['1_thread_cpu_s']:.3f} CPU), 2 threads "
                       f"{r['2_thread_wall_s']:.3f} s wall ({r['2_thread_cpu_s']:.3f} CPU)")
    s = res.get("kunquant_synthetic")
    if s and "evaluate" in s:
        out.append(f"synthetic {s['symbols']} x {s['days']}, {100 * s['nan_rate']:.1f}% NaN, one thread: evaluate "
                   f"{s['evaluate']['cpu_s']:.1f} CPU s (peak RSS {s['evaluate']['peak_rss_mib']:.0f} MiB); "
                   f"KunQuant f64 {s['kunquant_f64']['cpu_s'][0]:.1f} CPU s "
                   f"({s['kunquant_f64']['peak_rss_mib']:.0f} MiB), f32 {s['kunquant_f32']['cpu_s'][0]:.1f} CPU s")
    elif s:
        out.append(f"synthetic: {s}")
    r = (res.get("scale") or {}).get("one_thread")
    if r:
        c = r["compute_features"]
        out.append(f"scale, one thread ({res['scale']['symbols']} x {res['scale']['days']}, "
                   f"{100 * res['scale']['nan_rate']:.1f}% NaN; process CPU s, wall s):")
        out.append(f"  kline-store compute_features (+ LABEL0, store written): {c['cpu_s']:.1f} CPU s, "
                   f"{c['wall_s']:.1f} wall s, peak RSS {c['peak_rss_mib']:.0f} MiB")
        for key, name in (("kunquant_f64", "KunQuant 0.1.12 f64"), ("kunquant_f32", "KunQuant 0.1.12 f32")):
            k = r.get(key)
            if k:
                out.append(f"  {name} ({k['block']} symbols a call): {k['cpu_s']:.1f} CPU s, {k['wall_s']:.1f} "
                           f"wall s, peak RSS {k['peak_rss_mib']:.0f} MiB; compile {k['compile_s']:.1f} s apart")
        if "ratio_compute_to_kunquant_f64" in r:
            out.append(f"  compute_features / KunQuant f64 CPU: {r['ratio_compute_to_kunquant_f64']:.2f}")
        elif "kunquant" in r:
            out.append(f"  KunQuant: {r['kunquant']}")
    return out
