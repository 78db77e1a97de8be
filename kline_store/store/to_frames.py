"""A store as a DataFrame: ``Store.to_polars`` and ``Store.to_pandas``.

Long format by default, one row per bar (a cell of a symbol and date with any finite field): ``symbol``,
``date`` (daily stores, a date) or ``time`` (intraday stores, the bar stamp), then the fields, float32, sorted by
symbol and date; exactly what ``kline-store export`` writes. ``wide=True``: one field as a date x symbol frame,
every calendar date of the range, NaN where a symbol has no bar. ``start``/``end`` follow pandas (periods.py).

Every value is on the row of the day it describes: a field stored ``k`` bars after its day (a features store's
label) is read ``k`` bars later (labels.py), so the last ``k`` rows of a symbol hold NaN there. ``universe=``:
only the rows of a universe's members on their member days (Qlib's ``D.features(D.instruments(NAME), ...)``);
wide, NaN outside them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import labels, periods
from ..errors import InputError

SYMBOLS_PER_BLOCK = 256


def select(st: Any, symbols: Sequence[str] | str | None, start: object, end: object,
           fields: Sequence[str] | str | None) -> tuple[np.ndarray, int, int, list[int]]:
    """Rows, calendar bounds and field indices of a selection; one-line InputErrors for unknown names."""
    if isinstance(symbols, str):
        symbols = [symbols]
    if symbols is None:
        rows = np.arange(st.n_symbols)
    else:
        index = {s: i for i, s in enumerate(st.symbols)}
        unknown = [s for s in symbols if s not in index]
        if unknown:
            raise InputError(f"{st.path}: no symbol {unknown[0]!r}" + (f" (and {len(unknown) - 1} more unknown)"
                             if len(unknown) > 1 else "") + f"; the store has {len(st.symbols):,}: "
                             + ", ".join(st.symbols[:5]) + (" ..." if len(st.symbols) > 5 else ""))
        rows = np.asarray([index[s] for s in symbols], dtype=np.int64)
    if isinstance(fields, str):
        fields = [fields]
    cols = list(range(st.n_fields)) if fields is None else [st.field_index(f) for f in fields]
    lo, hi = periods.index_bounds(st.dates, start, end)
    return rows, lo, hi, cols


def to_polars(st: Any, symbols=None, start=None, end=None, fields=None, wide: bool = False,
              universe: str | None = None):
    import polars as pl

    rows, lo, hi, cols = select(st, symbols, start, end, fields)
    member = st.membership(universe) if universe is not None else None
    names = [st.fields[j] for j in cols]
    key = "date" if st.freq == "1d" else "time"
    hi = max(hi, lo - 1)
    when = st.dates[lo: hi + 1]
    stamps = pl.Series(key, when if key == "date" else when.astype("datetime64[ms]"))
    panel = st.panel
    ahead = labels.shifts(st.manifest, st.fields)
    if wide:
        if len(cols) != 1:
            raise InputError(f"wide=True: give one field (fields='close'); {len(cols)} asked for")
        sym_names = [st.symbols[r] for r in rows]
        values = labels.on_their_day(panel, rows, lo, hi, cols, ahead)[:, :, 0]
        if member is not None:
            values[~member.mask(rows, lo, hi + 1)] = np.nan
        return pl.DataFrame([stamps, *(pl.Series(s, values[i]) for i, s in enumerate(sym_names))])
    frames = []
    every = list(range(st.n_fields))
    for b in range(0, len(rows), SYMBOLS_PER_BLOCK):
        part = rows[b: b + SYMBOLS_PER_BLOCK]
        whole = labels.on_their_day(panel, part, lo, hi, every, ahead)
        present = np.isfinite(whole).any(axis=2)   # a bar: any field finite on its day, whichever are asked for
        if member is not None:
            present &= member.mask(part, lo, hi + 1)
        s_idx, d_idx = np.nonzero(present)
        vals = whole[s_idx, d_idx][:, cols]
        data = {"symbol": pl.Series("symbol", np.asarray(st.symbols, dtype=object)[part[s_idx]], dtype=pl.String),
                key: stamps.gather(d_idx) if len(d_idx) else stamps.clear()}
        data.update({f: vals[:, j] for j, f in enumerate(names)})
        frames.append(pl.DataFrame(data))
    if not frames:
        return pl.DataFrame({"symbol": pl.Series([], dtype=pl.String), key: stamps.clear(),
                             **{f: pl.Series(f, [], dtype=pl.Float32) for f in names}})
    return pl.concat(frames)


def to_pandas(st: Any, symbols=None, start=None, end=None, fields=None, wide: bool = False,
              universe: str | None = None):
    df = to_polars(st, symbols, start, end, fields, wide, universe).to_pandas()
    if wide:
        key = df.columns[0]
        df = df.set_index(key)
        df.columns.name = "symbol"
    return df
