"""samples/count_cache.py with blocks.py and day_blocks.py: the block-count cache is untrusted input. Counts poisoned
beyond what the bars allow, or within it where a sampled segment is counted again, damaged or foreign files, a FIFO,
links at the file, its temporary name or its lock: each is one warning and a recount, the dataset exact; counts that
escape the sample are found when their segment is read (one-line StoreError, never a wrong window); users sharing a
cache folder never overwrite each other's files."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import kline_store as ks
from kline_store.errors import StoreError
from kline_store.measure.synthetic import make_store
from kline_store.samples import blocks, count_cache, day_blocks


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KLINE_STORE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("cc") / "s", 40, 6000, seed=3)   # 3 segments a row, gaps


@pytest.fixture(scope="module")
def truth(store):
    ds = ks.KlineDataset(store, window=16, index="full")
    return len(ds), ks.KlineDataset(store, window=16, index="blocks")._index().counts.copy()


def cache_file(ndim: int = 2) -> Path:
    """The cache file of window counts (2-d: rows x segments), or of day counts (``ndim=1``)."""
    (path,) = [p for p in count_cache.cache_dir().glob("*.npz") if np.load(p)["counts"].ndim == ndim]
    return path


def windows(**kw) -> ks.KlineDataset:
    return ks.KlineDataset(kw.pop("store"), window=16, index="blocks", **kw)


def exact(ds: ks.KlineDataset, n: int, counts: np.ndarray) -> None:
    """The dataset has the true windows, every one finite, and the cache now holds the true counts."""
    assert len(ds) == n and np.array_equal(ds._index().counts, counts)
    b = ds.gather_batch(np.arange(len(ds)))
    assert bool(torch.isfinite(b["x"]).all()) and bool(torch.isfinite(b["y"]).all())
    assert np.array_equal(np.load(cache_file())["counts"], counts)


def rewrite(**arrays) -> None:
    path = cache_file()
    z = dict(np.load(path))
    z.update(arrays)
    np.savez(path, **{k: v for k, v in z.items() if v is not None})


def warned(fn, match: str):
    with pytest.warns(RuntimeWarning, match=match) as rec:
        out = fn()
    assert len([w for w in rec if "block counts cached" in str(w.message)]) == 1     # named once
    return out


def test_the_cache_file_is_this_users_and_counted_once(store, truth):
    ds = windows(store=store)
    path = cache_file()
    assert path.name.endswith(f".u{os.geteuid()}.npz") and stat.S_ISREG(os.lstat(path).st_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = windows(store=store)                 # loaded and checked: no warning
    assert again._index().origin == path and len(again) == len(ds) == truth[0]


def test_counts_beyond_what_the_bars_allow_are_counted_again(store, truth):
    """Issue 26: poisoned counts gave 211,750 samples (true 198,402), 13,273 with non-finite x."""
    windows(store=store)
    counts = truth[1].copy()
    counts[counts > 0] += 7
    rewrite(counts=counts)
    ds = warned(lambda: windows(store=store), r"segment \d+: \d+ windows where its bars allow \d+")
    exact(ds, *truth)


def test_counts_within_the_bars_are_caught_by_the_sample(store, truth):
    windows(store=store)
    counts = truth[1].copy()
    counts[counts > 0] -= 1
    rewrite(counts=counts)
    exact(warned(lambda: windows(store=store), r"windows cached, \d+ counted"), *truth)


@pytest.mark.parametrize("damage, match", [
    (dict(counts="float64"), r"'counts' is float64 \(40, 3\), expected int32 \(40, 3\)"),
    (dict(counts="shape"), r"'counts' is int32 \(3, 3\)"),
    (dict(extra=np.zeros(3)), r"arrays \['bounds', 'counts', 'extra'\]"),
    (dict(bounds=None), r"arrays \['counts'\]"),
    (dict(bounds=np.array([15, 5998, 2730, 6001], np.int64)), r"bounds \[15, 5998, 2730, 6001\], expected"),
    (dict(counts="object"), r"not an \.npz of counts"),
    (dict(counts="truncated"), r"not an \.npz of counts"),
    (dict(counts="noise"), r"not an \.npz of counts"),
    (dict(counts="huge"), r"bytes, more than the [\d,]+ its counts take"),
])
def test_damaged_files_are_counted_again(store, truth, damage, match):
    windows(store=store)
    path = cache_file()
    kind = damage.get("counts")
    if kind == "float64":
        rewrite(counts=truth[1].astype(np.float64))
    elif kind == "shape":
        rewrite(counts=np.zeros((3, 3), np.int32))
    elif kind == "object":
        np.savez(path, counts=np.array([{"a": 1}], dtype=object), bounds=np.zeros(4, np.int64))
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif kind == "noise":
        path.write_bytes(np.random.default_rng(0).bytes(300))
    elif kind == "huge":
        path.write_bytes(path.read_bytes() + bytes(10 << 20))
    else:
        rewrite(**damage)
    exact(warned(lambda: windows(store=store), match), *truth)


def test_a_fifo_as_the_cache_file_does_not_hang(store, truth):
    windows(store=store)
    path = cache_file()
    path.unlink()
    os.mkfifo(path)
    got: list = []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        th = threading.Thread(target=lambda: got.append(windows(store=store)), daemon=True)
        th.start()
        th.join(60)
    if th.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))   # let it go before failing
        pytest.fail("dataset creation hangs on a FIFO")
    assert any("not a regular file" in str(w.message) for w in rec)
    assert len(got[0]) == truth[0]


def test_links_at_the_file_its_temporary_name_and_its_lock_are_not_followed(store, truth, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    windows(store=store)
    path = cache_file()
    path.unlink()
    os.symlink(victim, path)                                        # the cache file a link
    os.symlink(victim, count_cache.temp_path(path))                 # a link planted where it is written first
    ds = warned(lambda: windows(store=store), "a symbolic link")
    assert victim.read_text() == "precious" and len(ds) == truth[0]
    assert stat.S_ISREG(os.lstat(path).st_mode)                    # the link replaced by the counts, not followed
    exact(ds, *truth)
    lock = path.with_suffix(".lock")
    lock.unlink()
    os.symlink(victim, lock)
    path.unlink()
    assert len(windows(store=store)) == truth[0]                    # counted, nothing written through the link
    assert victim.read_text() == "precious" and not path.exists()


def test_another_users_file_is_not_read(store, truth):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    windows(store=store)
    os.chown(cache_file(), 12345, -1)
    exact(warned(lambda: windows(store=store), "owned by uid 12345, not this user"), *truth)


def test_counts_that_escape_the_sample_are_found_when_read(store, truth, monkeypatch):
    """A poison within the bars' bounds in a segment the check did not sample: the segment's windows are computed
    when it is read, disagree, and the gather stops in one line (the cache removed) instead of giving a window."""
    windows(store=store)
    counts = truth[1].copy()
    days = blocks.BlockIndex(counts, 15, 5998, 2730, 6000).seg_days(np.arange(counts.shape[1]))
    s, k = np.argwhere((counts > 0) & (counts < days[None, :] - 1))[0]
    counts[s, k] += 1
    rewrite(counts=counts)
    monkeypatch.setattr(blocks, "SAMPLE_SEGMENTS", 0)
    ds = windows(store=store)
    assert len(ds) == truth[0] + 1
    path = cache_file()
    with pytest.raises(StoreError, match=rf"{path}: symbol row {s}, segment {k}: \d+ windows counted before") as e:
        ds.gather_batch(np.arange(len(ds)))
    assert "\n" not in str(e.value) and not path.exists()
    exact(windows(store=store), *truth)


@pytest.mark.parametrize("how, match", [("beyond", r"day segment \d+: \d+ item days where the rows' bars allow"),
                                        ("within", r"day segment \d+: \d+ item days cached, \d+ counted")])
def test_day_counts_are_checked_like_window_counts(store, how, match):
    ref = ks.CrossSectionDataset(store, window=16, index="full")
    ks.CrossSectionDataset(store, window=16, index="blocks")
    path = cache_file(ndim=1)
    z = dict(np.load(path))
    z["counts"] = z["counts"] + 1000 if how == "beyond" else np.maximum(z["counts"] - 1, 0)
    np.savez(path, **z)
    xs = warned(lambda: ks.CrossSectionDataset(store, window=16, index="blocks"), match)
    assert len(xs) == len(ref) and np.array_equal(xs.days, ref.days)
    assert int(np.load(path)["counts"].sum()) == len(ref)


def _as_user(uid: int, fn) -> int:
    """Run ``fn`` in a forked child under ``uid`` (root only); its exit status."""
    pid = os.fork()
    if pid == 0:   # the child: no return from here
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_shared_cache_folder_never_lets_one_user_overwrite_anothers_file(monkeypatch):
    """Two users with one KLINE_STORE_CACHE (a sticky, world-writable folder, as /tmp): each reads and writes only
    its own files (named with its uid), and neither can replace, remove or shadow the other's."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two users")
    top = Path(tempfile.mkdtemp(prefix="kline-shared-"))
    try:
        os.chmod(top, 0o755)
        path = make_store(top / "s", 12, 3000, seed=5)
        for p in [path, *path.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        shared = top / "cache"
        (shared / "blocks").mkdir(parents=True)
        os.chmod(shared, 0o1777)
        os.chmod(shared / "blocks", 0o1777)
        monkeypatch.setenv("KLINE_STORE_CACHE", str(shared))
        n = len(ks.KlineDataset(path, window=8, index="full"))
        a, b = 10001, 10002

        def build():
            assert len(ks.KlineDataset(path, window=8, index="blocks")) == n

        assert _as_user(a, build) == 0
        (mine,) = (shared / "blocks").glob(f"*.u{a}.npz")
        before = _digest(mine)
        theirs = mine.with_name(mine.name.replace(f".u{a}.", f".u{b}."))

        def attack():
            build()                                                   # b's own counts, in b's own file
            for act in (lambda: os.replace(theirs, mine), mine.unlink, lambda: os.symlink(theirs, mine)):
                try:
                    act()
                except (PermissionError, FileExistsError):           # the sticky folder refuses each
                    pass

        assert _as_user(b, attack) == 0
        assert theirs.exists() and os.lstat(theirs).st_uid == b
        assert _digest(mine) == before and os.lstat(mine).st_uid == a
        assert _as_user(a, build) == 0 and _digest(mine) == before   # a loads its own, untouched
    finally:
        import shutil
        shutil.rmtree(top, ignore_errors=True)
