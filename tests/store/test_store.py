"""The read side of a store: views, snapshots, damage detection, gc of old versions, and crafted stores
(case 3 of issue 9): a store only touches itself, and a reader never writes."""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, write
from kline_store import StoreError, open_store, verify_store
from kline_store.store import manifest as mf
from kline_store.store import create_store, gc

DATES = np.arange("2024-01-01", "2024-03-01", dtype="datetime64[D]")


def make(path, n_sym=4, seed=0, **kw):
    rng = np.random.default_rng(seed)
    panel = rng.random((n_sym, len(DATES), 3)).astype(np.float32)
    panel[1, :10] = np.nan
    create_store(path, panel, [f"S{i}" for i in range(n_sym)], DATES, ["open", "close", "volume"], **kw)
    return panel


def test_round_trip_and_read_only_views(tmp_path):
    panel = make(tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert np.array_equal(st.panel, panel, equal_nan=True)
    assert st.array("close").shape == (4, len(DATES)) and not st.array("close").flags.writeable
    with pytest.raises(ValueError):
        st.array("close")[0, 0] = 1.0
    assert st.first_bar.tolist() == [0, 10, 0, 0] and st.last_bar.tolist() == [len(DATES) - 1] * 4
    # a window of one symbol is one contiguous piece of the file
    w = st.panel[2, 5:37]
    assert w.flags.c_contiguous
    assert st.row_stride == st.date_capacity * 3 and st.date_capacity >= len(DATES)


def test_flipped_byte_is_named(tmp_path):
    make(tmp_path / "s")
    st = open_store(tmp_path / "s")
    f, off = st.data_file, st.row_stride * 4 * 2 + 17   # inside row 2's logical region
    st.close()
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x40]))
    problems = verify_store(tmp_path / "s")
    assert problems and f.name in problems[0] and "symbol S2" in problems[0]
    with pytest.raises(StoreError, match=f"{f.name}.*damaged"):
        open_store(tmp_path / "s")
    assert open_store(tmp_path / "s", verify=False).n_symbols == 4   # explicit opt-out still opens


def test_truncated_file_is_named(tmp_path):
    make(tmp_path / "s")
    f = open_store(tmp_path / "s").data_file
    os.truncate(f, os.path.getsize(f) // 2)
    with pytest.raises(StoreError, match=f"{f.name}: data file is truncated"):
        open_store(tmp_path / "s", verify=False)
    assert "truncated" in verify_store(tmp_path / "s")[0]


def test_manifest_mismatch_and_garbage(tmp_path):
    make(tmp_path / "s")
    mpath = tmp_path / "s" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["symbols"] = m["symbols"][:-1]
    mpath.write_text(json.dumps(m))
    with pytest.raises(StoreError, match="manifest.json: manifest key 'manifest_checksum': does not match"):
        open_store(tmp_path / "s")
    del m["manifest_checksum"]            # a store written before the checksum: the schema check still holds
    mpath.write_text(json.dumps(m))
    with pytest.raises(StoreError, match="manifest.json: manifest key 'symbols': 3 entries for 4 expected"):
        open_store(tmp_path / "s")
    mpath.write_text("{not json")
    with pytest.raises(StoreError, match="manifest is unreadable"):
        open_store(tmp_path / "s")
    with pytest.raises(StoreError, match="no such store"):
        open_store(tmp_path / "nowhere")


def test_open_snapshot_survives_replacement_and_gc_spares_it(tmp_path):
    first = make(tmp_path / "s", seed=1)
    old = open_store(tmp_path / "s")
    make(tmp_path / "s", seed=2)          # a whole new generation
    assert np.array_equal(old.panel, first, equal_nan=True)
    assert gc(tmp_path / "s") == []      # pinned by `old`
    assert open_store(tmp_path / "s", version=old.version).version == old.version
    old.close()
    removed = gc(tmp_path / "s")
    assert any(r.startswith("data-g000001") for r in removed)
    with pytest.raises(StoreError, match="version 1 is not available"):
        open_store(tmp_path / "s", version=1)


def test_gc_keeps_current_and_pinned_versions_only(tmp_path):
    from kline_store import append
    from conftest import write
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,1\n")
    from kline_store import ingest
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    readers = {}
    for d in range(3, 8):
        write(tmp_path / f"d{d}.csv", f"symbol,date,close\nA,2024-01-0{d},{d}\n")
        append(tmp_path / "s", [tmp_path / f"d{d}.csv"])
        if d == 4:
            readers[d] = open_store(tmp_path / "s")
    v = readers[4].version          # appends collect as they go: the current version and the pinned one stay
    assert sorted(p.name for p in (tmp_path / "s" / "versions").iterdir()) == [f"v{v:06d}.json", "v000006.json"]
    gc(tmp_path / "s")
    assert sorted(p.name for p in (tmp_path / "s" / "versions").iterdir()) == [f"v{v:06d}.json", "v000006.json"]
    assert open_store(tmp_path / "s", version=v).n_dates == readers[4].n_dates   # a worker reopens it
    readers[4].close()
    gc(tmp_path / "s")
    assert [p.name for p in (tmp_path / "s" / "versions").iterdir()] == ["v000006.json"]
    with pytest.raises(StoreError, match="no such store"):
        gc(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_open_survives_a_rewrite_and_gc_between_manifest_and_data(tmp_path, monkeypatch):
    """The current version's file may be replaced and collected right after its manifest was read."""
    from kline_store.store import manifest as mf
    make(tmp_path / "s", seed=1)
    real_read = mf.read_manifest
    calls = []

    def read_then_replace(path, version=None):
        m = real_read(path, version)
        if not calls:                      # the first read: a writer commits a new generation and gc runs
            calls.append(1)
            make(tmp_path / "s", seed=2)
        return m

    monkeypatch.setattr(mf, "read_manifest", read_then_replace)
    st = open_store(tmp_path / "s")
    assert st.version == 2 and st.panel.shape == (4, len(DATES), 3)


def _tree_digest(root) -> dict:
    """Every entry under ``root`` (links as links) and the bytes of its regular files."""
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = "-> " + os.readlink(p)
        elif p.is_file():
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


@pytest.fixture
def crafted(real, tmp_path):
    """A real store at tmp/s, a victim file beside it, and a new day to append."""
    from kline_store import ingest
    src = real / "tushare_daily" / "000001.SZ.csv"
    lines = src.read_text().splitlines()
    write(tmp_path / "old" / "000001.SZ.csv", "\n".join(lines[:1] + lines[2:]) + "\n")   # newest day left out
    write(tmp_path / "new" / "000001.SZ.csv", "\n".join(lines[:2]) + "\n")
    ingest([tmp_path / "old"], tmp_path / "s")
    victim = tmp_path / "victim.bin"
    shutil.copy(tmp_path / "s" / "data-g000001.f32", victim)   # same bytes: checksums would pass through it
    return tmp_path / "s", victim, tmp_path / "new"


def _refused_everywhere(store, new, needle, commands=("verify", "info", "append", "gc")):
    for args in [(c, store, new) if c == "append" else (c, store) for c in commands]:
        r = run_cli(*map(str, args))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and needle in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("name", ["../victim.bin", "ABSOLUTE"])
def test_a_manifest_naming_a_file_outside_the_store_is_refused(crafted, name):
    """Case 3: `"data": {"file": "../victim.bin"}` passed verify and append overwrote the victim's bytes."""
    store, victim, new = crafted
    before = _tree_digest(store.parent)
    m = json.loads((store / "manifest.json").read_text())
    m["data"]["file"] = str(victim) if name == "ABSOLUTE" else name
    for sealed in (False, True):              # an older store without checksum, or one crafted to pass it
        (store / "manifest.json").write_text(json.dumps(mf.seal(m) if sealed else
                                                        {k: v for k, v in m.items() if k != "manifest_checksum"}))
        _refused_everywhere(store, new, "manifest key 'data.file'")
    after = _tree_digest(store.parent)
    assert after["victim.bin"] == before["victim.bin"]
    assert {k: v for k, v in after.items() if k != "s/manifest.json"} == \
        {k: v for k, v in before.items() if k != "s/manifest.json"}


def test_a_data_file_that_is_a_link_is_not_read_or_written_through(crafted):
    store, victim, new = crafted
    (store / "data-g000001.f32").unlink()
    os.symlink(victim, store / "data-g000001.f32")
    before = _tree_digest(store.parent)
    _refused_everywhere(store, new, "data-g000001.f32: is a symbolic link", ("verify", "info", "append"))
    assert run_cli("gc", str(store)).returncode == 0         # gc does not open the current file
    assert _tree_digest(store.parent) == before


def test_a_staging_link_is_refused_by_writers(crafted, tmp_path):
    store, victim, new = crafted
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", store / ".staging")
    rev = write(tmp_path / "rev" / "000001.SZ.csv", "ts_code,trade_date,close\n000001.SZ,20200102,1\n")
    r = run_cli("append", str(store), str(rev.parent))
    assert r.returncode == 1 and ".staging: is a symbolic link" in r.stderr
    assert list((tmp_path / "outside").iterdir()) == []
    assert any(".staging" in p for p in verify_store(store))


def test_a_reader_never_writes_not_even_behind_a_versions_link(crafted, tmp_path):
    """Case 3: a `versions` symlink made even `kline-store info` write there (it restored a version copy)."""
    store, victim, new = crafted
    shutil.move(store / "versions", tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "v000001.json").unlink()          # the copy is missing: readers used to restore it
    os.symlink(tmp_path / "elsewhere", store / "versions")
    before = _tree_digest(tmp_path)
    r = run_cli("info", str(store))
    assert r.returncode == 0 and "version 1" in r.stdout
    with open_store(store) as st:
        assert st.version == 1 and st.n_symbols == 1
    assert _tree_digest(tmp_path) == before
    r = run_cli("append", str(store), str(new))
    assert r.returncode == 1 and "versions: is a symbolic link" in r.stderr
    assert _tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["yahoo", "events"])
def test_a_store_written_before_checksums_opens_and_is_sealed_by_the_next_write(real, tmp_path, kind):
    """Stores of the previous format (tests/data/stores_v0): they open, verify says they lack the checksum,
    an append adds it and continues their factors exactly as a full ingest of all the rows would."""
    from kline_store import append, ingest
    store = tmp_path / "s"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "stores_v0" / kind, store)
    assert mf.CHECKSUM_KEY not in json.loads((store / "manifest.json").read_text())
    with open_store(store, verify=True) as st:
        assert st.version == 1 and st.n_dates == (12 if kind == "yahoo" else 10)
    r = run_cli("verify", str(store))
    assert r.returncode == 0 and "has no checksum" in r.stdout
    if kind == "yahoo":
        files = {s: (real / "us_yahoo_daily" / f"{s}.csv").read_text().splitlines() for s in ("AAPL", "PTR")}
        new = {s: lines[:1] + lines[13:16] for s, lines in files.items()}
        full = {s: lines[:16] for s, lines in files.items()}
    else:
        lines = (real / "zipline_csvdir" / "csvdir_samples_csvdir_daily_AAPL.csv").read_text().splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith("2014-06-02"))
        new, full = {"AAPL": lines[:1] + lines[at + 10: at + 13]}, {"AAPL": lines[:1] + lines[at: at + 13]}
    for name, parts in (("new", new), ("full", full)):
        for s, rows in parts.items():
            write(tmp_path / name / f"{s}.csv", "\n".join(rows) + "\n")
    append(store, [tmp_path / "new"])
    m = json.loads((store / "manifest.json").read_text())
    assert m[mf.CHECKSUM_KEY] == mf.content_checksum(m) and "has no checksum" not in run_cli("verify", str(store)).stdout
    ingest([tmp_path / "full"], tmp_path / "ref", capacity=16)
    a, b = open_store(store, verify=True), open_store(tmp_path / "ref")
    assert a.symbols == b.symbols and list(a.dates) == list(b.dates) and a.fields == b.fields
    np.testing.assert_allclose(a.panel, b.panel, rtol=2e-7, equal_nan=True)


def _resident_pages(path) -> int:
    """Pages of ``path`` in the page cache (mincore over a fresh mapping)."""
    import ctypes
    import mmap as _mmap
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        mm = _mmap.mmap(fh.fileno(), size, prot=_mmap.PROT_READ)
        try:
            n = -(-size // _mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * n)()
            view = np.frombuffer(mm, dtype=np.uint8)
            assert libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) == 0
            del view
            return int(np.frombuffer(vec, dtype=np.uint8).astype(bool).sum())
        finally:
            mm.close()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="Linux only")
def test_a_wide_store_opens_reading_only_its_rows_used_bytes(tmp_path):
    """Issue 19: 1M symbols x 2 dates (40 MB of values) took 88 s and 22 GB of page cache to open: read-ahead
    pulled in the reserved room after every row."""
    n = 20_000
    panel = np.random.default_rng(0).random((n, 2, 5), dtype=np.float32)
    create_store(tmp_path / "w", panel, [f"S{i:06d}" for i in range(n)],
                 np.array(["2024-01-02", "2024-01-03"], dtype="datetime64[D]"), ["open", "high", "low", "close", "volume"])
    data = next((tmp_path / "w").glob("data-*.f32"))
    fd = os.open(data, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)        # cold: nothing of it cached
    os.close(fd)
    t0 = time.perf_counter()
    st = open_store(tmp_path / "w", verify=True)
    took = time.perf_counter() - t0
    assert np.array_equal(st.panel, panel)
    resident = _resident_pages(data)
    assert resident <= 3 * n, f"{resident} pages cached for {n} rows of 40 bytes"   # a page (or two) per row
    assert took < 30


def test_the_data_file_is_advised_and_sized_through_the_store(tmp_path):
    """What other wings read the store's pinned descriptor for, as methods: its size, and page-cache advice."""
    from kline_store.errors import InputError

    make(tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert st.data_file_size() == os.path.getsize(st.data_file) >= st.manifest["data"]["size"]
    st.advise_file([(0, 4096)], "willneed")
    st.advise_file([(0, st.data_file_size())], "dontneed")
    with pytest.raises(InputError, match="advice='random'"):
        st.advise_file([(0, 4096)], "random")
    stat = os.stat(st.data_file)
    assert st.data_file_identity() == (stat.st_dev, stat.st_ino)
    st.close()
    assert st.data_file_size() == 0 and st.data_file_identity() is None
    st.advise_file([(0, 4096)], "dontneed")   # a closed store: nothing to advise, no error
