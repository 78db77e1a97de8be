"""File-system guards: plain names, no link followed, exclusive temporary files, reservations, messages."""

import errno
import os
from pathlib import Path

import pytest

from conftest import write
from kline_store.store import safefs
from kline_store.errors import StoreError


@pytest.mark.parametrize("name,ok", [("data-g000001.f32", True), ("../victim.bin", False), ("/etc/passwd", False),
                                     ("a/b", False), ("..", False), ("", False), (None, False), ("a\\b", False)])
def test_plain_name(name, ok):
    assert safefs.plain_name(name) is ok


def test_open_entry_refuses_links_folders_and_fifos(tmp_path):
    victim = write(tmp_path / "victim", "x")
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(StoreError, match="link: is a symbolic link"):
        safefs.open_entry(tmp_path / "link")
    with pytest.raises(StoreError, match="link: is a symbolic link"):
        safefs.open_entry(tmp_path / "link", os.O_RDWR | os.O_CREAT)
    (tmp_path / "dir").mkdir()
    with pytest.raises(StoreError, match="not a regular file"):
        safefs.open_entry(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(StoreError, match="not a regular file"):   # and it does not block waiting for a writer
        safefs.open_entry(tmp_path / "fifo")
    with pytest.raises(FileNotFoundError):
        safefs.open_entry(tmp_path / "missing")
    os.close(safefs.open_entry(victim))


def test_check_dir(tmp_path):
    assert safefs.check_dir(tmp_path / "missing") is False
    os.symlink(tmp_path, tmp_path / "link")
    with pytest.raises(StoreError, match="is a symbolic link"):
        safefs.check_dir(tmp_path / "link")
    with pytest.raises(StoreError, match="not a folder"):
        safefs.check_dir(write(tmp_path / "f", ""))
    assert safefs.make_dir(tmp_path / "new").is_dir()


def test_write_atomic_does_not_follow_a_planted_temporary_link(tmp_path):
    victim = write(tmp_path / "victim", "precious")
    os.symlink(victim, tmp_path / f".m.json.tmp-{os.getpid()}")
    safefs.write_atomic(tmp_path / "m.json", b"{}")
    assert victim.read_text() == "precious" and (tmp_path / "m.json").read_bytes() == b"{}"
    os.symlink(victim, tmp_path / "n.json")
    safefs.write_atomic(tmp_path / "n.json", b"[]", durable=False)     # replaces the link, not its target
    assert victim.read_text() == "precious" and not (tmp_path / "n.json").is_symlink()


def test_merge_ranges_and_reserve(tmp_path):
    assert safefs.merge_ranges([(10, 5), (0, 10), (30, 0), (40, 2), (41, 5)]) == [(0, 15), (40, 6)]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 64 << 20)
    safefs.reserve(fd, [(0, 4096), (32 << 20, 4096)])
    os.close(fd)
    assert os.stat(tmp_path / "f").st_blocks * 512 < 1 << 20       # the rest stays a hole


@pytest.mark.parametrize("code,needle", [
    (errno.ENOSPC, "s: no space left on device: write x needs 1,234 bytes"),
    (errno.EROFS, "s: read-only file system: cannot write x"),
    (errno.EACCES, "s: permission denied: cannot write x"),
    (errno.EFBIG, "s: file too large: write x needs a file of 1,234 bytes"),
    (errno.EIO, "s: cannot write x: Input/output error"),
])
def test_os_errors_become_one_line(code, needle):
    msg = str(safefs.os_error(OSError(code, os.strerror(code)), Path("s"), "write x", 1234))
    assert msg.startswith(needle) and "\n" not in msg
