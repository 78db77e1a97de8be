"""Manifest format, checksums and the atomic commit of a version.

The manifest is the single source of truth of a store version: shape, fields, symbols, calendar, the data
file and its checksums. A version becomes visible only when ``manifest.json`` is atomically replaced.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .errors import StoreError

FORMAT = "kline-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VERSIONS_DIR = "versions"


def crashpoint(name: str) -> None:
    """Fault injection for the crash-safety tests: SIGKILL this process at the named point of a write.

    Active only when the environment variable KLINE_STORE_CRASH_AT equals ``name``.
    """
    if os.environ.get("KLINE_STORE_CRASH_AT") == name:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def data_file_name(generation: int) -> str:
    return f"data-g{generation:06d}.f32"


def version_file_name(version: int) -> str:
    return f"v{version:06d}.json"


def row_crcs(rows: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """CRC-32 of each symbol row's bytes, continuing ``prev`` (so appended days extend a row's CRC).

    Args:
        rows: [n, d, f] float32 block; each row's bytes are checksummed in (date, field) order.
        prev: CRC of the bytes before this block, per row; zeros for a fresh row.
    """
    out = np.zeros(rows.shape[0], dtype=np.uint32) if prev is None else prev.astype(np.uint32).copy()
    for i in range(rows.shape[0]):
        out[i] = zlib.crc32(np.ascontiguousarray(rows[i]).data, int(out[i]))
    return out


def file_checksum(crcs: np.ndarray) -> str:
    return f"crc32:{zlib.crc32(np.ascontiguousarray(crcs, dtype='<u4').tobytes()):08x}"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any, durable: bool = True) -> None:
    """Write JSON to ``path`` so that a reader sees either the old or the new file, never a torn one.

    ``durable`` also fsyncs the file and its folder, so the new content survives a power loss.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))  # C encoder: far faster than dump()
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def commit(store_dir: Path, manifest: dict) -> None:
    """Publish a version: the atomic swap of manifest.json, then its copy under versions/.

    The copy comes second so that no version file exists for a version that was never committed; a reader
    asking for the current version while its copy is missing (a crash in between) uses manifest.json.
    """
    write_json_atomic(store_dir / MANIFEST, manifest)
    crashpoint("commit:manifest-swapped")
    vdir = store_dir / VERSIONS_DIR
    vdir.mkdir(exist_ok=True)
    # Not fsync'd: if a power loss takes this copy, readers of the current version use manifest.json.
    write_json_atomic(vdir / version_file_name(manifest["version"]), manifest, durable=False)
    crashpoint("commit:done")


def ensure_version_copy(store_dir: Path, manifest: dict) -> None:
    """Write the copy of the current version under versions/ if a crash (or the gap after the swap) left it
    missing; best effort (a read-only store on a shared filesystem simply keeps going without it)."""
    path = store_dir / VERSIONS_DIR / version_file_name(manifest["version"])
    if path.exists():
        return
    try:
        path.parent.mkdir(exist_ok=True)
        write_json_atomic(path, manifest, durable=False)
    except OSError:
        pass


def read_manifest(store_dir: Path, version: int | None = None) -> dict:
    """Read the current manifest (or a given version's) and check it is one of ours."""
    path = store_dir / MANIFEST if version is None else store_dir / VERSIONS_DIR / version_file_name(version)
    if not store_dir.exists():
        raise StoreError(f"{store_dir}: no such store")
    if version is not None and (store_dir / MANIFEST).exists():
        try:
            current = read_manifest(store_dir)
        except StoreError:
            current = None     # a damaged current manifest must not hide the older versions' copies
        if current is not None and current["version"] == version:
            return current     # the durable original; its copy may be missing or torn after a crash
    if not path.exists():
        if version is not None:
            raise StoreError(f"{store_dir}: version {version} is not available (removed by gc or never existed)")
        raise StoreError(f"{store_dir}: not a kline-store store (no {MANIFEST})")
    try:
        with open(path, encoding="utf-8") as fh:
            m = json.load(fh)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: manifest is unreadable or corrupt ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise StoreError(f"{path}: not a kline-store manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{path}: format version {m.get('format_version')} is not supported "
                         f"(this kline-store reads {FORMAT_VERSION})")
    check_manifest(m, path)
    return m


def check_manifest(m: dict, path: Path) -> None:
    """Internal consistency of a manifest: every list agrees with the declared shape."""
    try:
        shape = m["shape"]
        n_sym, n_dates, n_fields = shape["n_symbols"], shape["n_dates"], shape["n_fields"]
        problems = []
        if len(m["symbols"]) != n_sym:
            problems.append(f"{len(m['symbols'])} symbols listed for n_symbols={n_sym}")
        if len(m["calendar"]) != n_dates:
            problems.append(f"{len(m['calendar'])} calendar dates for n_dates={n_dates}")
        if len(m["fields"]) != n_fields:
            problems.append(f"{len(m['fields'])} fields listed for n_fields={n_fields}")
        if len(m["first_bar"]) != n_sym or len(m["last_bar"]) != n_sym:
            problems.append("first_bar/last_bar length differs from n_symbols")
        f = m["data"]
        if len(f["row_crc32"]) != f["rows"] or f["rows"] < n_sym:
            problems.append("row checksums do not match the data file's rows")
        if shape["date_capacity"] < n_dates:
            problems.append("date_capacity below n_dates")
        if m["dtype"] != "float32":
            problems.append(f"dtype {m['dtype']} is not float32")
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{path}: manifest is missing an entry ({exc})") from None
    if problems:
        raise StoreError(f"{path}: manifest mismatch: " + "; ".join(problems))
