"""The read side of a store: open one version as a read-only snapshot, and verify a store.

Layout and guarantees are described in docs/DESIGN.md. In short: one float32 file per generation, shaped
[rows, date_capacity, n_fields] (symbol-major, fields innermost), plus a manifest that says how much of it a
version sees. Committed bytes are never modified, so an open Store is a stable snapshot. Nothing here writes:
a read-only ``info`` or ``open_store`` leaves the store exactly as it found it (writers live in writer.py).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from . import to_frames, lock, manifest as mf, safefs, timeaxis
from .universes import Universe, names as universe_names
from ..errors import InputError, StoreError
from ..progress import track

STAGING = ".staging"     # scratch space of a running writer (see writer.py)
_AHEAD = 4096            # rows whose used bytes are requested at once while checksumming a sparse store
# Full checksum on open for stores up to this many logical bytes ("auto"); larger ones check sizes only.
AUTO_VERIFY_BYTES = 1 << 30


class Store:
    """A read-only snapshot of one store version. Create with :func:`open_store`."""

    def __init__(self, path: Path, m: dict) -> None:
        self.path = path
        self.manifest = m
        self.version: int = m["version"]
        self.symbols: list[str] = list(m["symbols"])
        self.fields: list[str] = list(m["fields"])
        self.freq: str = m.get("freq", timeaxis.DAILY)   # "1d", or the bar size of an intraday store ("1min")
        self.bar: str = m.get("bar") or self.freq    # how long a bar is: "1w"/"1mo" on a daily axis, else freq
        self.dates: np.ndarray = np.array(m["calendar"], dtype=f"datetime64[{timeaxis.unit(self.freq)}]")
        shape = m["shape"]
        self.n_symbols, self.n_dates, self.n_fields = shape["n_symbols"], shape["n_dates"], shape["n_fields"]
        self.date_capacity: int = shape["date_capacity"]
        self.row_stride = self.date_capacity * self.n_fields
        self.first_bar = np.asarray(m["first_bar"], dtype=np.int64)
        self.last_bar = np.asarray(m["last_bar"], dtype=np.int64)
        self.data_file = path / m["data"]["file"]
        self._fd: int | None = None
        self._vfd: int | None = None
        self._raw: np.ndarray | None = None
        self._open_data()

    def _open_data(self) -> None:
        rows = self.manifest["data"]["rows"]
        need = rows * self.row_stride * 4
        try:
            fd = safefs.open_entry(self.data_file)
        except FileNotFoundError:
            raise StoreError(f"{self.data_file}: data file is missing") from None
        except OSError as exc:
            raise StoreError(f"{self.data_file}: cannot open the data file ({exc.strerror or exc})") from None
        size = os.fstat(fd).st_size
        if size < need:
            os.close(fd)
            raise StoreError(f"{self.data_file}: data file is truncated ({size} bytes, manifest needs {need})")
        lock.pin_shared(fd)
        self._fd = fd
        self._pin_version()
        if rows == 0 or need == 0:
            self._raw = np.zeros((0, max(self.date_capacity, 1), max(self.n_fields, 1)), dtype=np.float32)
        else:
            # Map the file this process opened and pinned, not the path again (gc may unlink it meanwhile).
            with open(fd, "rb", closefd=False) as fh:
                self._raw = np.memmap(fh, dtype=np.float32, mode="r",
                                      shape=(rows, self.date_capacity, self.n_fields))

    def _pin_version(self) -> None:
        """Hold this version's manifest copy too, so gc keeps it while this snapshot is open (workers reopen
        the exact version from it). A copy that is missing (writers restore it) or not a plain file in a real
        ``versions/`` folder is not pinned; a reader never writes one."""
        vdir = self.path / mf.VERSIONS_DIR
        try:
            if safefs.check_dir(vdir):
                self._vfd = safefs.open_entry(vdir / mf.version_file_name(self.version))
                lock.pin_shared(self._vfd)
        except (OSError, StoreError):
            self._vfd = None

    def map_private(self) -> np.ndarray:
        """The data file's rows as one flat float32 array: a private, copy-on-write mapping of the file this
        snapshot pinned (never the path again). The array is writable so torch can wrap it without a warning;
        a write would stay in this process's memory and never reach the file. Row ``s`` starts at element
        ``s * row_stride``; pages are read from the shared page cache, so N processes hold one copy."""
        n = int(self.manifest["data"]["rows"]) * self.row_stride
        if n == 0 or self._fd is None:
            return np.zeros(0, dtype=np.float32)
        mm = mmap.mmap(self._fd, n * 4, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return np.frombuffer(mm, dtype=np.float32)

    @property
    def panel(self) -> np.ndarray:
        """Read-only [n_symbols, n_dates, n_fields] float32 view of the memmap; NaN where there is no bar."""
        if self._raw is None:
            raise StoreError(f"{self.path}: this Store (version {self.version}) is closed; open_store() it again")
        v = self._raw[: self.n_symbols, : self.n_dates, : self.n_fields].view(np.ndarray)
        v.flags.writeable = False
        return v

    def array(self, field: str) -> np.ndarray:
        """Read-only [n_symbols, n_dates] float32 view of one field."""
        return self.panel[:, :, self.field_index(field)]

    def field_index(self, field: str) -> int:
        try:
            return self.fields.index(field)
        except ValueError:
            raise InputError(f"{self.path}: no field {field!r}; fields are {', '.join(self.fields)}") from None

    def symbol_index(self, symbol: str) -> int:
        try:
            return self.symbols.index(symbol)
        except ValueError:
            raise InputError(f"{self.path}: no symbol {symbol!r}") from None

    @property
    def universes(self) -> list[str]:
        """Names of the store's universes (symbols with membership dates), sorted."""
        return universe_names(self.manifest)

    def universe(self, name: str) -> np.ndarray:
        """Read-only bool ``[n_symbols, n_dates]``: True on the days a symbol is a member of universe ``name``."""
        out = self.membership(name).dense()
        out.flags.writeable = False
        return out

    def membership(self, name: str) -> Universe:
        """Universe ``name`` on this store's calendar as spans of calendar positions (O(spans), no dense array);
        a one-line InputError naming the store's universes when it has no such one."""
        return Universe.of(self.manifest, name, self.calendar_days(), self.path)

    def calendar_days(self) -> np.ndarray:
        """The trading day of each calendar entry (days since 1970): the date, or for an intraday bar the day it
        belongs to (a bar stamped 24:00 with its end belongs to the day it ends)."""
        keys = self.dates.astype(np.int64)
        if self.freq == timeaxis.DAILY:
            return keys
        # sessions.trading_day's rule (that module reads session files with polars: not imported by readers)
        end = (self.manifest.get("sessions") or {}).get("stamp") == "end"
        return (keys - 1) // timeaxis.MINUTES_PER_DAY if end else keys // timeaxis.MINUTES_PER_DAY

    def symbol_summary(self) -> list[dict]:
        """Per symbol: its first and last bar (ISO text, None without bars) and its number of bars."""
        counts = np.zeros(self.n_symbols, dtype=np.int64)
        step = max(1, (64 << 20) // max(1, self.n_dates * self.n_fields * 4))
        for lo in range(0, self.n_symbols, step):
            counts[lo: lo + step] = np.isfinite(self.panel[lo: lo + step]).any(axis=2).sum(axis=1)
        iso = timeaxis.iso(self.dates)
        return [{"symbol": s, "first": iso[f] if f >= 0 else None, "last": iso[la] if la >= 0 else None,
                 "bars": int(c)} for s, f, la, c in zip(self.symbols, self.first_bar, self.last_bar, counts)]

    def to_polars(self, symbols: Sequence[str] | str | None = None, start: object = None, end: object = None,
                  fields: Sequence[str] | str | None = None, wide: bool = False, universe: str | None = None):
        """The store (or a selection) as a polars DataFrame: long format, one row per bar (``symbol``, ``date``
        or ``time``, fields), sorted by symbol and date; ``wide=True``: one field as date x symbol. ``start`` and
        ``end`` take partial dates as pandas does (``end="2012"`` is the last bar of 2012). Every value is on the
        row of the day it describes (a features store's label too); ``universe``: only its members' rows on their
        member days (wide: NaN elsewhere). See store/to_frames.py."""
        return to_frames.to_polars(self, symbols, start, end, fields, wide, universe)

    def to_pandas(self, symbols: Sequence[str] | str | None = None, start: object = None, end: object = None,
                  fields: Sequence[str] | str | None = None, wide: bool = False, universe: str | None = None):
        """As :meth:`to_polars`, a pandas DataFrame (``wide=True``: indexed by date, one column per symbol)."""
        return to_frames.to_pandas(self, symbols, start, end, fields, wide, universe)

    @property
    def logical_bytes(self) -> int:
        return self.n_symbols * self.n_dates * self.n_fields * 4

    def check_checksums(self) -> list[str]:
        """Recompute the row CRCs; return one message per damaged symbol row (empty when intact).

        Only each row's used bytes are read: the mapping is advised for random access meanwhile, so the kernel's
        read-ahead does not pull in the reserved room after every row (a store of 1M symbols x 2 dates reserves
        ~50 GB of holes for 40 MB of values)."""
        want = np.asarray(self.manifest["data"]["row_crc32"], dtype=np.uint32)
        problems = []
        panel = self._raw
        if panel is None:
            raise StoreError(f"{self.path}: this Store (version {self.version}) is closed; open_store() it again")
        used, stride = self.n_dates * self.n_fields * 4, self.row_stride * 4
        with _advised(panel, used, stride) as sparse:
            for i in track(range(self.n_symbols), "checksums", unit="symbols"):
                if sparse and i % _AHEAD == 0 and self._fd is not None:   # the next rows' used bytes, read at once
                    for r in range(i, min(i + _AHEAD, self.n_symbols)):
                        os.posix_fadvise(self._fd, r * stride, used, os.POSIX_FADV_WILLNEED)
                got = zlib.crc32(np.ascontiguousarray(panel[i, : self.n_dates]).data) if self.n_dates else 0
                if got != int(want[i]):
                    problems.append(f"{self.data_file.name}: checksum mismatch in row {i} (symbol {self.symbols[i]})")
        return problems

    def info(self) -> dict:
        """Summary as plain JSON types (what `kline-store info --json` prints)."""
        m = self.manifest
        return {
            "path": str(self.path), "store_id": m.get(mf.STORE_ID_KEY), "version": self.version,
            "symbols": self.symbols, "fields": self.fields,
            "start": str(self.dates[0]) if self.n_dates else None,
            "end": str(self.dates[-1]) if self.n_dates else None,
            "n_dates": self.n_dates, "n_symbols": self.n_symbols,
            "n_bars": m.get("n_bars"), "shape": [self.n_symbols, self.n_dates, self.n_fields],
            "dtype": "float32", "data_file": self.data_file.name, "bytes": self.logical_bytes,
            "created_at": m.get("created_at"), "updated_at": m.get("updated_at"),
            "freq": self.freq, "bar": self.bar, "timezone": m.get("timezone", "exchange-local, naive"),
            "sessions": m.get("sessions"),
            "calendar": m.get("calendar_source"), "exchange": m.get("exchange"),
            "assumed_weekdays": m.get("assumed_weekdays"), "date_format": m.get("date_format"),
            "universes": {u: self.membership(u).summary() for u in self.universes},
        }

    def advise_file(self, ranges: Iterable[tuple[int, int]], advice: str) -> None:
        """Page-cache advice over byte ranges ``(offset, length)`` of the data file, through the descriptor this
        store opened and pinned: "willneed" (read them ahead) or "dontneed" (drop them). Advice only: on a closed
        store, a platform without ``posix_fadvise`` or a failure it costs speed, never data."""
        fd = self._fd
        if advice not in ("willneed", "dontneed"):
            raise InputError(f"advise_file: advice={advice!r}; expected 'willneed' or 'dontneed'")
        if fd is None:
            return
        try:
            flag = os.POSIX_FADV_WILLNEED if advice == "willneed" else os.POSIX_FADV_DONTNEED
            for offset, length in ranges:
                os.posix_fadvise(fd, offset, length, flag)
        except (OSError, AttributeError):
            pass

    def data_file_identity(self) -> tuple[int, int] | None:
        """(device, inode) of the data file this store opened and pinned (None once closed): a writer that read
        through this store checks that the file it appends to is still this one."""
        if self._fd is None:
            return None
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    def data_file_size(self) -> int:
        """Bytes of the data file this store opened and pinned (0 once closed)."""
        return os.fstat(self._fd).st_size if self._fd is not None else 0

    def close(self) -> None:
        self._raw = None
        for name in ("_fd", "_vfd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        span = f"{self.dates[0]}..{self.dates[-1]}" if self.n_dates else "empty"
        return (f"Store({str(self.path)!r}, v{self.version}, {self.n_symbols} symbols x {self.n_dates} dates "
                f"[{span}] x {self.fields})")


@contextlib.contextmanager
def _advised(raw: np.ndarray, used: int, stride: int) -> Iterator[bool]:
    """Random-access advice on a memmap while rows much shorter than their stride are read (no read-ahead into
    the reserved room), normal advice after. Yields whether it advised (the caller then asks for the rows' used
    bytes ahead, so they are read in parallel rather than one page fault at a time)."""
    mm = getattr(raw, "_mmap", None)
    sparse = mm is not None and hasattr(mmap, "MADV_RANDOM") and hasattr(os, "posix_fadvise") and \
        stride >= 4 * max(used, mmap.PAGESIZE)
    if sparse:
        try:
            mm.madvise(mmap.MADV_RANDOM)
        except (OSError, ValueError):
            sparse = False
    try:
        yield sparse
    finally:
        if sparse:
            try:
                mm.madvise(mmap.MADV_NORMAL)
            except (OSError, ValueError):
                pass


def open_store(path: str | os.PathLike, version: int | None = None, verify: bool | str = "auto") -> Store:
    """Open a store read-only.

    Args:
        path: the store directory.
        version: None for the current version, or the number of an earlier snapshot still on disk.
        verify: True recomputes every checksum; False checks sizes and the manifest only; "auto" checksums
            stores up to 1 GiB. The manifest's own checksum and schema are always checked.

    Raises:
        StoreError: missing store, damaged or changed manifest, missing/truncated data file, checksum mismatch.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise StoreError(f"open_store({path!r}): expected a store directory path")
    p = Path(path)
    for attempt in range(3):
        m = mf.read_manifest(p, version)
        try:
            st = Store(p, m)
            break
        except StoreError:
            # The current version's file can vanish between reading the manifest and opening the file (a
            # rewrite committed and gc ran in between): read the newer manifest and try again.
            if version is not None or attempt == 2 or mf.read_manifest(p)["version"] == m["version"]:
                raise
    if verify is True or (verify == "auto" and st.logical_bytes <= AUTO_VERIFY_BYTES):
        problems = st.check_checksums()
        if problems:
            st.close()
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StoreError(f"{st.data_file}: store is damaged: {problems[0]}{more}; run `kline-store verify`")
    return st


@dataclass
class Verification:
    """What :func:`verify` found: damage (``problems``) and facts worth saying that are not damage."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def verify(path: str | os.PathLike) -> Verification:
    """Check a store's manifest (checksum, schema), data sizes and every row checksum. Never raises for damage.

    Raises:
        StoreError: ``path`` is not a store at all (missing, or no manifest): nothing to verify.
    """
    p = Path(path)
    if not p.is_dir():
        raise StoreError(f"{p}: no such store")
    if not (p / mf.MANIFEST).exists() and not (p / mf.MANIFEST).is_symlink():
        raise StoreError(f"{p}: not a kline-store store (no {mf.MANIFEST})")
    out = Verification()
    for name in (mf.MANIFEST, mf.VERSIONS_DIR, lock.LOCK_NAME, STAGING):
        if (p / name).is_symlink():
            out.problems.append(f"{p / name}: is a symbolic link; a store's files must be inside it")
    try:
        st = open_store(path, verify=False)
    except StoreError as exc:
        out.problems.append(str(exc))
        return out
    with st:
        out.problems.extend(st.check_checksums())
        size = st.data_file_size()
        if size < st.manifest["data"]["size"]:
            out.problems.append(f"{st.data_file.name}: size {size} differs from manifest {st.manifest['data']['size']}")
        if mf.CHECKSUM_KEY not in st.manifest:
            out.notes.append(f"{mf.MANIFEST} has no checksum (written by an older kline-store); the next write "
                             f"adds one")
    return out


def verify_store(path: str | os.PathLike) -> list[str]:
    """All problems found in a store (empty list when it is intact); see :func:`verify`."""
    return verify(path).problems
