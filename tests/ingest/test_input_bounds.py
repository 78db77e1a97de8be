"""Memory and disk bounds of the read (issue 26 part 5, inputs): a compressed input is decompressed a block at a
time up to a share of the memory available and refused past it in one line naming the file and both sizes (a gzip
bomb under a 1 GiB cgroup: refused, not OOM-killed); a full disk while the bars spill is named as a full disk with
the store and the bytes, nothing stored."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest

from conftest import write
from kline_store import ingest, memory, open_store
from kline_store.errors import KlineStoreError
from kline_store.ingest import bars, packed

ROOT = Path(__file__).resolve().parents[2]
LINE = b"2024-01-02,1.0,1.0,1.0,1.0,100\n"


def gzip_bomb(path: Path, block_mib: int, copies: int) -> Path:
    """A gzip file of ``copies`` members, each ``block_mib`` MiB of one repeated CSV line (compressed once)."""
    raw = LINE * ((block_mib << 20) // len(LINE))
    member = gzip.compress(raw, compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(b"date,open,high,low,close,volume\n"))
        for _ in range(copies):
            fh.write(member)
    return path


def tree(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def test_a_gzip_bomb_is_refused_once_past_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(packed, "budget", lambda: (8 << 20, "64 MiB available (test)"))
    bomb = gzip_bomb(tmp_path / "bomb.csv.gz", 4, 8)          # 32 MiB in about 100 KB
    with pytest.raises(KlineStoreError, match=r"bomb.csv.gz: decompresses to more than 9 MiB from \d+ KiB "
                                               r"compressed; .* would take more than 8 MiB"):
        ingest([bomb], tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_a_zip_stating_a_size_over_the_budget_is_refused_up_front(tmp_path, monkeypatch):
    z = tmp_path / "big.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("big.csv", b"date,open,high,low,close,volume\n" + LINE * 400_000)
    monkeypatch.setattr(packed, "budget", lambda: (4 << 20, "16 MiB available (test)"))
    with pytest.raises(KlineStoreError, match=r"big.zip: decompresses to 12 MiB from \d+ KiB compressed"):
        ingest([z], tmp_path / "s")
    monkeypatch.undo()
    with pytest.raises(KlineStoreError, match="duplicate bar"):   # under the budget it is read (and checked)
        ingest([z], tmp_path / "s")


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy, polars, pyarrow
    from kline_store import memory
    from kline_store.cli.main import main
    memory.join_cgroup(Path(sys.argv[1]))
    sys.argv = ["kline-store", "ingest", sys.argv[2], "-o", sys.argv[3]]
    main()
""")


def test_a_3_gib_gzip_bomb_under_a_1_gib_cgroup_is_refused_not_killed(tmp_path):
    cg = memory.make_cgroup(1 << 30, f"kline-test-bomb-{os.getpid()}")
    if cg is None:
        pytest.skip("no writable memory cgroup (needs root and a memory controller)")
    try:
        bomb = gzip_bomb(tmp_path / "bomb.csv.gz", 64, 48)      # 3 GiB of text
        assert bomb.stat().st_size < 8 << 20
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-c", CHILD, str(cg[0]), str(bomb), str(tmp_path / "s")],
                              capture_output=True, text=True, env=env, timeout=300)
    finally:
        memory.remove_cgroup(cg[0])
    err = done.stderr.strip()
    assert done.returncode == 1, f"rc={done.returncode} (-9: OOM-killed) {err[-500:]}"
    assert "\n" not in err and "bomb.csv.gz: decompresses to more than" in err and "cgroup" in err, err
    assert not (tmp_path / "s").exists()


@pytest.fixture()
def small_disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs (needs root)")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_full_disk_while_the_bars_spill_is_named(tmp_path, small_disk, monkeypatch):
    monkeypatch.setattr(bars, "spills", lambda *a: True)        # spill whatever the size
    rows = "".join(f"S{s:03d},2024-01-{d:02d},1,2,0.5,1.5,{s * 100 + d}\n" for s in range(400) for d in range(2, 30))
    src = write(tmp_path / "in.csv", "symbol,date,open,high,low,close,volume\n" + rows)   # 11,200 bars, ~450 KB
    small = write(tmp_path / "small.csv", "symbol,date,close\nA,2024-01-02,1\n")
    ingest([small], small_disk / "s")
    before = tree(small_disk / "s")
    with open(small_disk / "filler", "wb") as fh:       # leave less room than the spill of in.csv needs
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        fh.write(b"\0" * max(0, free - (96 << 10)))
    with pytest.raises(KlineStoreError, match=r"/s: no space left on device: spilling the bars read to .*bytes "
                                               r"spilled.*nothing was changed"):
        ingest([src], small_disk / "s", replace=True)
    assert tree(small_disk / "s") == before and open_store(small_disk / "s").n_symbols == 1


def test_a_json_file_over_the_budget_is_refused(tmp_path, monkeypatch):
    p = write(tmp_path / "a.json", '[{"date": "2024-01-02", "close": 1.0}]' + " " * 4096)
    monkeypatch.setattr(packed, "budget", lambda: (1024, "4 KiB available (test)"))
    with pytest.raises(KlineStoreError, match=r"a.json: JSON of 4 KiB; JSON records are read in memory"):
        ingest([p], tmp_path / "s")
