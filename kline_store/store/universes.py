"""Universes: named sets of symbols with membership dates (an index's constituents over time), kept in the manifest.

A universe is, per symbol, a list of membership spans: first and last day, inclusive; several spans per symbol
(a stock that leaves an index and comes back); the last one may be open (no last day: a member until further
notice, growing with appended days). In the manifest::

    "universes": {"csi300": {"source": "...", "spans": {"SH600000": [["2005-01-04", "2020-09-25"],
                                                                      ["2021-01-04", null]], ...}}}

Spans are dates, not calendar positions, so an append (new days, new symbols: old symbols keep their row) leaves
them as they are and an open span covers the new days by itself. They are checked like every other manifest value
(``check``): a universe read back from disk is untrusted input. ``Universe`` is a universe on one store's calendar:
spans as calendar positions, membership of cells, masks of rows and days, without a ``[symbols, dates]`` array
(a store bigger than memory has billions of cells).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

KEY = "universes"
NAME_RE = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
RESERVED = ("all",)           # Qlib's all.txt: every symbol from its first to its last bar (a store's own symbols)
FIRST_DAY, LAST_DAY = np.datetime64("1800-01-01", "D"), np.datetime64("2200-12-31", "D")
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")

Day = np.datetime64
Spans = dict[str, list[tuple[Day, Day | None]]]      # symbol -> [(first day, last day or None: open)]


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a universe (None when it can): it becomes Qlib's ``instruments/NAME.txt``, which
    Qlib reads lower-cased, and ``all`` is every symbol of a store."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return (f"{name!r} is not a universe name (lower-case letters, digits, '_' and '-', up to 64 characters, "
                f"as Qlib's instruments/NAME.txt)")
    if name in RESERVED:
        return f"{name!r} is every symbol of a store (Qlib's all.txt), not a universe of its own"
    return None


def check_name(name: object) -> str:
    """``name`` as a universe name, or a one-line InputError."""
    why = name_problem(name)
    if why:
        raise InputError(f"universe {why}")
    return name  # type: ignore[return-value]


def _day(text: object) -> Day | None:
    if type(text) is not str or not _ISO_DAY.fullmatch(text):
        return None
    try:
        d = np.datetime64(text, "D")
    except ValueError:
        return None
    return d if FIRST_DAY <= d <= LAST_DAY and str(d) == text else None


def check(value: Any, symbols: Sequence[str], fail: Callable[[str, str], Exception]) -> None:
    """Schema check of a manifest's ``universes`` (None or absent: none): names, symbols of the store, spans of
    canonical dates in 1800..2200, first <= last, ascending and not overlapping, an open span only last.
    ``fail(key, what)`` makes the exception naming the manifest and the key."""
    if value is None:
        return
    if type(value) is not dict:
        raise fail(KEY, "is not an object of universes")
    known = set(symbols)
    for name, entry in value.items():
        key = f"{KEY}.{name}"
        why = name_problem(name)
        if why:
            raise fail(key, why)
        if type(entry) is not dict or type(entry.get("spans")) is not dict:
            raise fail(key, "is not a universe (an object with 'spans')")
        if entry.get("source") is not None and type(entry["source"]) is not str:
            raise fail(f"{key}.source", "is not a string")
        for sym, spans in entry["spans"].items():
            where = f"{key}.spans.{sym}"
            if sym not in known:
                raise fail(where, "names no symbol of the store")
            if type(spans) is not list or not spans:
                raise fail(where, "is not a non-empty list of [first, last] spans")
            prev: Day | None = None
            for i, span in enumerate(spans):
                if type(span) is not list or len(span) != 2:
                    raise fail(f"{where}[{i}]", "is not a [first, last] span")
                a, b = _day(span[0]), (None if span[1] is None else _day(span[1]))
                if a is None or (span[1] is not None and b is None):
                    raise fail(f"{where}[{i}]", f"{span!r} is not a span of YYYY-MM-DD dates within "
                                                f"{FIRST_DAY}..{LAST_DAY} (last: a date or null)")
                if b is not None and b < a:
                    raise fail(f"{where}[{i}]", f"starts {a} after it ends {b}")
                if i and (prev is None or a <= prev):
                    raise fail(f"{where}[{i}]", "overlaps or precedes the span before it (spans ascend, apart)")
                prev = b


def encode(spans: Spans, source: str | None = None) -> dict:
    """One universe's manifest value, spans sorted by symbol then first day."""
    out = {s: [[str(a), None if b is None else str(b)] for a, b in sorted(v, key=lambda ab: ab[0])]
           for s, v in sorted(spans.items()) if v}
    return {"source": source, "spans": out} if source is not None else {"spans": out}


def decode(entry: Mapping[str, Any]) -> Spans:
    """A (checked) manifest value back to spans."""
    return {s: [(np.datetime64(a, "D"), None if b is None else np.datetime64(b, "D")) for a, b in v]
            for s, v in entry["spans"].items()}


def names(m: Mapping[str, Any]) -> list[str]:
    """The universes a manifest holds, sorted."""
    return sorted(m.get(KEY) or {})


def carried(m: Mapping[str, Any]) -> dict:
    """What a later version of a store, or a store derived from it, keeps of its universes (as manifest keys)."""
    return {KEY: m[KEY]} if m.get(KEY) else {}


def replaced(m: Mapping[str, Any], name: str, entry: dict | None) -> dict:
    """The manifest's universes with ``name`` set to ``entry`` (None: removed)."""
    out = dict(m.get(KEY) or {})
    if entry is None:
        out.pop(name, None)
    else:
        out[name] = entry
    return out


@dataclass(frozen=True)
class Universe:
    """A universe on one store's calendar: each span as calendar positions ``[start, end]`` (inclusive) of row
    ``rows``, sorted by row then start, spans with no calendar day left out. Small: O(spans), picklable.

    Attributes:
        name: the universe's name.
        rows, start, end: int64 arrays, one entry per span.
        n_symbols, n_dates: the store's shape (flat cells are ``row * n_dates + t``).
        digest: a hash of the spans on this calendar (a cache key).
    """

    name: str
    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    n_symbols: int
    n_dates: int
    digest: str

    @classmethod
    def of(cls, m: Mapping[str, Any], name: str, days: np.ndarray, path: object = "store") -> Universe:
        """Universe ``name`` of manifest ``m`` on the calendar whose trading day (days since 1970, ascending) of
        each entry is ``days``; a one-line InputError naming the universes there are when it has none such."""
        entries = m.get(KEY) or {}
        if not isinstance(name, str) or name not in entries:
            have = ", ".join(sorted(entries)) or "none (add one with `kline-store universe STORE NAME FILE`)"
            raise InputError(f"{path}: no universe {name!r}; its universes: {have}")
        index = {s: i for i, s in enumerate(m["symbols"])}
        rows, first, last = [], [], []
        for sym, spans in entries[name]["spans"].items():
            for a, b in spans:
                rows.append(index[sym])
                first.append(int(np.datetime64(a, "D").astype(np.int64)))
                last.append(int(np.datetime64(b, "D").astype(np.int64)) if b is not None else 1 << 40)
        days = np.asarray(days, dtype=np.int64)
        r = np.asarray(rows, dtype=np.int64)
        start = np.searchsorted(days, np.asarray(first, dtype=np.int64), side="left")
        end = np.searchsorted(days, np.asarray(last, dtype=np.int64), side="right") - 1
        keep = start <= end                                   # a span between two trading days covers none
        r, start, end = r[keep], start[keep], end[keep]
        order = np.lexsort((start, r))
        r, start, end = r[order], start[order].astype(np.int64), end[order].astype(np.int64)
        digest = hashlib.sha256(json.dumps([name, len(days), r.tolist(), start.tolist(), end.tolist()])
                                .encode()).hexdigest()[:16]
        return cls(name, r, start, end, len(m["symbols"]), len(days), digest)

    def contains(self, flat: np.ndarray) -> np.ndarray:
        """For flat cells ``row * n_dates + t``: True where the symbol is a member on day t."""
        flat = np.asarray(flat, dtype=np.int64)
        if not len(self.rows):
            return np.zeros(flat.shape, dtype=bool)
        first = self.rows * self.n_dates + self.start
        i = np.searchsorted(first, flat, side="right") - 1     # the last span starting at or before the cell
        last = (self.rows * self.n_dates + self.end)[np.maximum(i, 0)]
        return (i >= 0) & (flat <= last)                     # spans never cross a row: last < the next row

    def mask(self, rows: np.ndarray | slice | None = None, d0: int = 0, d1: int | None = None) -> np.ndarray:
        """bool ``[len(rows), d1 - d0]``: membership of those rows (all when None; a slice or row numbers) on
        calendar days ``d0 .. d1 - 1``."""
        d1 = self.n_dates if d1 is None else d1
        if rows is None:
            rows = np.arange(self.n_symbols, dtype=np.int64)
        elif isinstance(rows, slice):
            rows = np.arange(self.n_symbols, dtype=np.int64)[rows]
        rows = np.asarray(rows, dtype=np.int64)
        width = max(0, d1 - d0)
        where = np.full(self.n_symbols, -1, dtype=np.int64)
        where[rows] = np.arange(len(rows))
        pos = where[self.rows] if len(self.rows) else np.zeros(0, np.int64)
        a, b = np.maximum(self.start, d0), np.minimum(self.end, d1 - 1)
        sel = (pos >= 0) & (a <= b)
        # +1 at a span's first day, -1 after its last; spans of a row never overlap, so the sums are 0 or 1
        step = np.zeros((len(rows), width + 1), dtype=np.int8)
        np.add.at(step, (pos[sel], a[sel] - d0), 1)
        np.add.at(step, (pos[sel], b[sel] - d0 + 1), -1)
        return np.cumsum(step[:, :width], axis=1, dtype=np.int8) > 0

    def dense(self) -> np.ndarray:
        """bool ``[n_symbols, n_dates]``: True on the days a symbol is a member."""
        return self.mask()

    def summary(self) -> dict:
        """Symbols with a member day on the calendar, members on its last day, spans on the calendar."""
        last = self.n_dates - 1
        return {"symbols": int(len(np.unique(self.rows))), "spans": int(len(self.rows)),
                "members_last_day": int(np.count_nonzero((self.start <= last) & (self.end >= last)))}


def from_spans(spans: Spans, symbols: Sequence[str], days: np.ndarray, name: str = "universe") -> Universe:
    """A Universe straight from spans (tests, callers holding spans)."""
    m = {"symbols": list(symbols), KEY: {name: encode(spans)}}
    return Universe.of(m, name, days)

