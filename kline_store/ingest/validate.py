"""Data-quality checks of daily OHLCV bars: each kind counted over every bar, the first few named.

Warnings, not errors (``--strict`` makes them errors): a store keeps the bars as the vendor sent them. Hard
errors (a cut line, a bad date, a duplicate bar) are raised where they are found: textscan, dates, bars.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from . import adjust
from .inputs import location, shown

MAX_EXAMPLES = 3


@dataclass
class Problem:
    """One kind of data-quality problem: how many bars, and the first few as readable strings."""

    kind: str
    description: str
    count: int = 0
    examples: list[str] = field(default_factory=list)
    unit: str = "bar(s)"          # what is counted

    def line(self) -> str:
        ex = "; ".join(self.examples)
        return f"{self.kind}: {self.count} {self.unit} {self.description} (first: {ex})"


def _price_at_most_zero(cols: set[str]) -> pl.Expr | None:
    prices = [c for c in ("open", "high", "low", "close") if c in cols]
    return pl.any_horizontal([pl.col(c) <= 0 for c in prices]) if prices else None


def _needs(*names: str, pred: Callable[[], pl.Expr]) -> Callable[[set[str]], pl.Expr | None]:
    return lambda cols: pred() if set(names) <= cols else None


# kind -> (description, columns -> predicate over the frame, or None when the columns are absent)
CHECKS: dict[str, tuple[str, Callable[[set[str]], pl.Expr | None]]] = {
    "high_below_low": ("with high < low", _needs("high", "low", pred=lambda: pl.col("high") < pl.col("low"))),
    "close_outside_range": ("with close outside [low, high]", _needs(
        "close", "low", "high", pred=lambda: (pl.col("close") < pl.col("low")) | (pl.col("close") > pl.col("high")))),
    "open_outside_range": ("with open outside [low, high]", _needs(
        "open", "low", "high", pred=lambda: (pl.col("open") < pl.col("low")) | (pl.col("open") > pl.col("high")))),
    "non_positive_price": ("with a price <= 0", _price_at_most_zero),
    "zero_volume": ("with zero volume", _needs("volume", pred=lambda: pl.col("volume") == 0)),
    "negative_volume": ("with a negative volume", _needs("volume", pred=lambda: pl.col("volume") < 0)),
    "bad_adjustment": ("with placeholder or non-positive adjustment data (adj_close or adj_factor <= 0, a "
                       "negative dividend, a split ratio negative or outside 1e-6..1e6); no adj_factor is "
                       "taken from them",
                       lambda cols: adjust.bad_data(sorted(cols))),
}


def describe_row(df: pl.DataFrame, i: int, files: list[Path]) -> str:
    """"SYMBOL DATE (file line N)" of row ``i`` of a frame with ``_file`` and ``_row`` columns."""
    r = df.row(i, named=True)
    f = files[r["_file"]]
    when = str(r["date"]).removesuffix(" 00:00:00")   # a daily bar shows its date, an intraday one its time
    return f"{r['symbol']} {when} ({shown(f)} {location(f, r['_row'])})"


def merge_problems(acc: list[Problem], new: list[Problem]) -> list[Problem]:
    """Add the counts of ``new`` (from a later chunk or file) to ``acc``; keep the first examples."""
    by_kind = {p.kind: p for p in acc}
    for p in new:
        if p.kind in by_kind:
            q = by_kind[p.kind]
            q.count += p.count
            q.examples = (q.examples + p.examples)[:MAX_EXAMPLES]
        else:
            by_kind[p.kind] = Problem(p.kind, p.description, p.count, list(p.examples))
    order = list(CHECKS)
    return sorted(by_kind.values(), key=lambda p: order.index(p.kind))


def quality_problems(df: pl.DataFrame, files: list[Path]) -> list[Problem]:
    """Count each warning kind over the bars in one parallel pass; examples only for kinds that occur."""
    cols = set(df.columns)
    exprs = {kind: e for kind, (_, pred) in CHECKS.items() if (e := pred(cols)) is not None}
    if not exprs:
        return []
    counts = df.select([e.fill_null(False).sum().alias(k) for k, e in exprs.items()]).row(0, named=True)
    out: list[Problem] = []
    for kind, n in counts.items():
        if n:
            idx = df.select(exprs[kind].fill_null(False).alias("m"))["m"].arg_true().head(MAX_EXAMPLES)
            out.append(Problem(kind, CHECKS[kind][0], int(n), [describe_row(df, i, files) for i in idx.to_list()]))
    return out


def quality_flags(fields: list[str], prices: list[str]) -> pl.Expr:
    """Per row, as polars reads the file: bit 0 when every price is missing (no bar), bit k + 1 when the k-th
    kind of CHECKS applies to a row with a price. :func:`flagged_problems` turns them into Problems."""
    empty = pl.all_horizontal([pl.col(c).is_null() for c in prices]) if prices else pl.lit(False)
    bits = empty.cast(pl.UInt32)
    for k, (_, pred) in enumerate(CHECKS.values()):
        e = pred(set(fields))
        if e is not None:
            bits = bits | ((e.fill_null(False) & ~empty).cast(pl.UInt32) * (1 << (k + 1)))
    return bits


def flagged_problems(df: pl.DataFrame, flags: np.ndarray, files: list[Path]) -> list[Problem]:
    """:func:`quality_problems` of ``df`` (rows with a price) from its rows' :func:`quality_flags`."""
    out: list[Problem] = []
    for k, (kind, (description, _)) in enumerate(CHECKS.items()):
        hit = np.flatnonzero(flags & (1 << (k + 1)))
        if len(hit):
            out.append(Problem(kind, description, len(hit),
                               [describe_row(df, int(i), files) for i in hit[:MAX_EXAMPLES]]))
    return out
