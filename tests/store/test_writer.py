"""The write side: space reserved before writing (full disk, file-size limit), sparse reserved room, staging
removed on every failure path, commit order, gc of planted links, a read-only store."""

import json
import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import write
from kline_store import StoreError, ingest, open_store, verify_store
from kline_store.store.writer import NewGeneration, gc
from kline_store.store import create_store
from sandbox import run_in_tmpfs

DATES = np.arange("2024-01-01", "2024-03-01", dtype="datetime64[D]")


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def test_reserved_room_stays_sparse_above_256_mib(tmp_path):
    """Case 7: a 257 MiB panel (over the old in-memory limit) took its whole 517 MiB file on disk."""
    probe = tmp_path / "probe"
    with open(probe, "wb") as fh:
        fh.truncate(64 << 20)
    if allocated(probe) > 1 << 20:
        pytest.skip("this file system does not keep sparse files")
    n_sym, n_dates, nf = 4500, 2500, 6
    panel = np.ones((n_sym, n_dates, nf), dtype=np.float32)
    dates = np.datetime64("2000-01-03") + np.arange(n_dates)
    create_store(tmp_path / "s", panel, [f"S{i}" for i in range(n_sym)], dates, list("abcdef"))
    del panel
    st = open_store(tmp_path / "s", verify=False)
    logical = st.logical_bytes
    assert logical > 256 << 20 and os.path.getsize(st.data_file) > 2 * logical - (32 << 20)
    block = os.statvfs(tmp_path).f_bsize
    assert allocated(st.data_file) <= logical + n_sym * 2 * block      # at most a partial block per row end
    st.close()


def test_ingested_store_is_sparse_and_pwritten(real, tmp_path):
    ingest([real / "tushare_daily"], tmp_path / "s")
    st = open_store(tmp_path / "s")
    block = os.statvfs(tmp_path).f_bsize
    assert allocated(st.data_file) <= st.logical_bytes + st.n_symbols * 2 * block < os.path.getsize(st.data_file)


def _cli_limited(limit: int, *args):
    """The CLI under a file-size limit (RLIMIT_FSIZE), as `ulimit -f` sets it; any user can do this. (Python
    ignores SIGXFSZ, so a write past the limit fails with EFBIG.)"""
    def limit_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([sys.executable, "-m", "kline_store.cli", *map(str, args)], capture_output=True,
                          text=True, preexec_fn=limit_size)


def test_file_size_limit_is_one_line_not_a_signal(real, tmp_path):
    """Past `ulimit -f` writers printed `unexpected OSError: [Errno 27] File too large` naming nothing and left
    the folder of a first ingest; now it is one line naming the store, and nothing is left."""
    qfq = real / "ashare_qfq_daily" / "data_20251009"
    r = _cli_limited(64 << 10, "ingest", qfq / "000001.csv", "-o", tmp_path / "s")
    assert r.returncode == 1, (r.returncode, r.stderr)
    line = one_line(r.stderr)
    assert str(tmp_path / "s") in line and "file too large" in line and "ulimit -f" in line
    assert not (tmp_path / "s").exists()                       # a failed first ingest leaves nothing
    ingest([qfq / "000001.csv"], tmp_path / "s")
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    r = _cli_limited(64 << 10, "append", tmp_path / "s", qfq / "000627.csv", qfq / "000670.csv")
    assert r.returncode == 1 and "file too large" in one_line(r.stderr)
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before and verify_store(tmp_path / "s") == []
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".lock", "data-g000001.f32", "manifest.json",
                                                                  "versions"]


FULL_DISK = '''
qfq = Path("{qfq}")
s = MNT / "s"
out = {{}}
out["ingest"] = cli("ingest", qfq / "000001.csv", qfq / "000627.csv", "-o", s, "-q")
before = (s / "manifest.json").read_bytes()
size = (s / "data-g000001.f32").stat().st_size
out["free"] = fill(96 << 10)
# in place: new symbols become new rows of the current file (their bytes must be reserved first)
out["tail"] = cli("append", s, *[qfq / f"{{n}}.csv" for n in ("000670", "000792", "600777", "600519")])
# copy-on-write: a revision writes a new generation
out["rewrite"] = cli("append", s, "{rev}")
out["replace"] = cli("ingest", qfq, "-o", s, "--replace", "-q")
out["fresh"] = cli("ingest", qfq, "-o", MNT / "t", "-q")
out["verify"] = cli("verify", s)
out["same_manifest"] = (s / "manifest.json").read_bytes() == before
out["same_size"] = (s / "data-g000001.f32").stat().st_size == size
out["tree"] = tree(MNT)
print(json.dumps(out))
'''


def test_full_disk_is_one_line_naming_store_and_bytes(real, tmp_path):
    """Case 4: an in-place append on a full file system died of SIGBUS; other writers printed an unnamed OSError
    and left a partial file in staging."""
    qfq = real / "ashare_qfq_daily" / "data_20251009"
    rev = write(tmp_path / "rev" / "000001.csv", "date,open,close,high,low,volume\n2020-01-02,1,1,1,1,1\n")
    out = run_in_tmpfs(tmp_path, FULL_DISK.format(qfq=qfq, rev=rev), size="2m")
    assert out["ingest"]["rc"] == 0, out["ingest"]
    assert out["free"] < 200 << 10
    for step in ("tail", "rewrite", "replace", "fresh"):
        r = out[step]
        assert r["rc"] == 1, (step, r)
        line = one_line(r["err"])
        assert "no space left on device" in line and "needs" in line and "bytes" in line, (step, line)
        assert ("/t:" if step == "fresh" else "/s:") in line, line
    assert out["verify"]["rc"] == 0 and out["same_manifest"] and out["same_size"]
    # no staging, no partial file, no folder from the failed first ingest
    assert out["tree"] == ["filler", "s", "s/.lock", "s/data-g000001.f32", "s/manifest.json", "s/versions",
                           "s/versions/v000001.json"]


READ_ONLY = '''
src = Path("{src}")
s = MNT / "s"
out = {{"ingest": cli("ingest", src, "-o", s, "-q")}}
(s / "versions" / "v000001.json").unlink()        # a copy lost in a crash: a reader must not restore it
read_only()
out["info"] = cli("info", s)
out["verify"] = cli("verify", s)
out["export"] = cli("export", s, "-o", "{export}")
out["append"] = cli("append", s, src)
out["dry"] = cli("append", s, src, "--dry-run")
out["gc"] = cli("gc", s)
out["replace"] = cli("ingest", src, "-o", s, "--replace")
out["tree"] = tree(s)
print(json.dumps(out))
'''


def test_read_only_store_reads_and_refuses_writes_in_one_line(real, tmp_path):
    """Case 8: a read-only store gave `unexpected PermissionError`; reading must still work and write nothing."""
    src = real / "tushare_daily" / "000001.SZ.csv"
    out = run_in_tmpfs(tmp_path, READ_ONLY.format(src=src, export=tmp_path / "x.parquet"), size="8m")
    for step in ("ingest", "info", "verify", "export", "dry"):
        assert out[step]["rc"] == 0, (step, out[step])
    for step in ("append", "gc", "replace"):
        assert out[step]["rc"] == 1 and "read-only file system" in one_line(out[step]["err"]), (step, out[step])
    assert out["tree"] == [".lock", "data-g000001.f32", "manifest.json", "versions"]


def test_staging_is_removed_when_a_write_fails(real, tmp_path, monkeypatch):
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    from kline_store.store import safefs
    real_write = safefs.write_all

    def failing(fd, data, offset):         # a disk that fails after the first rows (EIO)
        real_write(fd, data, offset)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(safefs, "write_all", failing)
    with pytest.raises(StoreError, match=r"s: cannot write data-g000002.f32: Input/output error"):
        ingest([real / "tushare_daily"], tmp_path / "s", replace=True)
    from kline_store import append
    write(tmp_path / "rev.csv", "ts_code,trade_date,close\n000001.SZ,20200102,1\n")
    with pytest.raises(StoreError, match="Input/output error"):
        append(tmp_path / "s", [tmp_path / "rev.csv"])
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".lock", "data-g000001.f32", "manifest.json",
                                                                  "versions"]
    assert verify_store(tmp_path / "s") == []


def test_a_killed_commit_before_the_swap_leaves_a_copy_no_reader_takes(real, tmp_path):
    """The version copy is written before manifest.json is swapped; a crash in between must not make the copy
    a snapshot, and the next writer removes it."""
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    r = subprocess.run([sys.executable, "-m", "kline_store.cli", "ingest", "-q", "--replace",
                        str(real / "tushare_daily"), "-o", str(tmp_path / "s")],
                       env=dict(os.environ, KLINE_STORE_CRASH_AT="commit:copied"), capture_output=True)
    assert r.returncode == -signal.SIGKILL
    assert (tmp_path / "s" / "versions" / "v000002.json").exists()
    assert open_store(tmp_path / "s").version == 1 and verify_store(tmp_path / "s") == []
    with pytest.raises(StoreError, match="version 2 is not available"):
        open_store(tmp_path / "s", version=2)
    gc(tmp_path / "s")
    assert sorted(p.name for p in (tmp_path / "s" / "versions").iterdir()) == ["v000001.json"]


def test_writers_restore_a_missing_or_damaged_version_copy(tmp_path):
    create_store(tmp_path / "s", np.ones((2, len(DATES), 1), np.float32), ["A", "B"], DATES, ["close"])
    copy = tmp_path / "s" / "versions" / "v000001.json"
    copy.write_text("{torn")
    with open_store(tmp_path / "s") as st:     # a reader reads manifest.json; it writes nothing
        assert st.version == 1
    assert copy.read_text() == "{torn"
    gc(tmp_path / "s")
    assert json.loads(copy.read_text())["version"] == 1


def test_gc_removes_planted_links_not_their_targets(tmp_path):
    create_store(tmp_path / "s", np.ones((2, len(DATES), 1), np.float32), ["A", "B"], DATES, ["close"])
    victim = write(tmp_path / "victim.bin", "precious")
    os.symlink(victim, tmp_path / "s" / "data-g000007.f32")
    os.symlink(victim, tmp_path / "s" / "versions" / "v000000.json")
    removed = gc(tmp_path / "s")
    assert sorted(removed) == ["data-g000007.f32", "versions/v000000.json"]
    assert victim.read_text() == "precious"


def test_new_generation_reserves_only_the_logical_rows(tmp_path):
    (tmp_path / "s").mkdir()
    gen = NewGeneration(tmp_path / "s", 1, rows=3, n_dates=1000, n_fields=4, capacity=5000)
    block = np.arange(3 * 1000 * 4, dtype=np.float32).reshape(3, 1000, 4)
    gen.write(0, block)
    data = gen.finish()
    raw = np.fromfile(tmp_path / "s" / data["file"], dtype=np.float32).reshape(3, 5000, 4)
    assert np.array_equal(raw[:, :1000], block) and not raw[:, 1000:].any()
    assert data["size"] == 3 * 5000 * 16 and len(data["row_crc32"]) == 3
    assert not (tmp_path / "s" / ".staging" / data["file"]).exists()


def test_a_failed_first_write_leaves_no_folder_with_a_lock(tmp_path, monkeypatch):
    """Issue 19: a failed first resample (create_store) left its folder with a `.lock` in it."""
    from kline_store.errors import StoreError
    from kline_store.store import writer

    def full(*a, **k):
        raise StoreError("no space left on device")
    monkeypatch.setattr(writer, "write_panel", full)
    panel = np.ones((2, 3, 1), dtype=np.float32)
    dates = np.arange("2024-01-01", "2024-01-04", dtype="datetime64[D]")
    with pytest.raises(StoreError, match="no space"):
        writer.create_store(tmp_path / "a" / "b", panel, ["X", "Y"], dates, ["close"])
    assert not (tmp_path / "a").exists()
    (tmp_path / "own").mkdir()
    with pytest.raises(StoreError, match="no space"):
        writer.create_store(tmp_path / "own", panel, ["X", "Y"], dates, ["close"])
    assert (tmp_path / "own").is_dir() and list((tmp_path / "own").iterdir()) == []   # the user's folder stays
