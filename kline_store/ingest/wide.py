"""Files that hold prices but not in the long shape of bars: told apart from ticks and refused or read clearly.

* A long file of one price per symbol and date (``symbol,date,price``: monthly closes, FRED-like series) is
  close-only bars, read with that column as the close and said so; a price column whose stamps carry a time of
  day stays "ticks" (one price per trade).
* A wide file (``date,BTC:open,BTC:close,ETH:open,...``: one column per symbol and field) is refused in one
  line that shows the reshape to long (symbol, date, fields), in pandas, that the user runs once.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from .columns import ALIASES, BASE_FIELDS, normalise
from ..errors import InputError

PRICE_NAMES = frozenset({"price", "last", "last_price", "trade_price", "lastprice", "px", "px_last", "value"})
_PAIR = re.compile(r"^(?P<sym>[^:|/]+?)\s*[:|/]\s*(?P<field>[^:|/]+)$")
_CLOCK = r"\d{1,2}:\d{2}"


def price_column(columns: list[str]) -> str | None:
    """The one price column of a file without open, high, low or close (None when there is none or several)."""
    keys = {normalise(c) for c in columns}
    if keys & {"open", "high", "low", "bid", "ask"}:
        return None
    found = [c for c in columns if normalise(c) in PRICE_NAMES]
    return found[0] if len(found) == 1 else None


def dates_only(head: pl.DataFrame | None, date_column: str) -> bool:
    """True when the first rows' stamps carry no time of day other than midnight: dates, so one price per date
    is a bar's close, not a trade."""
    if head is None or date_column not in head.columns:
        return False
    cells = head[date_column].cast(pl.String).str.strip_chars().drop_nulls()
    if not cells.len():
        return False
    clock = cells.str.extract(rf"[\sT]({_CLOCK}(?::\d{{2}}(?:\.\d+)?)?)", 1).drop_nulls()
    return bool(clock.str.contains(r"^0?0:00(:00(\.0*)?)?$").all())


def refuse_wide(columns: list[str], path: Path) -> None:
    """InputError showing the reshape when the header is one column per symbol and field (``BTC:close``)."""
    pairs = [(c, m.group("sym").strip(), ALIASES.get(normalise(m.group("field")), normalise(m.group("field"))))
             for c in columns if (m := _PAIR.match(c))]
    pairs = [p for p in pairs if p[2] in BASE_FIELDS]
    symbols = sorted({s for _, s, _ in pairs})
    if len(pairs) < 2 or not any(f == "close" for _, _, f in pairs):
        return
    rest = [c for c in columns if c not in {p[0] for p in pairs}]
    date = next((c for c in rest if ALIASES.get(normalise(c)) == "date"), rest[0] if rest else "date")
    sep = next(ch for ch in ":|/" if ch in pairs[0][0])
    raise InputError(
        f"{path}: a wide file, one column per symbol and field ({', '.join(repr(c) for c, _, _ in pairs[:3])}, ... "
        f"{len(symbols)} symbol(s)); kline-store reads long files (symbol, date, fields): reshape it once, e.g. "
        f"df = pandas.read_csv({str(path)!r}, index_col={date!r}); "
        f"df.columns = df.columns.str.split({sep!r}, expand=True); "
        f"df.stack(level=0, future_stack=True).rename_axis([{date!r}, 'symbol']).reset_index()"
        f".to_csv('long.csv', index=False)")
