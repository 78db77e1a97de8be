"""Fields stored after the day they describe, and the one rule that reads them on that day.

A features store keeps a field that looks ``k`` bars ahead (Qlib's LABEL0, ``Ref($close, -2)/Ref($close, -1) - 1``,
reads 2) ``k`` bars after the day it describes, at the first bar where it is known: appends never change a stored
cell. Everything that reads such a field for a day ``t`` reads the stored cell ``t + k``: the datasets (a label
``horizon`` bars ahead), the row views (``Store.to_pandas``/``to_polars``) and every export (CSV, Parquet, a Qlib
directory). So a row leaving a store carries the label of its own day, as Qlib's ``D.features`` does, and the last
``k`` rows of a symbol hold NaN there until their bars arrive.

The manifest says it under ``features.fields``: ``{"name", "expr", "lookback", "lookahead"}`` per field (written
by ``features/plan.py``); anything else there reads as 0 (a bar store says nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

FEATURES_KEY = "features"
MAX_LOOKAHEAD = 1 << 20


def field_lookahead(m: Mapping[str, Any], field: str) -> int:
    """Bars after its day that a stored field was computed from (0 for bars and features that look back)."""
    return lookahead(m).get(field, 0)


def lookahead(m: Mapping[str, Any]) -> dict[str, int]:
    """Field -> bars after its day it is stored, for the fields that look ahead (an untrusted manifest: a value
    that is not a whole number in 0 .. 2^20 reads as 0)."""
    meta = m.get(FEATURES_KEY)
    out: dict[str, int] = {}
    if isinstance(meta, dict) and isinstance(meta.get("fields"), list):
        for f in meta["fields"]:
            if isinstance(f, dict) and isinstance(f.get("name"), str) and f["name"] not in out:
                a = f.get("lookahead")
                if isinstance(a, int) and not isinstance(a, bool) and 0 < a < MAX_LOOKAHEAD:
                    out[f["name"]] = a
    return out


def shifts(m: Mapping[str, Any], fields: Sequence[str]) -> list[int]:
    """The lookahead of each of ``fields`` (a store's fields, in order)."""
    ahead = lookahead(m)
    return [ahead.get(f, 0) for f in fields]


def on_their_day(panel: np.ndarray, rows: np.ndarray, lo: int, hi: int, cols: Sequence[int],
                 ahead: Sequence[int]) -> np.ndarray:
    """float32 ``[len(rows), hi - lo + 1, len(cols)]``: the values of days ``lo .. hi`` of store fields ``cols``,
    each read ``ahead[field]`` days later than its day (NaN past the calendar's end).

    Args:
        panel: the store's ``[n_symbols, n_dates, n_fields]`` view.
        rows: symbol rows.
        lo, hi: calendar positions of the first and last day.
        cols: store field indices, in output order.
        ahead: every store field's lookahead (:func:`shifts`).
    """
    rows = np.asarray(rows, dtype=np.int64)
    n_dates = panel.shape[1]
    width = max(0, hi - lo + 1)
    out = np.full((len(rows), width, len(cols)), np.nan, dtype=np.float32)
    if not width or not len(rows):
        return out
    for k in sorted({ahead[c] for c in cols}):
        js = [j for j, c in enumerate(cols) if ahead[c] == k]
        a, b = lo + k, min(hi + k, n_dates - 1)
        if b < a:
            continue
        block = panel[rows, a: b + 1]
        out[:, : b - a + 1, js] = block[:, :, [cols[j] for j in js]]
    return out


__all__ = ["FEATURES_KEY", "field_lookahead", "lookahead", "on_their_day", "shifts"]
