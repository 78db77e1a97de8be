"""A small file system to fill or make read-only, without privileges: a tmpfs mounted in a new user and mount
namespace (``unshare -rm``). A Python script runs inside with the mount point as ``sys.argv[1]`` and prints
one JSON object; tests assert on it. Where user namespaces are not allowed, :func:`tmpfs_or_skip` skips.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Helpers the scripts use: run the CLI, fill the file system up to `leave` bytes, make it read-only.
PRELUDE = '''
import json, os, subprocess, sys
from pathlib import Path
MNT = Path(sys.argv[1])

def cli(*args):
    r = subprocess.run([sys.executable, "-m", "kline_store.cli", *map(str, args)], capture_output=True, text=True)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}

def fill(leave):
    st = os.statvfs(MNT)
    free = st.f_bavail * st.f_frsize
    fd = os.open(MNT / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, max(free - leave, 4096))
    os.close(fd)
    st = os.statvfs(MNT)
    return st.f_bavail * st.f_frsize

def read_only():
    subprocess.run(["mount", "-o", "remount,ro", str(MNT)], check=True)

def tree(p):
    return sorted(str(q.relative_to(p)) for q in Path(p).rglob("*"))
'''


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """None when a tmpfs can be mounted in a user namespace here, else why not."""
    if not shutil.which("unshare"):
        return "no unshare command"
    try:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=1m none $d"
                            " && mount -o remount,ro $d && echo ok"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if r.stdout.strip() == "ok" else f"no unprivileged tmpfs here: {r.stderr.strip()[:200]}"


def tmpfs_or_skip() -> None:
    why = _probe()
    if why:
        pytest.skip(why)


def run_in_tmpfs(tmp_path: Path, script: str, size: str = "16m", timeout: float = 300) -> dict:
    """Run ``script`` (PRELUDE's helpers available) with a fresh tmpfs of ``size`` mounted at argv[1]."""
    tmpfs_or_skip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    body = tmp_path / "script.py"
    body.write_text(PRELUDE + textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size="$1" none "$2" && shift 2 && exec "$@"',
                        "sh", size, str(mnt), sys.executable, str(body), str(mnt)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
