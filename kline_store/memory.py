"""How much memory this process may still use, and one-line refusals when a structure would not fit.

"Available" is the tightest of the machine's ``MemAvailable`` and the memory cgroup's limit (v2 ``memory.max``, v1
``memory.limit_in_bytes``, of this process's cgroup and every ancestor) less what the cgroup already holds that
the kernel cannot reclaim (its usage minus its inactive file pages). Inside a container the machine's RAM is not
what the OOM killer goes by: the cgroup is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

_NO_LIMIT = 1 << 60   # cgroup v1 writes 9223372036854771712 for "no limit"


@dataclass(frozen=True)
class Available:
    """``nbytes`` available, and where that figure comes from (for messages)."""

    nbytes: int
    source: str

    def __str__(self) -> str:
        return f"{gib(self.nbytes)} available ({self.source})"


def gib(n: int | float) -> str:
    """Bytes as a short human figure: ``1.4 GiB``, ``380 MiB``."""
    n = float(n)
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f} MiB"
    return f"{n / 1024:.0f} KiB"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        v = int(text)
    except ValueError:
        return None
    return None if v >= _NO_LIMIT else v


def _stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def _mounts() -> tuple[list[Path], list[Path]]:
    """Mount points of cgroup v2 and of the v1 memory controller."""
    v2, v1 = [], []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or not rparts:
            continue
        if rparts[0] == "cgroup2":
            v2.append(Path(parts[4]))
        elif rparts[0] == "cgroup" and "memory" in (rparts[-1].split(",") if rparts else []):
            v1.append(Path(parts[4]))
    return v2, v1


def cgroup_dirs() -> list[tuple[Path, str]]:
    """This process's memory cgroup directories, innermost first, with their version ("v1" or "v2")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    v2m, v1m = _mounts()
    out: list[tuple[Path, str]] = []
    for line in lines:
        hid, _, rest = line.partition(":")
        ctrls, _, rel = rest.partition(":")
        rel = rel.lstrip("/")
        if hid == "0" and ctrls == "":
            mounts, ver = v2m, "v2"
        elif "memory" in ctrls.split(","):
            mounts, ver = v1m, "v1"
        else:
            continue
        for m in mounts:
            d = m / rel if rel else m
            if d.is_dir():
                out.append((d, ver))
                break
    return out


def cgroup_limit() -> tuple[int, int, str] | None:
    """``(limit, unreclaimable usage, file name)`` of the tightest memory cgroup limit, or None when unlimited."""
    best: tuple[int, int, str] | None = None
    for d, ver in cgroup_dirs():
        name = "memory.max" if ver == "v2" else "memory.limit_in_bytes"
        used_name = "memory.current" if ver == "v2" else "memory.usage_in_bytes"
        cur = d
        while True:   # ancestors' limits apply too
            lim = _read_int(cur / name)
            if lim is not None:
                used = _read_int(cur / used_name) or 0
                st = _stat(cur / "memory.stat")
                inactive = st.get("inactive_file", st.get("total_inactive_file", 0))
                if ver == "v1":
                    inactive = st.get("total_inactive_file", inactive)
                held = max(0, used - inactive)
                if best is None or lim - held < best[0] - best[1]:
                    best = (lim, held, f"cgroup {name} {gib(lim)}")
            if cur.parent == cur or not (cur.parent / name).exists():
                break
            cur = cur.parent
    return best


def mem_available() -> int:
    """The machine's ``MemAvailable`` (physical memory when /proc is not there)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 62


def available() -> Available:
    """Memory this process may still take: the machine's, or its cgroup's when that is tighter."""
    host = mem_available()
    cg = cgroup_limit()
    if cg is not None and cg[0] - cg[1] < host:
        return Available(max(0, cg[0] - cg[1]), cg[2])
    return Available(host, "MemAvailable")


def private_bytes() -> int:
    """This process's resident anonymous memory (``RssAnon`` of /proc/self/status): what it holds privately."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def require(what: str, need: int, avail: Available | None = None, fraction: float = 1.0, hint: str = "") -> None:
    """InputError in one line when ``need`` bytes exceed ``fraction`` of the available memory."""
    avail = available() if avail is None else avail
    if need > avail.nbytes * fraction:
        share = "" if fraction >= 1 else f" (this takes at most {fraction:.0%} of it)"
        raise InputError(f"{what} needs {gib(need)}; {avail}{share}" + (f"; {hint}" if hint else ""))


def make_cgroup(limit: int, name: str) -> tuple[Path, str] | None:
    """A child of this process's memory cgroup limited to ``limit`` bytes (for tests and benchmarks; needs
    permission), or None when none can be made. Move a process in with :func:`join_cgroup`."""
    for d, ver in cgroup_dirs():
        child = d / name
        try:
            child.mkdir(exist_ok=True)
            if ver == "v2":
                (child / "memory.max").write_text(str(int(limit)))
                swap = child / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
            else:
                (child / "memory.limit_in_bytes").write_text(str(int(limit)))
            return child, ver
        except OSError:
            try:
                child.rmdir()
            except OSError:
                pass
    return None


def join_cgroup(path: Path, pid: int | None = None) -> None:
    """Move a process (default: this one) into the cgroup at ``path``."""
    (path / "cgroup.procs").write_text(str(os.getpid() if pid is None else pid))


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup made by :func:`make_cgroup` (its processes must have ended)."""
    try:
        path.rmdir()
    except OSError:
        pass


__all__ = ["Available", "available", "cgroup_dirs", "cgroup_limit", "gib", "join_cgroup", "make_cgroup",
           "mem_available", "private_bytes", "remove_cgroup", "require"]
