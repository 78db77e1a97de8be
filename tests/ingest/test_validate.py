"""Data-quality warnings: each kind counted over every bar, the first few named with file and line."""

from pathlib import Path

import polars as pl

from kline_store.ingest.validate import CHECKS, MAX_EXAMPLES, Problem, merge_problems, quality_problems

FILES = [Path("a.csv"), Path("b.parquet")]


def frame(**cols):
    n = len(next(iter(cols.values())))
    base = {"symbol": ["X"] * n, "date": [f"2024-01-{i + 2:02d}" for i in range(n)], "_row": list(range(n)),
            "_file": [0] * n}
    return pl.DataFrame({**base, **cols})


def test_each_kind_is_counted_and_located():
    df = frame(open=[1.0, 5.0, 1.0, 1.0], high=[2.0, 2.0, 0.5, 2.0], low=[1.0, 1.0, 1.0, 1.0],
               close=[1.5, 1.5, 0.7, -1.0], volume=[0.0, 10.0, -1.0, 5.0])
    got = {p.kind: p for p in quality_problems(df, FILES)}
    assert got["zero_volume"].count == 1 and got["zero_volume"].examples == ["X 2024-01-02 (a.csv line 2)"]
    assert got["open_outside_range"].count == 2 and "line 3" in got["open_outside_range"].examples[0]
    assert got["high_below_low"].count == 1 and got["negative_volume"].count == 1
    assert got["non_positive_price"].count == 1 and got["close_outside_range"].count == 2


def test_parquet_rows_and_missing_columns():
    df = frame(close=[-1.0, 2.0]).with_columns(pl.lit(1).alias("_file"))
    (p,) = quality_problems(df, FILES)
    assert p.kind == "non_positive_price" and p.examples == ["X 2024-01-02 (b.parquet row 1)"]


def test_bad_adjustment_kind():
    df = frame(close=[10.0, 10.0], adj_close=[-1.0, 9.0], adj_factor=[-0.1, 0.9])
    (p,) = quality_problems(df, FILES)
    assert p.kind == "bad_adjustment" and p.count == 1 and "no adj_factor is taken from them" in p.line()


def test_merge_keeps_order_counts_and_first_examples():
    a = [Problem("zero_volume", CHECKS["zero_volume"][0], 2, ["1", "2"])]
    b = [Problem("high_below_low", CHECKS["high_below_low"][0], 1, ["x"]),
         Problem("zero_volume", CHECKS["zero_volume"][0], 5, ["3", "4"])]
    m = merge_problems(a, b)
    assert [p.kind for p in m] == ["high_below_low", "zero_volume"]
    assert m[1].count == 7 and m[1].examples == ["1", "2", "3"][:MAX_EXAMPLES]


def test_flags_computed_while_reading_give_the_same_problems():
    """quality_flags (evaluated by polars as a file is read) + flagged_problems == quality_problems of the rows
    with a price, every kind and example included."""
    import numpy as np

    from kline_store.ingest.validate import flagged_problems, quality_flags
    rng = np.random.default_rng(3)
    n = 400
    cols = {c: rng.choice([-1.0, 0.0, 1.0, 2.0, 3.0, None], n).tolist()
            for c in ("open", "high", "low", "close", "volume", "adj_close", "split")}
    df = frame(**cols).with_columns(pl.col(c).cast(pl.Float32) for c in cols)
    fields = list(cols)
    flags = df.select(quality_flags(fields, ["open", "high", "low", "close"]))[:, 0].to_numpy()
    empty = (flags & 1) != 0
    assert empty.sum() == df.select(pl.all_horizontal(pl.col(c).is_null() for c in ("open", "high", "low", "close"))
                                    ).to_series().sum()
    kept = df.filter(pl.Series(~empty))
    assert flagged_problems(kept, flags[~empty], FILES) == quality_problems(kept, FILES)
