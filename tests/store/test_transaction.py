"""The one write transaction (store/transaction.py): a new version, a tail append, their failure paths and crash
points, on real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from kline_store import verify_store
from kline_store.store import NewVersion, TailAppend, create_store, open_store
from kline_store.store.lock import WriterLock

DATES = np.arange("2024-01-01", "2024-01-11", dtype="datetime64[D]")
FIELDS = ["open", "close"]


def panel(rows: int, days: int, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(rows * days * 2, dtype=np.float32)).reshape(rows, days, 2)


def fields_of(rows: int, days: int) -> dict:
    return dict(symbols=[f"S{i}" for i in range(rows)], dates=DATES[:days], fields=FIELDS,
                first_bar=np.zeros(rows, np.int64), last_bar=np.full(rows, days - 1, np.int64), n_bars=rows * days)


def store_files(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name not in (".lock", ".staging"))


def test_a_new_version_commits_and_a_failure_leaves_the_current_one(tmp_path):
    s = create_store(tmp_path / "s", panel(2, 5), ["S0", "S1"], DATES[:5], FIELDS)
    before, files = (s / "manifest.json").read_bytes(), store_files(s)
    for fail_after_finish in (False, True):
        with WriterLock(s), pytest.raises(RuntimeError, match="boom"):
            with NewVersion(s, 3, 8, 2, crash="test") as txn:
                txn.write_panel(panel(3, 8, 7.0))
                if fail_after_finish:
                    assert txn.finish()["file"] in os.listdir(s)       # moved into the store, not committed
                raise RuntimeError("boom")
        assert (s / "manifest.json").read_bytes() == before and store_files(s) == files
        assert not list((s / ".staging").iterdir())
    with WriterLock(s):
        with NewVersion(s, 3, 8, 2, crash="test") as txn:
            txn.write_panel(panel(3, 8, 7.0))
            m = txn.commit(**fields_of(3, 8), created_at=txn.created_at)
    st = open_store(s)
    assert st.version == m["version"] == 2 and st.manifest["created_at"] == txn.created_at
    np.testing.assert_array_equal(np.asarray(st.panel), panel(3, 8, 7.0))
    assert verify_store(s) == []


def test_a_tail_append_extends_in_place_and_a_failure_cuts_the_file_back(tmp_path):
    s = create_store(tmp_path / "s", panel(2, 5), ["S0", "S1"], DATES[:5], FIELDS, capacity=20)
    m = open_store(s).manifest
    size = os.path.getsize(s / m["data"]["file"])
    with WriterLock(s), pytest.raises(RuntimeError, match="boom"):
        with TailAppend(s, m, 3, 8, 2, crash="test") as txn:
            txn.write(2, panel(1, 8, 100.0), 0)
            raise RuntimeError("boom")
    assert os.path.getsize(s / m["data"]["file"]) == size and open_store(s).version == 1
    whole = np.concatenate([np.concatenate([panel(2, 5), panel(2, 3, 50.0)], axis=1), panel(1, 8, 100.0)])
    with WriterLock(s):
        with TailAppend(s, m, 3, 8, 2, crash="test") as txn:
            txn.write(0, whole[:2, 5:], 5)                                # the old rows' new days
            txn.write(2, whole[2:], 0)                                    # a new row
        new = txn.commit(**fields_of(3, 8))
    st = open_store(s, verify=True)
    assert st.version == new["version"] == 2 and st.manifest["created_at"] == m["created_at"]
    np.testing.assert_array_equal(np.asarray(st.panel), whole)
    assert st.manifest["data"]["row_crc32"][:2] != m["data"]["row_crc32"]   # extended, not restarted
    assert verify_store(s) == []


def test_a_tail_append_refuses_a_data_file_replaced_since_it_was_read(tmp_path):
    """The appender read the store through one data file; if another file now has its name, nothing is written."""
    from kline_store.errors import StoreError

    s = create_store(tmp_path / "s", panel(2, 5), ["S0", "S1"], DATES[:5], FIELDS, capacity=20)
    st = open_store(s)
    m, read_through = st.manifest, st.data_file_identity()
    data = s / m["data"]["file"]
    before = data.read_bytes()
    data.rename(s / "moved")
    data.write_bytes(before)                                             # same bytes, another file
    with WriterLock(s), pytest.raises(StoreError, match="replaced during the append; nothing was written"):
        with TailAppend(s, m, 2, 8, 2, pinned=read_through, crash="test") as txn:
            txn.write(0, panel(2, 3, 50.0), 5)
    assert data.read_bytes() == before
    st.close()


@pytest.mark.parametrize("point", ["create:filled", "create:data-in-place", "commit:copied"])
def test_kill9_in_create_store_leaves_the_old_version(tmp_path, point):
    s = create_store(tmp_path / "s", panel(2, 5), ["S0", "S1"], DATES[:5], FIELDS)
    before = (s / "manifest.json").read_bytes()
    code = ("import numpy as np; from kline_store.store import create_store; "
            f"create_store({str(s)!r}, np.ones((3, 8, 2), np.float32), ['A', 'B', 'C'], "
            "np.arange('2024-01-01', '2024-01-09', dtype='datetime64[D]'), ['open', 'close'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       env=dict(os.environ, KLINE_STORE_CRASH_AT=point))
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (s / "manifest.json").read_bytes() == before and verify_store(s) == []
    np.testing.assert_array_equal(np.asarray(open_store(s).panel), panel(2, 5))
    create_store(s, np.ones((3, 8, 2), np.float32), ["A", "B", "C"], DATES[:8], FIELDS)   # the next writer
    assert open_store(s).n_symbols == 3 and verify_store(s) == []
