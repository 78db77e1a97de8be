"""Writer lock and reader pins: who holds the lock, waiting, planted links, a removed lock file, gc's probe."""

import os
import threading
import time

import numpy as np
import pytest

from conftest import run_cli, write
from kline_store import StoreError, StoreLockedError
from kline_store.store.lock import LOCK_NAME, WriterLock, pin_shared, unused
from kline_store.store import create_store, open_store

DATES = np.arange("2024-01-01", "2024-02-01", dtype="datetime64[D]")


def make(path, **kw):
    create_store(path, np.ones((2, len(DATES), 1), np.float32), ["A", "B"], DATES, ["close"], **kw)


def test_second_writer_is_told_who_holds_the_lock(tmp_path):
    make(tmp_path / "s")
    with WriterLock(tmp_path / "s"):
        with pytest.raises(StoreLockedError, match=r"store is locked by pid \d+ on .* since"):
            make(tmp_path / "s")
    make(tmp_path / "s")   # free again


def test_waiting_writer_gets_the_lock(tmp_path):
    make(tmp_path / "s")
    held = WriterLock(tmp_path / "s").__enter__()
    threading.Timer(0.3, held.__exit__).start()
    make(tmp_path / "s", wait=10)
    assert open_store(tmp_path / "s").version == 2


def test_missing_store_is_not_created_unless_asked(tmp_path):
    with pytest.raises(StoreError, match="no such store"):
        WriterLock(tmp_path / "nowhere").__enter__()
    assert not (tmp_path / "nowhere").exists()
    with WriterLock(tmp_path / "new", create=True) as lk:
        assert lk.created and (tmp_path / "new" / LOCK_NAME).is_file()


def test_a_planted_lock_link_is_refused_and_its_target_untouched(tmp_path):
    """Case 3: `ln -s ../victim_lock.txt s/.lock; kline-store gc s` truncated the victim."""
    make(tmp_path / "s")
    victim = write(tmp_path / "victim_lock.txt", "precious")
    (tmp_path / "s" / LOCK_NAME).unlink()
    os.symlink("../victim_lock.txt", tmp_path / "s" / LOCK_NAME)
    r = run_cli("gc", str(tmp_path / "s"))
    assert r.returncode == 1 and "is a symbolic link" in r.stderr and r.stderr.count("\n") == 1
    with pytest.raises(StoreError, match=r"\.lock: is a symbolic link"):
        make(tmp_path / "s")
    assert victim.read_text() == "precious"


def test_a_lock_file_with_other_links_is_refused(tmp_path):
    make(tmp_path / "s")
    victim = write(tmp_path / "victim.txt", "precious")
    (tmp_path / "s" / LOCK_NAME).unlink()
    os.link(victim, tmp_path / "s" / LOCK_NAME)
    with pytest.raises(StoreError, match="has other links"):
        WriterLock(tmp_path / "s").__enter__()
    assert victim.read_text() == "precious"


def test_a_waiter_starts_over_when_the_holder_removes_the_lock_file(tmp_path):
    """A failed first ingest removes its folder, lock file included, while others wait on that file."""
    holder = WriterLock(tmp_path / "s", create=True).__enter__()
    got = {}

    def waiter():
        with WriterLock(tmp_path / "s", wait=20, create=True) as lk:
            got["ino"] = os.fstat(lk.fd).st_ino
            got["linked"] = os.stat(tmp_path / "s" / LOCK_NAME).st_ino

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)                           # let it open the lock file and wait on it
    holder.remove()
    holder.__exit__()
    t.join(30)
    assert got["ino"] == got["linked"]        # the waiter holds the lock file that is in the folder now


def test_pins_and_gc_probe(tmp_path):
    f = write(tmp_path / "data-g000001.f32", "x")
    assert unused(f)
    fd = os.open(f, os.O_RDONLY)
    pin_shared(fd)
    assert not unused(f)
    os.close(fd)
    assert unused(f) and unused(tmp_path / "missing")
    os.mkfifo(tmp_path / "fifo")
    assert not unused(tmp_path / "fifo")      # never blocks on a FIFO planted under a store name
