"""Column conventions of the common vendors, mapped to canonical names; date formats.

Canonical fields: open high low close volume amount, then any extra numeric column under its normalised
lower-case name (``Adj Close`` -> ``adj_close``, ``ex-dividend`` -> ``ex_dividend``).
"""

from __future__ import annotations

import re

from ..errors import InputError

PRICE_FIELDS = ("open", "high", "low", "close")
BASE_FIELDS = ("open", "high", "low", "close", "volume", "amount")

# alias (normalised) -> canonical name. Normalised = lower case, stripped, runs of non-alphanumerics -> "_".
ALIASES: dict[str, str] = {
    # dates: generic, tushare, baostock, czsc, zipline pipeline files, akshare (Chinese)
    "date": "date", "trade_date": "date", "datetime": "date", "dt": "date", "day": "date", "time": "date",
    "timestamp": "date", "trading_date": "date", "cal_date": "date", "日期": "date", "交易日期": "date",
    "时间": "date", "trade_time": "date",
    # symbols: generic, tushare, baostock, Quandl/zipline, akshare
    "symbol": "symbol", "ts_code": "symbol", "code": "symbol", "ticker": "symbol", "instrument": "symbol",
    "sec_code": "symbol", "stock_code": "symbol", "股票代码": "symbol", "代码": "symbol", "证券代码": "symbol",
    # prices and volumes
    "open": "open", "开盘": "open", "开盘价": "open",
    "high": "high", "最高": "high", "最高价": "high",
    "low": "low", "最低": "low", "最低价": "low",
    "close": "close", "收盘": "close", "收盘价": "close",
    "volume": "volume", "vol": "volume", "成交量": "volume",
    "amount": "amount", "money": "amount", "成交额": "amount", "成交金额": "amount",
    # extras with well-known spellings
    "adj_close": "adj_close", "adjclose": "adj_close", "adj_factor": "adj_factor", "factor": "adj_factor",
    "复权因子": "adj_factor",
    "pre_close": "pre_close", "preclose": "pre_close", "昨收": "pre_close",
    "change": "change", "涨跌额": "change", "pct_chg": "pct_chg", "pctchg": "pct_chg", "涨跌幅": "pct_chg",
    "turnover": "turnover", "turn": "turnover", "换手率": "turnover", "振幅": "amplitude",
    "dividend": "dividend", "dividends": "dividend", "ex_dividend": "ex_dividend",
    "split": "split", "stock_splits": "split", "split_ratio": "split_ratio",
}

# A time-of-day column beside a date column (backtrader, MetaTrader `<DATE>,<TIME>`, tushare minute files):
# read together as one stamp. Alone (no other date column), a "time" column is the date column, as before.
TIME_NAMES = ("time", "trade_time", "bar_time", "time_of_day", "hhmmss")

ACCEPTED = {
    "date": sorted(k for k, v in ALIASES.items() if v == "date"),
    "close": sorted(k for k, v in ALIASES.items() if v == "close"),
}

# Literal cells that mean "missing".
NULL_VALUES = ["", "null", "NULL", "Null", "NA", "N/A", "n/a", "NaN", "nan", "None", "none", "--", "-"]

# Date formats tried in order on the date part of a cell (a time of day, if any, is dropped first).
DATE_FORMATS = ("%Y-%m-%d", "%Y%m%d", "%Y/%m/%d", "%m/%d/%Y", "%Y.%m.%d", "%d-%b-%Y", "%b %d, %Y")


def normalise(name: str) -> str:
    """``' Adj Close '`` -> ``'adj_close'``; Chinese names are kept (they are alphanumeric to Python)."""
    return re.sub(r"[^0-9a-z\u4e00-\u9fff]+", "_", name.strip().lower()).strip("_")


def is_index_name(name: str) -> bool:
    """A column pandas writes for its index: ``''`` (``to_csv()``), ``Unnamed: 0``, ``index``,
    ``__index_level_0__`` (``to_parquet()``); or a row number a database export adds, ``id`` (czsc's minute
    files): never a feature of a bar."""
    key = normalise(name)
    return not key or key.startswith(("unnamed", "index_level_")) or key in ("index", "id")


def parse_mapping(pairs: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """``["Trade Day=date", "px=close", "=date"]`` -> ``{"Trade Day": "date", "px": "close", "": "date"}``.

    The field is after the last ``=``: a source name may hold any character, ``=`` included, or be empty
    (pandas' unnamed index column).
    """
    out: dict[str, str] = {}
    for p in pairs or ():
        if "=" not in p:
            raise InputError(f"--map {p!r}: expected SOURCE=FIELD, e.g. --map 'Trade Day=date'")
        src, dst = p.rsplit("=", 1)
        if not dst.strip():
            raise InputError(f"--map {p!r}: expected SOURCE=FIELD, e.g. --map 'Trade Day=date' (or '=date' for "
                             f"a column without a name)")
        out[src] = normalise(dst) if normalise(dst) else dst
    return out


def resolve_columns(columns: list[str], user_map: dict[str, str] | None = None) -> dict[str, str]:
    """Map a file's column names to canonical names.

    Args:
        columns: the header as found in the file.
        user_map: ``--map`` entries (source name -> canonical), which win over the built-in aliases.

    Returns:
        source column -> canonical name, for every column kept. Two source columns that map to the same
        canonical name keep the first (e.g. both ``code`` and ``ts_code``).
    """
    user_map = user_map or {}
    out: dict[str, str] = {}
    # The fields --map asks for are taken first: "--map 'Adj Close=close'" must win over a "Close" column that
    # comes earlier in the header (which is then left out, and reported).
    mapped = {col: user_map[col] for col in columns if col in user_map}
    taken: set[str] = set()
    dated = [c for c in columns if c not in mapped and not is_index_name(c)
             and ALIASES.get(normalise(c)) == "date" and normalise(c) not in TIME_NAMES]
    dated += [c for c, d in mapped.items() if d == "date"]
    for col, dst in mapped.items():
        if dst in taken:
            first = next(c for c, d in mapped.items() if d == dst)
            raise InputError(f"--map: columns {first!r} and {col!r} both map to {dst!r}; map one of them")
        taken.add(dst)
    for col in columns:
        if col in mapped:
            out[col] = mapped[col]
            continue
        if is_index_name(col):
            continue  # pandas index columns written by to_csv(); see readers.inspect_source for dates
        key = normalise(col)
        dst = ALIASES.get(key, key)
        if key in TIME_NAMES and any(c != col for c in dated):
            dst = "time"   # Date,Time: the time of day of the date column's day
        if dst in taken:
            continue
        taken.add(dst)
        out[col] = dst
    return out


def short(value: object, limit: int = 40) -> str:
    """A cell for a message: its repr, cut to ``limit`` characters (an error line stays one short line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def preview(names: list[str], limit: int = 8) -> str:
    """The first ``limit`` names, then how many more: "a, b, c, ... (1,203 in all)"."""
    shown = ", ".join(short(n, 30)[1:-1] if isinstance(n, str) else short(n, 30) for n in names[:limit])
    return shown + (f", ... ({len(names):,} in all)" if len(names) > limit else "")


def not_bars(columns: list[str]) -> str | None:
    """What a file without a close column holds instead of bars, when its columns say so: quotes or ticks."""
    keys = {normalise(c) for c in columns}
    if keys & {"bid", "ask", "bid_price", "ask_price", "bidprice", "askprice", "best_bid", "best_ask"}:
        return "bid/ask quotes, not bars"
    if keys & {"price", "last", "last_price", "trade_price", "lastprice"} and not keys & {"open", "high", "low"}:
        return "ticks (one price per trade), not bars"
    return None


def describe_missing(kind: str, columns: list[str], source: str) -> str:
    found = preview(columns) if columns else "(none)"
    instead = not_bars(columns) if kind == "close" else None
    if instead:
        return f"{source}: {instead} (no close column; columns found: {found}); --skip-bad leaves such files out"
    return (f"{source}: no {kind} column; columns found: {found}; accepted {kind} names: "
            f"{', '.join(ACCEPTED[kind])} (or pass --map COLUMN={kind})")
