"""Ingest of a file bigger than a memory limit: read in slices and written block by block.

The ingest runs in a child process moved into a memory cgroup (a child of this process's cgroup, v1
``memory.limit_in_bytes`` or v2 ``memory.max``; RLIMIT_AS is no measure for polars, whose allocator reserves
address space it never touches) after its imports, so the limit bounds what the ingest itself takes. Where no
such cgroup can be made (no root, no memory controller) the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import kline_store as ks
from kline_store import memory

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 256 << 20   # what the child may take beyond its imports: less than each input's size on disk

CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import numpy, polars, pyarrow.parquet
    import kline_store as ks
    from kline_store import memory
    from kline_store.ingest import ingestion
    memory.join_cgroup(Path(sys.argv[1]))      # from here on, what the process allocates is charged
    report = ks.ingest([sys.argv[2]], sys.argv[3], quiet=True)
    print(json.dumps({"bars": report.n_bars, "available": str(memory.available())}))
""")


def _bars(n_sym: int, n_days: int, rounded: bool) -> pl.DataFrame:
    """Long daily bars, grouped by symbol: ``n_sym x n_days`` rows of random prices."""
    rng = np.random.default_rng(7)
    days = np.arange(np.datetime64("2000-01-03"), np.datetime64("2000-01-03") + n_days)
    ymd = np.char.replace(np.datetime_as_string(days), "-", "").astype(np.int64)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_days)), axis=1)).ravel()
    noise = rng.random((4, close.size))
    cols = {"open": close * (1 + (noise[0] - 0.5) / 100), "high": close * (1 + noise[1] / 100),
            "low": close * (1 - noise[2] / 100), "close": close, "vol": noise[3] * 1e6, "amount": noise[3] * close * 1e6}
    if rounded:
        cols = {k: np.round(v, 2) for k, v in cols.items()}
    return pl.DataFrame({"ts_code": np.repeat([f"{s:06d}.SZ" for s in range(n_sym)], n_days),
                         "trade_date": np.tile(ymd, n_sym), **cols})


def _make(tmp_path: Path, kind: str) -> Path:
    if kind == "csv":
        path = tmp_path / "big.csv"
        _bars(2000, 2200, rounded=True).write_csv(path)
    else:   # random doubles barely compress: a Parquet file as big as its values
        path = tmp_path / "big.parquet"
        _bars(2000, 3000, rounded=False).write_parquet(path)
    return path


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_file_bigger_than_the_memory_limit_ingests_as_without_it(tmp_path, kind):
    cg = memory.make_cgroup(LIMIT, f"kline-test-ingest-{os.getpid()}")
    if cg is None:
        pytest.skip("no writable memory cgroup (needs root and cgroup v1 memory or v2 with the memory controller)")
    try:
        path = _make(tmp_path, kind)
        assert path.stat().st_size > LIMIT
        os.sync()   # the input on disk: the child's own writes are not queued behind it
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-c", CHILD, str(cg[0]), str(path), str(tmp_path / "limited")],
                              capture_output=True, text=True, env=env, timeout=900)
    finally:
        memory.remove_cgroup(cg[0])
    assert done.returncode == 0, f"rc={done.returncode} (-9: killed by the OOM killer) {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "cgroup" in out["available"]
    free = ks.ingest([path], tmp_path / "free", quiet=True)
    assert out["bars"] == free.n_bars >= 4_000_000
    a, b = ks.open_store(tmp_path / "limited"), ks.open_store(tmp_path / "free")
    assert a.symbols == b.symbols and a.fields == b.fields and (a.dates == b.dates).all()
    assert a.manifest["data"]["row_crc32"] == b.manifest["data"]["row_crc32"]
    assert np.array_equal(np.asarray(a.panel).view(np.uint32), np.asarray(b.panel).view(np.uint32))
