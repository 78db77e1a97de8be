"""Running qlib_side.py in Qlib's virtualenv from the tests, and comparing its answers with the engine's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
DEFAULT_QLIB_PYTHON = Path(__file__).parents[2] / ".venv-qlib" / "bin" / "python"


def qlib_python() -> Path:
    """Qlib's interpreter (KLINE_QLIB_PYTHON, else .venv-qlib beside the repository or in /work/main), or skip."""
    env = os.environ.get("KLINE_QLIB_PYTHON")
    candidates = [Path(env)] if env else [DEFAULT_QLIB_PYTHON, Path("/work/main/.venv-qlib/bin/python")]
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
    close = np.isfinite(ours) & np.isfinite(theirs) & (np.abs(ours - theirs) <= atol + rtol * np.abs(theirs))
    return both_nan | inf | close
