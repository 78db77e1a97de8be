"""Shared fixtures: where the real data lives, and small helpers to write input files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = Path(os.environ.get("KLINE_REAL_DATA", ROOT.parent / "shared" / "data" / "real"))


@pytest.fixture(scope="session")
def real() -> Path:
    if not REAL.is_dir():
        pytest.skip(f"real data not found at {REAL}")
    return REAL


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `kline-store ARGS` as a user would: a separate process, text output captured."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "kline_store.cli", *args], capture_output=True, text=True,
                          env=e, timeout=timeout)


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


def resumed(make_loader, steps: int) -> tuple[list, list, list]:
    """``(whole epoch, first steps batches, the rest from a new loader resumed from the state after them)``."""
    whole = list(make_loader())
    ld = make_loader()
    it = iter(ld)
    head = [next(it) for _ in range(steps)]
    again = make_loader()
    again.load_state_dict(ld.state_dict())
    return whole, head, list(again)
