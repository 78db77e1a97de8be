"""Running qlib_side.py in Qlib's virtualenv from the tests, and comparing its answers with the engine's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).parent
DEFAULT_QLIB_PYTHON = Path(__file__).parents[2] / ".venv-qlib" / "bin" / "python"


def qlib_python() -> Path:
    """Qlib's interpreter (KLINE_QLIB_PYTHON, else .venv-qlib in the repository), or skip."""
    env = os.environ.get("KLINE_QLIB_PYTHON")
    candidates = [Path(env)] if env else [DEFAULT_QLIB_PYTHON]
    for path in candidates:
        if path.exists():
            return path
    pytest.skip(f"Qlib's python not found ({', '.join(map(str, candidates))}); set KLINE_QLIB_PYTHON")


def qlib_features(tmp: Path, panel: dict, exprs: list[str], timeout: float = 600) -> dict:
    """D.features for every expression on the panel, through Qlib itself in its own interpreter."""
    np.savez(tmp / "panel.npz", **panel)
    (tmp / "exprs.json").write_text(json.dumps(exprs))
    cmd = [str(qlib_python()), str(HERE / "qlib_side.py"), str(tmp / "panel.npz"), str(tmp / "qlib"),
           str(tmp / "exprs.json"), str(tmp / "out.npz")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(tmp / "out.npz"))


def agreement(ours: np.ndarray, theirs: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> np.ndarray:
    """Per cell: True where both are NaN, both are the same infinity or non-finite where Qlib has inf
    (see regression.py), or both finite and close."""
    both_nan = np.isnan(ours) & np.isnan(theirs)
    inf = np.isinf(theirs) & ~np.isfinite(ours)
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: decided by `inf` above
        close = np.isfinite(ours) & np.isfinite(theirs) & (np.abs(ours - theirs) <= atol + rtol * np.abs(theirs))
    return both_nan | inf | close


def real_data() -> Path:
    """The shared real-data folder (KLINE_REAL_DATA, else ../shared/data/real beside the repository), or skip."""
    env = os.environ.get("KLINE_REAL_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data" / "real"
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}")
    return path


def frames_panel(frames: dict, fields: tuple[str, ...] = ("open", "close", "high", "low", "volume")) -> dict:
    """Qlib instrument name -> DataFrame (date 'YYYY-MM-DD' + fields) as a panel: the union of the dates, each
    symbol's span from its first to its last row, NaN on the days inside the span it lacks (as Qlib pads)."""
    if not frames:
        pytest.skip("no input files")
    dates = np.array(sorted(set().union(*(set(df["date"]) for df in frames.values()))))
    index = {d: i for i, d in enumerate(dates)}
    values = np.full((len(fields), len(frames), len(dates)), np.nan, dtype=np.float32)
    first, last = [], []
    for s, df in enumerate(frames.values()):
        pos = df["date"].map(index).to_numpy()
        values[:, s, pos] = df[list(fields)].to_numpy(dtype=np.float32).T
        first.append(pos.min())
        last.append(pos.max())
    return {"dates": dates, "symbols": np.array(list(frames)), "fields": np.array(fields), "values": values,
            "first": np.array(first, dtype=np.int64), "last": np.array(last, dtype=np.int64)}


def csv_panel(files: list[Path]) -> dict:
    """ashare_qfq_daily: one file per symbol (000001.csv), date,open,close,high,low,volume."""
    import pandas as pd

    return frames_panel({("SH" if f.stem.startswith("6") else "SZ") + f.stem: pd.read_csv(f, dtype={"date": str})
                         for f in sorted(files)})


def tushare_panel(files: list[Path]) -> dict:
    """tushare pro.daily files (000001.SZ.csv): trade_date YYYYMMDD, newest first, vol in lots."""
    import pandas as pd

    frames = {}
    for f in sorted(files):
        df = pd.read_csv(f, dtype={"trade_date": str}).rename(columns={"vol": "volume"})
        df["date"] = df["trade_date"].str.slice(0, 4) + "-" + df["trade_date"].str.slice(4, 6) + "-" + \
            df["trade_date"].str.slice(6, 8)
        code, market = f.stem.split(".")
        frames[market + code] = df.iloc[::-1].reset_index(drop=True)
    return frames_panel(frames)


def yahoo_panel(files: list[Path]) -> dict:
    """us_yahoo_daily: one file per symbol (AAPL.csv), Date,Open,High,Low,Close,Adj Close,Volume; the raw
    (unadjusted) prices, and volumes that are 0 on some days (Log($volume) is -inf there)."""
    import pandas as pd

    frames = {}
    for f in sorted(files):
        df = pd.read_csv(f, dtype={"Date": str}).rename(columns=str.lower)
        frames[f.stem.upper()] = df.dropna(subset=["close"]).reset_index(drop=True)
    return frames_panel(frames)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread while a test runs: on a small shared machine torch's default (a thread per core)
    oversubscribes and runs these many small tensor operations several times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
