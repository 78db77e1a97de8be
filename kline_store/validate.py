"""Checks on normalised bars: hard errors (duplicates) and the data-quality warnings of daily OHLCV bars."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl


MAX_EXAMPLES = 3


@dataclass
class Problem:
    """One kind of data-quality problem: how many bars, and the first few as readable strings."""

    kind: str
    description: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def line(self) -> str:
        ex = "; ".join(self.examples)
        return f"{self.kind}: {self.count} bar(s) {self.description} (first: {ex})"


# kind -> (description, predicate over the frame's columns, columns needed)
CHECKS: dict[str, tuple[str, callable, tuple[str, ...]]] = {
    "high_below_low": ("with high < low", lambda: pl.col("high") < pl.col("low"), ("high", "low")),
    "close_outside_range": ("with close outside [low, high]",
                            lambda: (pl.col("close") < pl.col("low")) | (pl.col("close") > pl.col("high")),
                            ("close", "low", "high")),
    "open_outside_range": ("with open outside [low, high]",
                           lambda: (pl.col("open") < pl.col("low")) | (pl.col("open") > pl.col("high")),
                           ("open", "low", "high")),
    "non_positive_price": ("with a price <= 0", None, ()),
    "zero_volume": ("with zero volume", lambda: pl.col("volume") == 0, ("volume",)),
    "negative_volume": ("with a negative volume", lambda: pl.col("volume") < 0, ("volume",)),
}


def describe_row(df: pl.DataFrame, i: int, files: list[str], parquet: list[bool]) -> str:
    r = df.row(i, named=True)
    where = f"row {r['_row'] + 1}" if parquet[r["_file"]] else f"line {r['_row'] + 2}"
    return f"{r['symbol']} {r['date']} ({files[r['_file']]} {where})"


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


def quality_problems(df: pl.DataFrame, files: list[str], parquet: list[bool]) -> list[Problem]:
    """Count each warning kind over the bars in one parallel pass; examples only for kinds that occur."""
    cols = set(df.columns)
    exprs: dict[str, pl.Expr] = {}
    for kind, (desc, pred, need) in CHECKS.items():
        if kind == "non_positive_price":
            prices = [c for c in ("open", "high", "low", "close") if c in cols]
            if prices:
                exprs[kind] = pl.any_horizontal([pl.col(c) <= 0 for c in prices])
        elif set(need) <= cols:
            exprs[kind] = pred()
    if not exprs:
        return []
    counts = df.select([e.fill_null(False).sum().alias(k) for k, e in exprs.items()]).row(0, named=True)
    out: list[Problem] = []
    for kind, n in counts.items():
        if n:
            idx = df.select(exprs[kind].fill_null(False).alias("m"))["m"].arg_true().head(MAX_EXAMPLES)
            out.append(Problem(kind, CHECKS[kind][0], int(n),
                               [describe_row(df, i, files, parquet) for i in idx.to_list()]))
    return out
