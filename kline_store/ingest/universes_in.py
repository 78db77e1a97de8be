"""Universes in: membership spans from a Qlib instruments file, a CSV/Parquet table or a DataFrame, checked and
stored as a new store version (``ks.set_universe``, ``kline-store universe STORE NAME FILE``).

Sources, each a list of (symbol, first day, last day) memberships:

* a Qlib instruments file (``SYMBOL<TAB>first<TAB>last``, no header, as ``instruments/csi300.txt``);
* a CSV (or TSV) or Parquet table, or a pandas/polars DataFrame, with columns ``symbol``, ``start``, ``end``
  (also ``instrument``; ``start_date``/``end_date``, ``start_datetime``/``end_datetime``); an empty ``end`` is a
  span still open.

Every line is checked: a symbol the store does not have, a first day after the last, two spans of one symbol that
overlap are one line naming the source, the line (or row) and the symbol; nothing is written. A span that ends on
the store's last day is taken as open (Qlib's collectors write the data's last day for today's members): it grows
with appended days, and the summary says how many. The universe is written as a new store version under the
writer lock (the data file is shared; only the manifest changes), atomically, like an append.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import from_frames, qlib_format
from .inputs import is_parquet, location
from ..errors import InputError
from ..store import collect, edit_manifest, lock, manifest as mf, prepare, universes
from ..store.snapshot import open_store

SYMBOL = ("symbol", "instrument", "code", "ticker")
START = ("start", "start_date", "start_datetime", "first")
END = ("end", "end_date", "end_datetime", "last")


@dataclass(frozen=True)
class Listing:
    """One membership of a source: ``symbol`` from ``start`` to ``end`` (None: open), read at ``where``."""

    symbol: str
    start: np.datetime64
    end: np.datetime64 | None
    where: str


# --------------------------------------------------------------------------- reading


def read_source(source: Any) -> tuple[list[Listing], str]:
    """The memberships of ``source`` (a path or a DataFrame) and how to name it in the manifest."""
    if from_frames.is_frame(source):
        table = from_frames.to_polars(source)
        return _from_table(table, from_frames.LABEL, lambda i: f"row {i + 1}"), from_frames.LABEL
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(f"universe source {from_frames.describe(source)}: expected a file (Qlib instruments file, "
                         f"CSV or Parquet of symbol, start, end) or a DataFrame")
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a file (a Qlib instruments file, or a CSV or Parquet of symbol, start, end)")
    import polars as pl

    if is_parquet(path):
        try:
            table = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise InputError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())[:160]})") from None
        return _from_table(table, str(path), lambda i: location(path, i)), str(path)
    head = _first_line(path)
    if _is_qlib_line(head):
        return [Listing(s.symbol, s.first, s.last, f"{path}: line {s.line}")
                for s in qlib_format.read_instruments(path)], str(path)
    sep = "\t" if "\t" in head else ","
    try:
        table = pl.read_csv(path, separator=sep, infer_schema=False)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV ({' '.join(str(exc).split())[:160]})") from None
    return _from_table(table, str(path), lambda i: location(path, i)), str(path)


def _first_line(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(4096)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff")
    return next((line for line in text.splitlines() if line.strip()), "")


def _is_qlib_line(line: str) -> bool:
    """``SH600000<TAB>2005-01-04<TAB>2020-09-25``: a Qlib instruments line (no header, dates after the symbol)."""
    parts = line.split("\t")
    if len(parts) < 3 or parts[0].strip().lower() in SYMBOL:
        return False
    try:
        np.datetime64(parts[1].strip().replace(" ", "T"), "s")
        return True
    except ValueError:
        return False


def _column(table: Any, names: tuple[str, ...], where: str, required: bool = True) -> str | None:
    found = [c for c in table.columns if str(c).strip().lower() in names]
    if len(found) > 1:
        raise InputError(f"{where}: columns {found[0]!r} and {found[1]!r} both name the {names[0]} of a span")
    if not found and required:
        raise InputError(f"{where}: no {names[0]} column; columns found: {', '.join(map(str, table.columns[:8]))}; "
                         f"a universe table has symbol, start, end (or a Qlib instruments file: "
                         f"SYMBOL<TAB>first<TAB>last)")
    return found[0] if found else None


def _from_table(table: Any, where: str, at: Any) -> list[Listing]:
    """Listings from a table with symbol, start and end columns (strings, dates, datetimes or YYYYMMDD numbers)."""
    sym_col = _column(table, SYMBOL, where)
    start_col = _column(table, START, where)
    end_col = _column(table, END, where)
    if table.height == 0:
        raise InputError(f"{where}: no span listed")
    import polars as pl

    syms = table[sym_col].cast(pl.String, strict=False).to_list()
    starts = _days(table[start_col], where, at, "start")
    ends = _days(table[end_col], where, at, "end")
    out = []
    for i, (s, a, b) in enumerate(zip(syms, starts, ends)):
        if s is None or not str(s).strip():
            raise InputError(f"{where}: {at(i)}: no symbol")
        if a is None:
            raise InputError(f"{where}: {at(i)}: {str(s).strip()}: no start date")
        out.append(Listing(str(s).strip(), a, b, f"{where}: {at(i)}"))
    return out


def _days(col: Any, where: str, at: Any, what: str) -> list[np.datetime64 | None]:
    """A column of days: dates or datetimes at midnight, ``YYYY-MM-DD`` (a midnight time allowed), ``YYYYMMDD``;
    empty cells None."""
    import polars as pl

    dtype = col.dtype
    if dtype == pl.Date:
        return [None if v is None else np.datetime64(v, "D") for v in col.to_list()]
    if dtype.is_temporal():
        stamps = col.cast(pl.Datetime("ms")).to_numpy()
        out = []
        for i, v in enumerate(stamps):
            if np.isnat(v):
                out.append(None)
                continue
            d = v.astype("datetime64[D]")
            if d != v:
                raise InputError(f"{where}: {at(i)}: {what} {v} has a time of day; a span is whole days")
            out.append(d)
        return out
    out = []
    for i, v in enumerate(col.cast(pl.String, strict=False).to_list()):
        text = "" if v is None else str(v).strip()
        if not text or text.lower() in ("nan", "nat", "none", "null"):
            out.append(None)
            continue
        if len(text) == 8 and text.isdigit():
            text = f"{text[:4]}-{text[4:6]}-{text[6:]}"
        elif text.endswith(".0") and len(text) == 10 and text[:8].isdigit():   # 20200102.0: a float column
            text = f"{text[:4]}-{text[4:6]}-{text[6:8]}"
        day, timed = qlib_format.parse_day(text)
        if np.isnat(day):
            raise InputError(f"{where}: {at(i)}: {what} {text[:40]!r} is not a date (YYYY-MM-DD)")
        if timed:
            raise InputError(f"{where}: {at(i)}: {what} {text[:40]!r} has a time of day; a span is whole days")
        out.append(day)
    return out


# --------------------------------------------------------------------------- checking


@dataclass
class Checked:
    """Spans ready for the manifest, and what the summary says of them."""

    spans: universes.Spans
    opened: int            # spans ending on the store's last day, kept open
    unknown: list[str]     # symbols left out (only when the caller allows it)


def to_spans(listings: list[Listing], symbols: list[str], last_day: np.datetime64 | None, *,
             fold_case: bool = False, leave_out: frozenset[str] = frozenset(), allow_unknown: bool = False
             ) -> Checked:
    """Check memberships against a store's symbols; spans per store symbol, ascending.

    Args:
        listings: the source's memberships.
        symbols: the store's symbols.
        last_day: the store's last trading day: a span ending there is kept open (None: none is).
        fold_case: match symbols ignoring case (Qlib looks instruments up lower-cased).
        leave_out: symbols (as the source spells them) to skip silently (already reported by the caller).
        allow_unknown: collect symbols the store lacks instead of refusing them.

    Raises:
        InputError: naming the source, the line and the symbol: an unknown symbol, a start after its end, two
            overlapping spans of one symbol.
    """
    index = {(s.lower() if fold_case else s): s for s in symbols}
    lower = {s.lower(): s for s in symbols}
    per: dict[str, list[Listing]] = {}
    unknown: list[str] = []
    for item in listings:
        if item.symbol in leave_out:
            continue
        sym = index.get(item.symbol.lower() if fold_case else item.symbol)
        if sym is None:
            if allow_unknown:
                unknown.append(item.symbol)
                continue
            hint = f" (the store spells it {lower[item.symbol.lower()]!r})" if item.symbol.lower() in lower else ""
            raise InputError(f"{item.where}: symbol {item.symbol!r} is not in the store{hint}")
        if item.end is not None and item.end < item.start:
            raise InputError(f"{item.where}: {item.symbol}: starts {item.start} after it ends {item.end}")
        per.setdefault(sym, []).append(item)
    spans: universes.Spans = {}
    opened = 0
    for sym, items in per.items():
        items.sort(key=lambda x: x.start)
        for prev, cur in zip(items, items[1:]):
            if prev.end is None or cur.start <= prev.end:
                raise InputError(f"{cur.where}: {cur.symbol}: span {cur.start}..{cur.end or 'open'} overlaps its "
                                 f"span {prev.start}..{prev.end or 'open'} ({prev.where})")
        out = []
        for item in items:
            end = item.end
            if last_day is not None and end is not None and end == last_day:
                end, opened = None, opened + 1
            out.append((item.start, end))
        spans[sym] = out
    return Checked(spans, opened, sorted(set(unknown)))


# --------------------------------------------------------------------------- writing


@dataclass
class UniverseReport:
    """What ``set_universe`` did."""

    store: Path
    name: str
    version: int
    removed: bool = False
    unchanged: bool = False
    symbols: int = 0
    spans: int = 0
    members_last_day: int = 0
    last_day: str | None = None
    opened: int = 0
    source: str = ""

    def lines(self) -> list[str]:
        if self.removed:
            return [f"store {self.store} (version {self.version}): universe {self.name} removed"]
        what = "unchanged" if self.unchanged else "stored"
        out = [f"store {self.store} (version {self.version}): universe {self.name} {what}: "
               f"{_count(self.symbols, 'symbol')}, {_count(self.spans, 'span')} from {self.source}; "
               f"{_count(self.members_last_day, 'member')} on {self.last_day}"]
        if self.opened:
            out.append(f"note {self.opened} span(s) end on the store's last day {self.last_day}: kept open (they grow "
                       f"with appended days)")
        return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def set_universe(store: str | os.PathLike, name: str, source: Any, *, wait: float = 0.0) -> UniverseReport:
    """Store universe ``name`` (membership spans) in ``store`` as a new version; ``source=None`` removes it.

    Args:
        store: the store directory.
        name: the universe's name (lower case, as Qlib's ``instruments/NAME.txt``).
        source: a Qlib instruments file, a CSV/Parquet file of ``symbol, start, end``, or a DataFrame of them;
            None to remove the universe.
        wait: seconds to wait for another writer's lock.

    Raises:
        InputError: a bad name or source (one line naming the file, the line and the symbol); nothing written.
        StoreError: not a store, or one that cannot be written.
    """
    universes.check_name(name)
    store_dir = Path(store)
    mf.read_manifest(store_dir)                  # a clear error before reading the source
    listings, described = read_source(source) if source is not None else ([], "")
    with lock.WriterLock(store_dir, wait=wait):
        with open_store(store_dir, verify=False) as st:
            prepare(store_dir, st.manifest)
            m = st.manifest
            days = st.calendar_days()
            last = np.datetime64(int(days[-1]), "D") if len(days) else None
            if source is None:
                if name not in (m.get(universes.KEY) or {}):
                    raise InputError(f"{store_dir}: no universe {name!r} to remove; its universes: "
                                     f"{', '.join(st.universes) or 'none'}")
                entry, checked = None, None
            else:
                checked = to_spans(listings, st.symbols, last)
                entry = universes.encode(checked.spans, described)
            unchanged = entry is not None and (m.get(universes.KEY) or {}).get(name) == entry
            if not unchanged:
                m = edit_manifest(store_dir, m, {universes.KEY: universes.replaced(m, name, entry) or None},
                                  crash="universe")
        if not unchanged:
            collect(store_dir, m)
    if checked is None:
        return UniverseReport(store_dir, name, m["version"], removed=True)
    summary = universes.Universe.of(m, name, days).summary()
    return UniverseReport(store_dir, name, m["version"], unchanged=unchanged, symbols=len(checked.spans),
                          spans=sum(map(len, checked.spans.values())), members_last_day=summary["members_last_day"],
                          last_day=str(last) if last is not None else None, opened=checked.opened, source=described)


__all__ = ["Checked", "Listing", "UniverseReport", "read_source", "set_universe", "to_spans"]
