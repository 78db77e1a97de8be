"""Open a store as a read-only snapshot; write a new generation; verify.

Layout and guarantees are described in docs/DESIGN.md. In short: one float32 file per generation, shaped
[rows, date_capacity, n_fields] (symbol-major, fields innermost), plus a manifest that says how much of it a
version sees. Committed bytes are never modified, so an open Store is a stable snapshot.
"""

from __future__ import annotations

import mmap
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import lock, manifest as mf
from .errors import InputError, StoreError

STAGING = ".staging"
# Full checksum on open for stores up to this many logical bytes ("auto"); larger ones check sizes only.
AUTO_VERIFY_BYTES = 1 << 30


def _dates_to_iso(dates: np.ndarray) -> list[str]:
    return np.datetime_as_string(dates.astype("datetime64[D]"), unit="D").tolist()


class Store:
    """A read-only snapshot of one store version. Create with :func:`open_store`."""

    def __init__(self, path: Path, m: dict) -> None:
        self.path = path
        self.manifest = m
        self.version: int = m["version"]
        self.symbols: list[str] = list(m["symbols"])
        self.fields: list[str] = list(m["fields"])
        self.dates: np.ndarray = np.array(m["calendar"], dtype="datetime64[D]")
        shape = m["shape"]
        self.n_symbols, self.n_dates, self.n_fields = shape["n_symbols"], shape["n_dates"], shape["n_fields"]
        self.date_capacity: int = shape["date_capacity"]
        self.row_stride = self.date_capacity * self.n_fields
        self.first_bar = np.asarray(m["first_bar"], dtype=np.int64)
        self.last_bar = np.asarray(m["last_bar"], dtype=np.int64)
        self.data_file = path / m["data"]["file"]
        self._fd: int | None = None
        self._raw: np.ndarray | None = None
        self._open_data()

    def _open_data(self) -> None:
        rows = self.manifest["data"]["rows"]
        need = rows * self.row_stride * 4
        try:
            fd = os.open(self.data_file, os.O_RDONLY)
        except FileNotFoundError:
            raise StoreError(f"{self.data_file}: data file is missing") from None
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
        the exact version from it)."""
        vfile = self.path / mf.VERSIONS_DIR / mf.version_file_name(self.version)
        if not vfile.exists():
            mf.ensure_version_copy(self.path, self.manifest)   # a crash or the gap after a commit left none
        try:
            self._vfd: int | None = os.open(vfile, os.O_RDONLY)
        except FileNotFoundError:
            self._vfd = None
            return
        lock.pin_shared(self._vfd)

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
    def logical_bytes(self) -> int:
        return self.n_symbols * self.n_dates * self.n_fields * 4

    def check_checksums(self) -> list[str]:
        """Recompute the row CRCs; return one message per damaged symbol row (empty when intact)."""
        want = np.asarray(self.manifest["data"]["row_crc32"], dtype=np.uint32)
        problems = []
        if mf.file_checksum(want) != self.manifest["data"]["checksum"]:
            problems.append(f"{mf.MANIFEST}: data checksum list does not match its file checksum")
        panel = self._raw
        for i in range(self.n_symbols):
            got = zlib.crc32(np.ascontiguousarray(panel[i, : self.n_dates]).data) if self.n_dates else 0
            if got != int(want[i]):
                problems.append(f"{self.data_file.name}: checksum mismatch in row {i} (symbol {self.symbols[i]})")
        return problems

    def info(self) -> dict:
        """Summary as plain JSON types (what `kline-store info --json` prints)."""
        m = self.manifest
        return {
            "path": str(self.path), "version": self.version, "symbols": self.symbols, "fields": self.fields,
            "start": str(self.dates[0]) if self.n_dates else None,
            "end": str(self.dates[-1]) if self.n_dates else None,
            "n_dates": self.n_dates, "n_symbols": self.n_symbols,
            "n_bars": m.get("n_bars"), "shape": [self.n_symbols, self.n_dates, self.n_fields],
            "dtype": "float32", "data_file": self.data_file.name, "bytes": self.logical_bytes,
            "created_at": m.get("created_at"), "updated_at": m.get("updated_at"),
        }

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


def open_store(path: str | os.PathLike, version: int | None = None, verify: bool | str = "auto") -> Store:
    """Open a store read-only.

    Args:
        path: the store directory.
        version: None for the current version, or the number of an earlier snapshot still on disk.
        verify: True recomputes every checksum; False checks sizes and the manifest only; "auto" checksums
            stores up to 1 GiB.

    Raises:
        StoreError: missing store, damaged manifest, missing/truncated data file, checksum mismatch.
    """
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


def verify_store(path: str | os.PathLike) -> list[str]:
    """All problems found in a store (empty list when it is intact). Never raises for damage.

    Raises:
        StoreError: ``path`` is not a store at all (missing, or no manifest): nothing to verify.
    """
    p = Path(path)
    if not p.is_dir():
        raise StoreError(f"{p}: no such store")
    if not (p / mf.MANIFEST).exists():
        raise StoreError(f"{p}: not a kline-store store (no {mf.MANIFEST})")
    try:
        st = open_store(path, verify=False)
    except StoreError as exc:
        return [str(exc)]
    with st:
        problems = st.check_checksums()
        size = os.path.getsize(st.data_file)
        if size < st.manifest["data"]["size"]:
            problems.append(f"{st.data_file.name}: size {size} differs from manifest {st.manifest['data']['size']}")
    return problems


# --------------------------------------------------------------------------- writing


RELEASE_ABOVE = 256 << 20   # panels above this size have written pages synced and dropped as they go


def release(arr: np.ndarray) -> None:
    """Write back and unmap the resident pages of a memory-mapped array (no-op for plain arrays)."""
    base = arr
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    mm = getattr(base, "_mmap", None)
    if mm is not None:
        mm.flush()
        mm.madvise(mmap.MADV_DONTNEED)


def staging_dir(store_dir: Path) -> Path:
    d = store_dir / STAGING
    d.mkdir(parents=True, exist_ok=True)
    return d


def clean_staging(store_dir: Path) -> None:
    """Remove what a killed writer left behind (staging, half-written manifest copies) and restore the
    current version's copy if it is missing. Hold the writer lock."""
    shutil.rmtree(store_dir / STAGING, ignore_errors=True)
    for tmp in [*store_dir.glob(f".{mf.MANIFEST}.tmp-*"), *store_dir.glob(f"{mf.VERSIONS_DIR}/.v*.tmp-*")]:
        tmp.unlink(missing_ok=True)
    try:
        mf.ensure_version_copy(store_dir, mf.read_manifest(store_dir))
    except StoreError:
        pass


def default_capacity(n_dates: int) -> int:
    """Room for ~10 years of daily appends (or doubling, for long histories) before a rewrite."""
    return n_dates + max(2520, n_dates)


# Panels up to this size are built in memory and written row by row (cheaper than faulting in a fresh sparse
# mapping page by page); bigger ones are built in the mapped file with their pages released as they go.
IN_MEMORY_PANEL = 256 << 20


@dataclass
class NewGeneration:
    """A data file being written in staging.

    ``panel`` is the [rows, n_dates, fields] array to fill: the file's own mapping (big panels) or an array in
    memory that :func:`finish_generation` writes into the file's rows.
    """

    path: Path
    generation: int
    panel: np.ndarray
    n_dates: int
    capacity: int
    mapped: bool

    @property
    def rows(self) -> int:
        return int(self.panel.shape[0])

    def logical(self) -> np.ndarray:
        return self.panel[:, : self.n_dates, :]


def start_generation(store_dir: Path, generation: int, n_symbols: int, n_dates: int, n_fields: int,
                     capacity: int | None = None, fill: bool = True) -> NewGeneration:
    """Create a sparse data file in staging and the array to fill.

    With ``fill`` the logical region starts as NaN; without, the caller writes every logical cell (a dense
    panel is cheaper to write once than to prefill and overwrite).
    """
    cap = capacity or default_capacity(n_dates)
    if cap < n_dates:
        raise InputError(f"capacity={cap} is below the {n_dates} dates to store")
    path = staging_dir(store_dir) / mf.data_file_name(generation)
    size = n_symbols * cap * n_fields * 4
    with open(path, "wb") as fh:
        fh.truncate(size)
    in_memory = n_symbols * n_dates * n_fields * 4 <= IN_MEMORY_PANEL or size == 0
    if in_memory:
        arr = np.empty((n_symbols, n_dates, n_fields), dtype=np.float32)
    else:
        arr = np.memmap(path, dtype=np.float32, mode="r+", shape=(n_symbols, cap, n_fields))
    if fill:
        arr[:, :n_dates, :] = np.nan
    return NewGeneration(path, generation, arr, n_dates, cap, not in_memory)


def finish_generation(store_dir: Path, gen: NewGeneration) -> dict:
    """Write (or flush), checksum and move the data file into the store; returns the manifest's ``data``."""
    logical = gen.logical()
    nf = logical.shape[2] if logical.ndim == 3 else 0
    parts = [np.zeros(0, np.uint32)]
    with open(gen.path, "rb+") as fh:
        for lo in range(0, logical.shape[0], 256):   # a block of rows at a time
            block = logical[lo: lo + 256]
            parts.append(mf.row_crcs(block))
            if not gen.mapped:
                for i in range(block.shape[0]):
                    os.pwrite(fh.fileno(), block[i].data, (lo + i) * gen.capacity * nf * 4)
            elif logical.nbytes > RELEASE_ABOVE:
                release(gen.panel)                  # bounded resident memory for big panels
        os.fsync(fh.fileno())   # also writes back pages dirtied through a mapping (one page cache)
    final = store_dir / gen.path.name
    os.replace(gen.path, final)
    mf.fsync_dir(store_dir)
    crcs = np.concatenate(parts)
    return {"file": final.name, "generation": gen.generation, "rows": gen.rows,
            "size": gen.rows * gen.capacity * nf * 4, "row_crc32": crcs.tolist(),
            "checksum": mf.file_checksum(crcs)}


def build_manifest(*, version: int, data: dict, symbols: Sequence[str], dates: np.ndarray, fields: Sequence[str],
                   capacity: int, first_bar: np.ndarray, last_bar: np.ndarray, n_bars: int,
                   sources: Iterable[dict] = (), created_at: str | None = None, extra: dict | None = None) -> dict:
    dates_iso = _dates_to_iso(dates)
    m = {
        "format": mf.FORMAT, "format_version": mf.FORMAT_VERSION, "version": version,
        "created_at": created_at or mf.now_iso(), "updated_at": mf.now_iso(),
        "dtype": "float32", "layout": "[symbol, date, field] symbol-major, fields innermost, row stride "
                                       "date_capacity*n_fields",
        "shape": {"n_symbols": len(symbols), "n_dates": len(dates), "n_fields": len(fields),
                  "date_capacity": capacity},
        "fields": list(fields), "symbols": list(symbols), "calendar": dates_iso,
        "first_bar": [int(x) for x in first_bar], "last_bar": [int(x) for x in last_bar],
        "first_date": [dates_iso[i] if i >= 0 else None for i in first_bar],
        "last_date": [dates_iso[i] if i >= 0 else None for i in last_bar],
        "n_bars": int(n_bars), "data": data, "sources": list(sources),
    }
    if extra:
        m.update(extra)
    return m


def bar_extent(present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last calendar index with a bar per symbol (-1 when none), from a [n_sym, n_dates] mask."""
    n = present.shape[1]
    has = present.any(axis=1)
    first = np.where(has, present.argmax(axis=1), -1)
    last = np.where(has, n - 1 - present[:, ::-1].argmax(axis=1), -1)
    return first.astype(np.int64), last.astype(np.int64)


def current_state(store_dir: Path) -> tuple[int, int, str | None]:
    """(last version, last generation, created_at) of an existing store, or zeros when there is none."""
    try:
        m = mf.read_manifest(store_dir)
    except StoreError:
        return 0, 0, None
    return m["version"], m["data"]["generation"], m.get("created_at")


def create_store(path: str | os.PathLike, panel: np.ndarray, symbols: Sequence[str], dates: np.ndarray,
                 fields: Sequence[str], *, sources: Iterable[dict] = (), extra: dict | None = None,
                 capacity: int | None = None, wait: float = 0.0) -> Path:
    """Write a whole store from an in-memory panel [n_sym, n_dates, n_fields] (tests, small data, Python users).

    An existing store at ``path`` is replaced atomically (new generation, manifest swap); gc removes its old
    data file once no reader uses it.
    """
    store_dir = Path(path)
    panel = np.asarray(panel, dtype=np.float32)
    dates = np.asarray(dates, dtype="datetime64[D]")
    if panel.shape != (len(symbols), len(dates), len(fields)):
        raise InputError(f"panel shape {panel.shape} does not match {len(symbols)} symbols x {len(dates)} dates"
                         f" x {len(fields)} fields")
    with lock.WriterLock(store_dir, wait=wait):
        clean_staging(store_dir)
        version, generation, _ = current_state(store_dir)
        gen = start_generation(store_dir, generation + 1, len(symbols), len(dates), len(fields), capacity)
        gen.logical()[...] = panel
        present = np.isfinite(panel).any(axis=2) if panel.size else np.zeros(panel.shape[:2], bool)
        first, last = bar_extent(present)
        data = finish_generation(store_dir, gen)
        m = build_manifest(version=version + 1, data=data, symbols=symbols, dates=dates, fields=fields,
                           capacity=gen.capacity, first_bar=first, last_bar=last,
                           n_bars=int(present.sum()), sources=sources, extra=extra)
        mf.commit(store_dir, m)
        clean_staging(store_dir)
    gc(store_dir)
    return store_dir


def gc(path: str | os.PathLike) -> list[str]:
    """Delete data files and version manifests that the current version does not use and no reader pins.

    Returns the names removed. Safe to run at any time; it takes the writer lock (and gives up if busy).

    Raises:
        StoreError: ``path`` is not a store.
    """
    store_dir = Path(path)
    removed: list[str] = []
    mf.read_manifest(store_dir)   # a clear error for a path that is not a store (and no lock file left there)
    try:
        with lock.WriterLock(store_dir, wait=0):
            m = mf.read_manifest(store_dir)
            keep = m["data"]["file"]
            for f in sorted(store_dir.glob("data-g*.f32")):
                if f.name != keep and lock.unused(f):
                    f.unlink()
                    removed.append(f.name)
            # Old version manifests: open snapshots pin theirs (workers reopen from it); the rest go.
            vdir = store_dir / mf.VERSIONS_DIR
            current = mf.version_file_name(m["version"])
            for v in sorted(vdir.glob("v*.json")) if vdir.exists() else []:
                if v.name != current and lock.unused(v):
                    v.unlink()
                    removed.append(f"{mf.VERSIONS_DIR}/{v.name}")
    except StoreError:
        return removed
    return removed
