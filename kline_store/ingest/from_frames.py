"""DataFrames in: a pandas or polars frame handed to ``ks.ingest`` / ``ks.append`` is read like a file.

Long format (a symbol column, a date column, fields) or one symbol's bars (a date column or a date index, and
``symbol=``). The frame is written once to a Parquet file in a private temporary folder and read by the same
code as any input, so it gets the same checks and messages; a message names ``DataFrame: row N`` (N counts
the frame's rows from 1) instead of the temporary file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from . import columns
from ..errors import InputError
from .options import ReadOptions

LABEL = "DataFrame"


def is_frame(obj: Any) -> bool:
    """True for a pandas or polars DataFrame (or a polars LazyFrame), without importing pandas."""
    mod = type(obj).__module__.split(".")[0]
    return mod in ("pandas", "polars") and type(obj).__name__ in ("DataFrame", "LazyFrame")


def describe(obj: Any) -> str:
    """An argument for a one-line message: paths as written, anything else by its type."""
    return repr(str(obj)) if isinstance(obj, str) else f"a {type(obj).__module__.split('.')[0]}.{type(obj).__name__}"


def to_polars(frame: Any, timezone: str | None = None):
    """A pandas frame (its index kept as columns unless it is a plain RangeIndex) or a polars one, as polars.

    A column of stamps in different time zones (pandas keeps them as objects) is refused naming two, unless
    ``timezone`` (the exchange's) is given: then it goes on as UTC and the read converts it to that clock."""
    import polars as pl

    if isinstance(frame, pl.LazyFrame):
        frame = frame.collect()
    if isinstance(frame, pl.DataFrame):
        return frame
    import pandas as pd

    df = frame
    idx = df.index
    plain = isinstance(idx, pd.RangeIndex) and idx.name is None
    if not plain:
        if isinstance(idx, pd.MultiIndex):
            df = df.reset_index()
        else:
            df = df.reset_index(names=idx.name if idx.name is not None else
                                "date" if isinstance(idx, pd.DatetimeIndex) else "index")
    df.columns = [str(c) for c in df.columns]
    df = _mixed_zones(df, timezone)
    try:
        return pl.from_pandas(df)
    except Exception as exc:  # an object column of mixed types, ...
        raise InputError(f"{LABEL}: cannot convert to columns ({' '.join(str(exc).split())[:200]})") from None


def _mixed_zones(df, timezone: str | None):
    """Object columns of zone-aware stamps in more than one zone or UTC offset: to UTC with ``timezone``, else refused
    (pl.from_pandas would put every stamp on the first one's zone: a clock no one chose)."""
    import pandas as pd

    for name in df.columns:
        col = df[name]
        if col.dtype != object:
            continue
        head = col.dropna()
        if not len(head) or not all(isinstance(v, pd.Timestamp) and v.tzinfo is not None for v in head.iloc[:1000]):
            continue
        # one zone (New York across a DST change included) is one clock; two zones are two
        offsets = head.map(lambda v: str(v.tzinfo) if isinstance(v, pd.Timestamp) else None)
        if offsets.nunique(dropna=False) < 2:
            continue
        if timezone is None:
            j = int((offsets != offsets.iloc[0]).to_numpy().argmax())
            rows = [int(df.index.get_indexer([head.index[k]])[0]) + 1 for k in (0, j)]
            raise InputError(f"{LABEL}: stamps with different UTC offsets in column {name!r}: "
                             f"{str(head.iloc[0])!r} (row {rows[0]}) and {str(head.iloc[j])!r} (row {rows[1]}); pass "
                             f"timezone= (the exchange's, e.g. Asia/Shanghai) to convert them to its clock")
        df = df.assign(**{name: pd.to_datetime(col, utc=True)})
    return df


@contextlib.contextmanager
def as_file(frame: Any, read: ReadOptions, timezone: str | None = None) -> Iterator[Path]:
    """The frame as a Parquet file for the duration of the block; InputErrors name the frame, not the file.

    The caller reads the file with the same ``read`` options (and its axis options) as any input: the frame
    takes every option a file takes."""
    df = to_polars(frame, timezone)
    if df.height == 0:
        raise InputError(f"{LABEL}: no rows")
    mapped = columns.resolve_columns(list(df.columns), dict(read.user_map))
    if "symbol" not in mapped.values() and not read.symbol:
        raise InputError(f"{LABEL}: no symbol column (columns: {columns.preview(list(df.columns))}); pass "
                         f"symbol='NAME' for one symbol's bars, or add a symbol column")
    folder = Path(tempfile.mkdtemp(prefix="kline-frame-"))
    path = folder / f"{LABEL}.parquet"
    try:
        try:
            df.write_parquet(path)
        except Exception as exc:
            raise InputError(f"{LABEL}: cannot write its columns ({' '.join(str(exc).split())[:200]})") from None
        try:
            yield path
        except InputError as exc:
            raise InputError(str(exc).replace(str(path), LABEL)) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
