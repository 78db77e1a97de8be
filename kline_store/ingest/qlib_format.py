"""Qlib provider directories of day bars: the file format, read and written, and nothing else.

The layout Qlib's ``dump_bin.py dump_all`` writes and ``qlib.data.D`` reads::

    DIR/calendars/day.txt                    one date per line, YYYY-MM-DD, ascending: the time axis
    DIR/instruments/<market>.txt             SYMBOL<TAB>first<TAB>last, one line per listing span
    DIR/features/<symbol>/<field>.day.bin    little-endian float32: the first value is the calendar index of
                                             the file's first day (an integer stored as a float), then one value
                                             per calendar day from there; NaN where the symbol has no value

Symbols keep their case in the instruments files (dump_bin writes them upper case); folder and file names are
lower case, and Qlib looks them up lower-cased, so lookups here ignore case the same way. A bin file covers a
symbol's first to last day only: nothing is written outside that span, NaN inside it where a day is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

FREQ = "day"
SUFFIX = f".{FREQ}.bin"
CALENDAR = Path("calendars") / f"{FREQ}.txt"
MAX_INDEX = 1 << 24      # a float32 holds every integer up to 2**24: the start index of a bin file
FIRST_DAY, LAST_DAY = np.datetime64("1800-01-01"), np.datetime64("2200-12-31")   # as ingest's dates.py
# A calendar of 1800..2200 has at most 146,462 days of at most ~30 bytes a line; an instruments file is not
# bigger than a few lines per listing of every symbol there is.
MAX_CALENDAR_BYTES = 146_462 * 32
MAX_LIST_BYTES = 256 << 20
# Windows device names cannot be folder names; Qlib writes them with this prefix (and strips it back).
DEVICE_NAMES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
DEVICE_PREFIX = "_qlib_"
FIELD_RE = re.compile(r"\w+")    # what Qlib's expressions accept after '$'


def is_provider(path: Path) -> bool:
    """True when ``path`` is a folder laid out as a Qlib provider directory (calendars/ and features/)."""
    return path.is_dir() and (path / "calendars").is_dir() and (path / "features").is_dir()


def plain_symbol(symbol: str) -> bool:
    """An instrument name that is one folder name: no separator, no ``..``, no NUL, not ``.``."""
    return bool(symbol) and symbol not in (".", "..") and ".." not in symbol and \
        not any(ch in symbol for ch in "/\\\0")


def folder_name(symbol: str) -> str:
    """The folder of a symbol's features: its name lower-cased (device names prefixed, as Qlib does)."""
    name = DEVICE_PREFIX + symbol if symbol.upper() in DEVICE_NAMES else symbol
    return name.lower()


@dataclass
class InstrumentLine:
    """One line of an instruments file: a symbol listed from ``first`` to ``last`` (dates), on line ``line``."""

    symbol: str
    first: np.datetime64
    last: np.datetime64
    line: int = 0


# --------------------------------------------------------------------------- reading


def read_calendar(root: Path) -> np.ndarray:
    """``calendars/day.txt`` as datetime64[D], checked: one date per line, strictly increasing."""
    path = root / CALENDAR
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError(f"{path}: not a regular file (a link, a FIFO or a folder); a calendar is a text file")
    if not path.is_file():
        found = sorted(p.name for p in (root / "calendars").glob("*.txt"))
        raise InputError(f"{root}: a Qlib provider directory without {CALENDAR} (found: {', '.join(found) or 'none'});"
                         f" only day bars are read")
    lines = _lines(path, MAX_CALENDAR_BYTES)
    try:
        stamps = np.array([t.replace(" ", "T") for _, t in lines], dtype="datetime64[s]")
        days = stamps.astype("datetime64[D]")
        ok = not np.isnat(days).any() and bool((days == stamps).all())
    except ValueError:
        ok = False
    if not ok:                       # name the first bad line
        days = np.array([_day(t, path, n) for n, t in lines], dtype="datetime64[D]")
    if len(days) == 0:
        raise InputError(f"{path}: the calendar is empty")
    back = np.flatnonzero(days[1:] <= days[:-1])
    if len(back):
        n = lines[int(back[0]) + 1][0]
        raise InputError(f"{path}: line {n}: {days[back[0] + 1]} does not come after {days[back[0]]} "
                         f"(a calendar is strictly increasing)")
    out = np.flatnonzero((days < FIRST_DAY) | (days > LAST_DAY))
    if len(out):
        raise InputError(f"{path}: line {lines[int(out[0])][0]}: {days[out[0]]} is outside {FIRST_DAY}..{LAST_DAY}")
    return days


def instruments_file(root: Path, instruments: str) -> Path:
    """``all``, ``csi300``, ...: ``instruments/<name>.txt`` of the directory; anything else: a file path."""
    own = root / "instruments" / f"{instruments}.txt"
    if os.sep not in instruments and own.is_file():
        return own
    path = Path(instruments)
    if path.is_file():
        return path
    found = sorted(p.stem for p in (root / "instruments").glob("*.txt"))
    raise InputError(f"--instruments {instruments!r}: no {own} and no such file (markets in {root}: "
                     f"{', '.join(found) or 'none'})")


def read_instruments(path: Path) -> list[InstrumentLine]:
    """Every line of an instruments file: ``SYMBOL<TAB>first<TAB>last``; a symbol may have several spans."""
    out = []
    for n, text in _lines(path, MAX_LIST_BYTES):
        parts = text.split("\t")
        if len(parts) < 3 or not parts[0].strip():
            raise InputError(f"{path}: line {n}: expected SYMBOL<TAB>first<TAB>last, got {text[:60]!r}")
        if not plain_symbol(parts[0].strip()):
            raise InputError(f"{path}: line {n}: instrument {parts[0].strip()[:60]!r} is not a plain name (no '/', "
                             f"'\\', '..' or NUL): it would name a folder outside features/")
        out.append(InstrumentLine(parts[0].strip(), _day(parts[1], path, n), _day(parts[2], path, n), n))
    if not out:
        raise InputError(f"{path}: no instrument listed")
    return out


def symbol_fields(root: Path, symbol: str) -> dict[str, Path]:
    """Field name -> bin file of one symbol (day files only); empty when the symbol has no folder."""
    if not plain_symbol(symbol):
        raise InputError(f"instrument {symbol[:60]!r} is not a plain name: it would name a folder outside features/")
    folder = root / "features" / folder_name(symbol)
    if folder.is_symlink():
        raise InputError(f"{folder}: a link; the features of an instrument are a folder inside the directory")
    if not folder.is_dir():
        return {}
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name.endswith(SUFFIX) and len(p.name) > len(SUFFIX):
            if p.is_symlink() or not p.is_file():   # a link, folder or FIFO where a field's values should be
                raise InputError(f"{p}: not a file (a Qlib feature file holds the field's float32 values)")
            out[p.name[: -len(SUFFIX)]] = p
    return out


def read_bin(path: Path, n_days: int) -> tuple[int, np.ndarray]:
    """One bin file: (calendar index of its first value, float32 values); checked against the calendar."""
    # Sized from fstat against the calendar before its values are read: a sparse 40 GiB file is refused at once.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file (a Qlib feature file holds the field's float32 values)")
        size = info.st_size
        if size % 4:
            raise InputError(f"{path}: {size} bytes is not a whole number of float32 values (a cut file?)")
        if size == 0:
            raise InputError(f"{path}: empty file (a bin file holds its start index first)")
        if size // 4 - 1 > n_days:
            raise InputError(f"{path}: {size} bytes hold {size // 4 - 1} values, more than the calendar's "
                             f"{n_days} days")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = np.frombuffer(fh.read(size), dtype="<f4")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(raw) * 4 != size:
        raise InputError(f"{path}: changed while it was read ({len(raw) * 4} of {size} bytes)")
    start = float(raw[0])
    if not (np.isfinite(start) and start == int(start) and 0 <= start < MAX_INDEX):
        raise InputError(f"{path}: start index {start!r} is not a calendar index")
    start = int(start)
    values = raw[1:].astype(np.float32)
    if start + len(values) > n_days:
        raise InputError(f"{path}: {len(values)} values from calendar index {start} run past the calendar's "
                         f"{n_days} days")
    return start, values


def read_symbol(files: dict[str, Path], fields: list[str], n_days: int) -> tuple[int, np.ndarray]:
    """A symbol's values as one block: (first calendar index, [days, len(fields)] float32).

    Args:
        files: the symbol's bin files (:func:`symbol_fields`).
        fields: the block's fields, in order; NaN for those without a file.
        n_days: the calendar's length (a file running past it is an error).

    The block spans the union of the files' spans; NaN where a field has no value.
    """
    got = {f: read_bin(files[f], n_days) for f in fields if f in files}
    got = {f: (s, v) for f, (s, v) in got.items() if len(v)}
    if not got:
        return 0, np.empty((0, len(fields)), dtype=np.float32)
    lo = min(s for s, _ in got.values())
    hi = max(s + len(v) for s, v in got.values())
    block = np.full((hi - lo, len(fields)), np.nan, dtype=np.float32)
    for j, f in enumerate(fields):
        if f in got:
            s, v = got[f]
            block[s - lo: s - lo + len(v), j] = v
    return lo, block


def _lines(path: Path, limit: int) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a small text file (Qlib's readers skip blank ones): a
    regular file (no link, no FIFO) of at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InputError(f"{path}: not a regular file (a link, a FIFO or a folder)")
            if info.st_size > limit:
                raise InputError(f"{path}: {info.st_size} bytes, more than a Qlib list of days or instruments "
                                 f"holds ({limit} at most)")
            with os.fdopen(os.dup(fd), "rb") as fh:
                text = fh.read(limit + 1).decode("utf-8")
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    return [(i + 1, s.strip()) for i, s in enumerate(text.splitlines()) if s.strip()]


def parse_day(text: str) -> tuple[np.datetime64, bool]:
    """``2020-01-02`` (or ``2020-01-02 00:00:00``) -> (the day, whether a time of day other than midnight was
    given); NaT when the text is not a date. The callers word the error for their file."""
    try:
        stamp = np.datetime64(text.strip().replace(" ", "T"), "s")
    except ValueError:
        return np.datetime64("NaT", "D"), False
    day = stamp.astype("datetime64[D]")
    return day, not np.isnat(stamp) and day != stamp


def _day(text: str, path: Path, line: int) -> np.datetime64:
    """A day of a Qlib text file; not a date, or a time of day other than midnight, is an error."""
    text = text.strip()
    day, timed = parse_day(text)
    if np.isnat(day):
        raise InputError(f"{path}: line {line}: {text[:40]!r} is not a date (YYYY-MM-DD)")
    if timed:
        raise InputError(f"{path}: line {line}: {text!r} has a time of day; only day bars are read")
    return day


# --------------------------------------------------------------------------- writing


def check_names(symbols: list[str], fields: list[str]) -> None:
    """Refuse names a provider directory cannot hold: path separators, tabs, line ends, names that differ only
    in case (Qlib lower-cases folder and file names), fields that are not words (Qlib's ``$field``)."""
    for s in symbols:
        if not s or s in (".", "..") or any(ch in s for ch in "/\\\t\n\r\0"):
            raise InputError(f"symbol {s!r} cannot be a Qlib instrument (a folder name without '/', tabs "
                             f"or line ends)")
        if len(folder_name(s).encode("utf-8")) > 255:
            raise InputError(f"symbol {s[:40]!r}... ({len(s)} characters) cannot be a Qlib instrument: its folder "
                             f"name is longer than a file system allows (255 bytes)")
    seen: dict[str, str] = {}
    for s in symbols:
        other = seen.setdefault(folder_name(s), s)
        if other != s:
            why = "differ only in case" if other.lower() == s.lower() else \
                f"name the same folder (Qlib writes device names such as {other.upper()!r} with {DEVICE_PREFIX!r})"
            raise InputError(f"symbols {other!r} and {s!r} {why}; Qlib stores both in features/{folder_name(s)}/")
    taken: dict[str, str] = {}
    for f in fields:
        other = taken.setdefault(f.lower(), f)
        if not FIELD_RE.fullmatch(f) or other != f:
            raise InputError(f"field {f!r} cannot be a Qlib feature (letters, digits and '_' only; Qlib "
                             f"lower-cases file names)")


def remove_stale(folder: Path, prefix: str) -> None:
    """Remove ``PREFIX<pid>`` entries of ``folder`` whose process is gone (a killed export's leftovers)."""
    for p in folder.glob(glob_escape(prefix) + "*"):
        pid = p.name[len(prefix):]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue                 # alive (or not ours to signal): its writer may still be working
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


class ProviderWriter:
    """Writes a provider directory into a temporary sibling folder and renames it into place at the end.

    Args:
        out: the directory to create; it must not exist, or be an empty folder.
        calendar: the days (datetime64[D]) every bin file's start index refers to.
        fields: the field names, one bin file each per symbol.
    """

    def __init__(self, out: Path, calendar: np.ndarray, fields: list[str]) -> None:
        if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
            raise InputError(f"{out}: exists and is not an empty folder; give a new directory")
        if not out.parent.is_dir():
            raise InputError(f"{out}: folder {out.parent} does not exist")
        self.out, self.calendar, self.fields = out, calendar, fields
        self.tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        remove_stale(out.parent, f".{out.name}.tmp-")
        self.spans: list[tuple[str, int, int]] = []
        try:
            for sub in ("calendars", "instruments", "features"):
                (self.tmp / sub).mkdir(parents=True)
            text = "".join(f"{d}\n" for d in calendar.astype("datetime64[D]").astype(str))
            (self.tmp / CALENDAR).write_text(text, encoding="utf-8")
        except OSError as exc:
            self.abort()
            raise InputError(f"{out}: cannot write ({exc.strerror or exc})") from None

    def add(self, symbol: str, first: int, values: np.ndarray) -> None:
        """One symbol: ``values`` [days, fields] from calendar index ``first`` to its last day (NaN inside)."""
        folder = self.tmp / "features" / folder_name(symbol)
        folder.mkdir()
        head = np.float32(first)
        for j, f in enumerate(self.fields):
            with open(folder / f"{f.lower()}{SUFFIX}", "wb") as fh:
                fh.write(head.astype("<f4").tobytes())
                fh.write(np.ascontiguousarray(values[:, j], dtype="<f4").tobytes())
        self.spans.append((symbol, first, first + len(values) - 1))

    def market(self, name: str, spans: list[tuple[str, str, str]]) -> None:
        """``instruments/<name>.txt``: a ``SYMBOL<TAB>first<TAB>last`` line per span (a universe: Qlib's market)."""
        text = "".join(f"{s}\t{a}\t{b}\n" for s, a, b in spans)
        (self.tmp / "instruments" / f"{name}.txt").write_text(text, encoding="utf-8")

    def finish(self) -> None:
        """Write ``instruments/all.txt`` and move the directory into place."""
        days = self.calendar.astype("datetime64[D]").astype(str)
        text = "".join(f"{s}\t{days[a]}\t{days[b]}\n" for s, a, b in self.spans)
        (self.tmp / "instruments" / "all.txt").write_text(text, encoding="utf-8")
        if self.out.is_dir():
            self.out.rmdir()            # checked empty at the start
        os.replace(self.tmp, self.out)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
