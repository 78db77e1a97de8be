"""The manifest: format, checksums, schema check and reading. Nothing here writes.

The manifest is the single source of truth of a store version: shape, fields, symbols, calendar, the data
file and its row checksums. It is checked like the data: ``manifest_checksum`` is a SHA-256 over the
canonical JSON of every other key (sorted keys, no spaces, UTF-8), and every value is checked for its type
and range before any of it is used. Manifests written before the checksum existed still open (``verify``
says so); the next write adds it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from . import safefs, universes
from ..errors import StoreError

FORMAT = "kline-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
VERSIONS_DIR = "versions"
CHECKSUM_KEY = "manifest_checksum"
STORE_ID_KEY = "store_id"         # made at a store's first write, kept by every later one (see identity.py)
_STORE_ID = re.compile(r"[0-9a-f]{32}")
DATA_FILE_RE = re.compile(r"data-g(\d{6,})\.f32")
VERSION_FILE_RE = re.compile(r"v(\d{6,})\.json")
FACTOR_SOURCES = (None, "input", "events")
FIRST_DAY, LAST_DAY = np.datetime64("1800-01-01"), np.datetime64("2200-12-31")
_MAX_COUNT = 1 << 40          # bound on any count or size: keeps shapes and offsets far from overflow
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_ISO_MINUTE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
_FREQ = re.compile(r"1d|[1-9]\d{0,3}min")


def data_file_name(generation: int) -> str:
    return f"data-g{generation:06d}.f32"


def version_file_name(version: int) -> str:
    return f"v{version:06d}.json"


def new_store_id() -> str:
    return uuid.uuid4().hex


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


def content_checksum(m: dict) -> str:
    """SHA-256 of the canonical JSON of every key but the checksum itself."""
    body = {k: v for k, v in m.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(m: dict) -> dict:
    """The manifest with its checksum added (or replaced)."""
    out = {k: v for k, v in m.items() if k != CHECKSUM_KEY}
    out[CHECKSUM_KEY] = content_checksum(out)
    return out


def encode(m: dict) -> bytes:
    """The manifest's bytes on disk (compact; the C encoder is far faster than an indented dump)."""
    return json.dumps(m, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {dup!r} appears twice")
    return d


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse(raw: bytes, path: Path) -> dict:
    """The manifest's bytes -> dict; any undecodable or ambiguous JSON is a StoreError naming ``path``."""
    try:
        m = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StoreError(f"{path}: manifest is unreadable or corrupt ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise StoreError(f"{path}: not a kline-store manifest")
    if m.get("format_version") != FORMAT_VERSION or type(m.get("format_version")) is not int:
        raise StoreError(f"{path}: format version {m.get('format_version')!r} is not supported "
                         f"(this kline-store reads {FORMAT_VERSION})")
    return m


class _Checker:
    """Type and range checks of one manifest; each failure names the manifest file and the key."""

    def __init__(self, m: dict, path: Path) -> None:
        self.m, self.path = m, path

    def fail(self, key: str, what: str) -> StoreError:
        return StoreError(f"{self.path}: manifest key '{key}': {what}")

    def get(self, obj: dict, key: str, name: str | None = None) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(name or key, "missing")
        return obj[key]

    def int_(self, value: Any, key: str, lo: int = 0, hi: int = _MAX_COUNT) -> int:
        if type(value) is not int:
            raise self.fail(key, f"{_show(value)} is not an integer")
        if not lo <= value <= hi:
            raise self.fail(key, f"{value} is outside {lo}..{hi}")
        return value

    def list_(self, value: Any, key: str, n: int | None = None) -> list:
        if type(value) is not list:
            raise self.fail(key, f"{_show(value)} is not a list")
        if n is not None and len(value) != n:
            raise self.fail(key, f"{len(value)} entries for {n} expected")
        return value

    def names(self, key: str, n: int) -> list[str]:
        """A list of n unique non-empty strings (symbols, fields)."""
        v = self.list_(self.get(self.m, key), key, n)
        if not set(map(type, v)) <= {str} or "" in v:
            bad = next(x for x in v if type(x) is not str or not x)
            raise self.fail(key, f"entry {_show(bad)} is not a non-empty string")
        if len(set(v)) != len(v):
            seen: set[str] = set()
            dup = next(x for x in v if x in seen or seen.add(x))
            raise self.fail(key, f"{dup!r} appears twice")
        return v

    def ints(self, value: Any, key: str, n: int, lo: int, hi: int) -> np.ndarray:
        v = self.list_(value, key, n)
        arr = np.asarray(v, dtype=np.int64) if v and set(map(type, v)) <= {int} and \
            -(1 << 62) < min(v) and max(v) < 1 << 62 else None
        if arr is None or (n and (arr.min() < lo or arr.max() > hi)):
            bad = next(x for x in v if type(x) is not int or not lo <= x <= hi)
            raise self.fail(key, f"entry {_show(bad)} is not an integer in {lo}..{hi}")
        return arr if v else np.zeros(0, dtype=np.int64)

    def freq(self) -> str:
        """The bar size: absent in daily stores written before intraday stores existed."""
        f = self.m.get("freq", "1d")
        if type(f) is not str or not _FREQ.fullmatch(f) or (f != "1d" and 1440 % int(f[:-3])):
            raise self.fail("freq", f"{_show(f)} is not a bar size (1d, or N min dividing a day)")
        return f

    def calendar(self, n: int, freq: str) -> np.ndarray:
        """Dates (daily) or bar stamps (intraday) as canonical ISO strings, valid, strictly increasing, within
        1800..2200; intraday stamps on the bar size's grid."""
        v = self.list_(self.get(self.m, "calendar"), "calendar", n)
        unit = "D" if freq == "1d" else "m"
        if not n:
            return np.zeros(0, dtype=f"datetime64[{unit}]")
        stamps = None
        if set(map(type, v)) <= {str}:
            try:
                stamps = np.array(v, dtype=f"datetime64[{unit}]")
            except ValueError:
                pass
        # numpy also reads "2016-06" or "2016-06-07T00": only the canonical spelling round-trips
        pattern = _ISO_DAY if unit == "D" else _ISO_MINUTE
        if stamps is None or (np.datetime_as_string(stamps, unit=unit) != np.asarray(v)).any():
            bad = next((x for x in v if type(x) is not str or not pattern.fullmatch(x) or not _valid_day(x[:10])),
                       v[0])
            raise self.fail("calendar", f"entry {_show(bad)} is not a "
                                        f"{'YYYY-MM-DD date' if unit == 'D' else 'YYYY-MM-DDTHH:MM time'}")
        days = stamps.astype("datetime64[D]")
        if days[0] < FIRST_DAY or days[-1] > LAST_DAY:
            raise self.fail("calendar", f"dates must lie within {FIRST_DAY}..{LAST_DAY}")
        step = np.diff(stamps.astype(np.int64))
        if (step <= 0).any():
            i = int(np.flatnonzero(step <= 0)[0])
            raise self.fail("calendar", f"not strictly increasing at {v[i]} -> {v[i + 1]}")
        return stamps

    def optional_factors(self, key: str, n: int) -> None:
        """None, or one positive finite number (or None) per symbol."""
        if key not in self.m or self.m[key] is None:
            return
        for x in self.list_(self.m[key], key, n):
            if x is not None and (type(x) not in (int, float) or not math.isfinite(x) or x <= 0):
                raise self.fail(key, f"entry {_show(x)} is not a positive number or null")


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _valid_day(text: str) -> bool:
    try:
        _dt.date.fromisoformat(text)
        return True
    except ValueError:
        return False


def check_manifest(m: dict, path: Path) -> None:
    """Check every value of a parsed manifest for type, range and consistency, then its checksum.

    Raises:
        StoreError: naming ``path`` and the first key that is wrong.
    """
    c = _Checker(m, path)
    if CHECKSUM_KEY in m:
        want = m[CHECKSUM_KEY]
        if type(want) is not str or not re.fullmatch(r"sha256:[0-9a-f]{64}", want):
            raise c.fail(CHECKSUM_KEY, f"{_show(want)} is not a sha256 checksum")
        if content_checksum(m) != want:
            raise c.fail(CHECKSUM_KEY, "does not match the manifest's content (the manifest was changed "
                                       "or damaged)")
    c.int_(c.get(m, "version"), "version", lo=1)
    shape = c.get(m, "shape")
    if type(shape) is not dict:
        raise c.fail("shape", f"{_show(shape)} is not an object")
    n_sym = c.int_(c.get(shape, "n_symbols", "shape.n_symbols"), "shape.n_symbols")
    n_dates = c.int_(c.get(shape, "n_dates", "shape.n_dates"), "shape.n_dates")
    n_fields = c.int_(c.get(shape, "n_fields", "shape.n_fields"), "shape.n_fields", lo=1)
    cap = c.int_(c.get(shape, "date_capacity", "shape.date_capacity"), "shape.date_capacity", lo=n_dates)
    if c.get(m, "dtype") != "float32":
        raise c.fail("dtype", f"{_show(m['dtype'])} is not float32")
    c.names("symbols", n_sym)
    c.names("fields", n_fields)
    freq = c.freq()
    days = c.calendar(n_dates, freq)
    first = c.ints(c.get(m, "first_bar"), "first_bar", n_sym, -1, n_dates - 1)
    last = c.ints(c.get(m, "last_bar"), "last_bar", n_sym, -1, n_dates - 1)
    if ((first < 0) != (last < 0)).any() or (first > last).any():
        i = int(np.flatnonzero(((first < 0) != (last < 0)) | (first > last))[0])
        raise c.fail("first_bar", f"symbol {m['symbols'][i]!r}: first bar {first[i]} after last bar {last[i]}")
    iso = np.datetime_as_string(days, unit="D" if freq == "1d" else "m").tolist() if n_dates else []
    for key, idx in (("first_date", first), ("last_date", last)):
        if key in m and m[key] != [iso[i] if i >= 0 else None for i in idx.tolist()]:
            raise c.fail(key, "disagrees with the calendar and the bar positions")
    c.int_(c.get(m, "n_bars"), "n_bars", hi=min(n_sym * n_dates, _MAX_COUNT))
    data = c.get(m, "data")
    if type(data) is not dict:
        raise c.fail("data", f"{_show(data)} is not an object")
    gen = c.int_(c.get(data, "generation", "data.generation"), "data.generation", lo=1)
    name = c.get(data, "file", "data.file")
    if not safefs.plain_name(name) or not DATA_FILE_RE.fullmatch(name):
        raise c.fail("data.file", f"{_show(name)} is not a data file name (data-gNNNNNN.f32 inside the store)")
    if name != data_file_name(gen):
        raise c.fail("data.file", f"{name} is not the file of generation {gen}")
    rows = c.int_(c.get(data, "rows", "data.rows"), "data.rows", lo=n_sym)
    size = c.int_(c.get(data, "size", "data.size"), "data.size", hi=1 << 60)
    if size != rows * cap * n_fields * 4:
        raise c.fail("data.size", f"{size} differs from rows x date_capacity x n_fields x 4 = "
                                  f"{rows * cap * n_fields * 4}")
    crcs = c.ints(c.get(data, "row_crc32", "data.row_crc32"), "data.row_crc32", rows, 0, (1 << 32) - 1)
    if c.get(data, "checksum", "data.checksum") != file_checksum(crcs.astype(np.uint32)):
        raise c.fail("data.checksum", "does not match the row checksums")
    if m.get("sessions") is not None:
        sess = m["sessions"]
        if freq == "1d" or type(sess) is not dict or type(sess.get("name")) is not str \
                or sess.get("stamp") not in ("end", "start") or type(sess.get("intervals")) is not list \
                or not all(type(i) is list and len(i) == 2 and all(type(x) is str for x in i)
                           for i in sess["intervals"]):
            raise c.fail("sessions", f"{_show(sess)} is not a sessions object of an intraday store")
    sid = m.get(STORE_ID_KEY)
    if sid is not None and (type(sid) is not str or not _STORE_ID.fullmatch(sid)):
        raise c.fail(STORE_ID_KEY, f"{_show(sid)} is not a store id (32 hex digits)")
    for key in ("created_at", "updated_at", "calendar_source", "layout", "timezone"):
        if m.get(key) is not None and type(m[key]) is not str:
            raise c.fail(key, f"{_show(m[key])} is not a string")
    if "sources" in m and (type(m["sources"]) is not list or any(type(s) is not dict for s in m["sources"])):
        raise c.fail("sources", "is not a list of objects")
    if m.get("adj_factor_source") not in FACTOR_SOURCES:
        raise c.fail("adj_factor_source", f"{_show(m['adj_factor_source'])} is not one of input, events, null")
    c.optional_factors("adj_last_factor", n_sym)
    c.optional_factors("adj_rebase", n_sym)
    universes.check(m.get(universes.KEY), m["symbols"], c.fail)


def read_manifest(store_dir: Path, version: int | None = None) -> dict:
    """Read and check the current manifest, or an earlier version's copy. Reads only; never writes.

    A version copy is read only from a real ``versions/`` folder (a symlink there is refused), and only for
    versions up to the current one: a copy of a version that was never committed is not a snapshot.
    """
    store_dir = Path(store_dir)
    if not store_dir.is_dir():
        raise StoreError(f"{store_dir}: no such store")
    current_path = store_dir / MANIFEST
    current: dict | None = None
    if version is None or _exists(current_path):
        try:
            current = _load(current_path)
        except StoreError:
            if version is None:
                raise
            # A damaged current manifest must not hide the older versions' copies.
    if version is None:
        assert current is not None
        return current
    if type(version) is not int or version < 1:
        raise StoreError(f"{store_dir}: version {version!r} is not a version number")
    if current is not None:
        if current["version"] == version:
            return current     # the durable original; its copy may be missing or torn after a crash
        if version > current["version"]:
            raise StoreError(f"{store_dir}: version {version} is not available (the current one is "
                             f"{current['version']})")
    vdir = store_dir / VERSIONS_DIR
    path = vdir / version_file_name(version)
    if not safefs.check_dir(vdir) or not _exists(path):
        raise StoreError(f"{store_dir}: version {version} is not available (removed by gc or never existed)")
    m = _load(path)
    if m["version"] != version:
        raise StoreError(f"{path}: manifest key 'version': {m['version']} in the copy of version {version}")
    return m


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _load(path: Path) -> dict:
    if not _exists(path):
        raise StoreError(f"{path.parent}: not a kline-store store (no {MANIFEST})")
    try:
        raw = safefs.read_entry(path)
    except OSError as exc:
        raise StoreError(f"{path}: manifest is unreadable ({exc.strerror or exc})") from None
    m = parse(raw, path)
    check_manifest(m, path)
    return m
