"""Adjustment factors for corporate actions (splits, dividends): the one home of the policy.

``adj_factor`` is cumulative and backward ("hfq"): ``raw[u] * adj_factor[u]`` is a continuous series, and the
forward adjustment of day u relative to day t is ``raw[u] * adj_factor[u] / adj_factor[t]``. Vendors differ,
and each is turned into that one convention here:

* ``input``: tushare ships the factor (``adj_factor``); Yahoo's ``Adj Close / Close`` equals it up to a
  constant. Both are stored rebased to 1 at each symbol's first bar (:func:`rebase`), and an append puts the
  factor it brings on the stored scale (:func:`rescale_to_store`).
* ``events``: zipline (``split``, ``dividend``) and Quandl (``split_ratio``, ``ex_dividend``) give events,
  turned into a cumulative product (:func:`fill_event_factor`) that an append continues exactly.

Placeholder or non-positive adjustment data (Yahoo's ``Adj Close`` of -1 or 0, a factor <= 0, a negative
split or dividend) is reported by validate.py through :func:`bad_data` and never becomes a factor:
:func:`clean` leaves the factor missing there.

Reading (per chunk, in polars) -> fields of the store -> per block of panel rows (numpy) -> appends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from . import columns
from ..store.snapshot import Store

FACTOR = "adj_factor"
INPUT, EVENTS = "input", "events"
EVENT_COLUMNS = (("split", "dividend"), ("split_ratio", "ex_dividend"))
# A split ratio outside this range is a placeholder or a typo (1e30), not a corporate action: reported, ignored.
SPLIT_RANGE = (1e-6, 1e6)
# A cumulative factor outside this range cannot be a price adjustment (nor stay finite in float32): not stored.
FACTOR_RANGE = (1e-30, 1e30)


# --------------------------------------------------------------------------- reading (per chunk)


def derives_factor(fields: list[str]) -> bool:
    """Yahoo's convention: a factor from ``adj_close / close`` when the input has no factor of its own."""
    return "adj_close" in fields and "close" in fields and FACTOR not in fields


def with_input_factor(lf: pl.LazyFrame, fields: list[str]) -> tuple[pl.LazyFrame, list[str]]:
    """Add Yahoo's factor, in float64 before values are cast to float32 as stored."""
    if not derives_factor(fields):
        return lf, fields
    factor = pl.when(pl.col("close") > 0).then(pl.col("adj_close") / pl.col("close")).alias(FACTOR)
    return lf.with_columns(factor), fields + [FACTOR]


def bad_data(fields: list[str]) -> pl.Expr | None:
    """Rows with placeholder or non-positive adjustment data (None when the input has no such column)."""
    tests = [pl.col(c) <= 0 for c in (FACTOR, "adj_close") if c in fields]
    tests += [pl.col(c) < 0 for pair in EVENT_COLUMNS for c in pair if c in fields]
    tests += [(pl.col(c) > 0) & ((pl.col(c) < SPLIT_RANGE[0]) | (pl.col(c) > SPLIT_RANGE[1]))
              for c, _ in EVENT_COLUMNS if c in fields]
    return pl.any_horizontal(tests) if tests else None


def clean(df: pl.DataFrame) -> pl.DataFrame:
    """A factor <= 0 becomes missing: never a negative or zero factor (reported by validate beforehand)."""
    if FACTOR not in df.columns:
        return df
    return df.with_columns(pl.when(pl.col(FACTOR) > 0).then(pl.col(FACTOR)).alias(FACTOR))


# --------------------------------------------------------------------------- the store's fields


def event_columns(fields: list[str]) -> tuple[str | None, str | None]:
    """(split column, dividend column) present in ``fields``, by vendor convention."""
    for split, div in EVENT_COLUMNS:
        if split in fields or div in fields:
            return (split if split in fields else None, div if div in fields else None)
    return None, None


def store_fields(input_fields: list[str]) -> list[str]:
    """The fields a store of these inputs holds: base fields first, extras, then ``adj_factor`` whenever the
    input carries corporate-action information (a factor, Yahoo's adj_close, or events)."""
    names = list(dict.fromkeys(input_fields))
    split, div = event_columns(names)
    if FACTOR not in names and (derives_factor(names) or split or div):
        names.append(FACTOR)
    base = [f for f in columns.BASE_FIELDS if f in names]
    extra = [f for f in names if f not in columns.BASE_FIELDS and f != FACTOR]
    return base + extra + ([FACTOR] if FACTOR in names else [])


def factor_source(fields: list[str]) -> str | None:
    """How adj_factor is obtained: from events (split/dividend columns) or from the input."""
    if FACTOR not in fields:
        return None
    split, div = event_columns(fields)
    return EVENTS if (split or div) else INPUT


def source_after_append(old_source: str | None, old_fields: list[str], new_fields: list[str]
                        ) -> tuple[list[str], str | None]:
    """Fields an append adds (in order) and the factor source afterwards, as a full ingest would have them."""
    added = [f for f in new_fields if f not in old_fields]
    source = old_source
    if source is None and FACTOR in added:
        source = INPUT                          # a vendor factor arrives for the first time
    split, div = event_columns(old_fields + added)
    if (split or div) and FACTOR not in old_fields + added:
        added.append(FACTOR)                    # events arrive for the first time
        source = EVENTS
    return added, source


# --------------------------------------------------------------------------- blocks of panel rows


@dataclass
class FactorState:
    """Per-row state a later append continues from: last event factor (float64) and the rebase divisors."""

    last: np.ndarray | None = None
    rebase: np.ndarray | None = None


def finish_block(block: np.ndarray, fields: list[str], source: str | None) -> FactorState:
    """Turn the input's adjustment data in a block of whole symbol rows [rows, days, fields] into the store's
    factor, in place: events into a cumulative product, a vendor factor rebased to 1 at the first bar."""
    if source == EVENTS:
        return FactorState(last=fill_event_factor(block, fields))
    if source == INPUT:
        return FactorState(rebase=rebase(block[:, :, fields.index(FACTOR)]))
    return FactorState()


def refill_events(block: np.ndarray, fields: list[str]) -> np.ndarray:
    """Recompute event factors of whole symbol rows from scratch (a rewrite moved or revised their bars)."""
    block[:, :, fields.index(FACTOR)] = np.nan
    return fill_event_factor(block, fields)


def fill_event_factor(panel: np.ndarray, fields: list[str], prev_close: np.ndarray | None = None,
                      start: np.ndarray | None = None) -> np.ndarray | None:
    """Fill ``adj_factor`` from split/dividend events for rows that have no vendor factor, in place.

    Args:
        panel: [rows, days, fields] block to fill.
        prev_close / start: per row, the close and (float64) factor of the last stored bar, for appends.

    Returns:
        float64 [rows] last factor of each filled row (NaN elsewhere): the state the next append continues
        from, or None when there is nothing to fill.
    """
    split, div = event_columns(fields)
    if FACTOR not in fields or (split is None and div is None):
        return None
    fi = {f: i for i, f in enumerate(fields)}
    last = np.full(panel.shape[0], np.nan)
    rows = np.flatnonzero(~np.isfinite(panel[:, :, fi[FACTOR]]).any(axis=1))
    if rows.size == 0:
        return last
    close = panel[rows, :, fi["close"]]
    ratio = event_ratios(close, panel[rows, :, fi[split]] if split else None,
                         panel[rows, :, fi[div]] if div else None,
                         prev_close[rows] if prev_close is not None else None)
    f = cumulative_factor(ratio, np.isfinite(close), start[rows] if start is not None else None)
    with np.errstate(invalid="ignore"):
        panel[rows, :, fi[FACTOR]] = np.where((f >= FACTOR_RANGE[0]) & (f <= FACTOR_RANGE[1]), f, np.nan)
    last[rows] = last_finite(f)
    return last


def event_ratios(close: np.ndarray, split: np.ndarray | None, dividend: np.ndarray | None,
                 prev_close: np.ndarray | None = None) -> np.ndarray:
    """Per-bar jump of the cumulative factor, [n_sym, n_days] float64 (1 where nothing happens).

    Args:
        close: raw closes [n_sym, n_days], NaN where no bar.
        split: split ratio (new shares per old share, 7.0 for a 7:1 split) on its ex-date; NaN/0/1 = none
            (a negative ratio is bad data: reported, ignored).
        dividend: cash dividend per share on its ex-date; NaN/0 = none (negative: reported, ignored).
        prev_close: [n_sym] close of each symbol's last bar before these days (for a dividend on day 0).
    """
    n_sym, n_days = close.shape
    ratio = np.ones((n_sym, n_days), dtype=np.float64)
    if split is not None:
        s = split.astype(np.float64)
        ok = np.isfinite(s) & (s >= SPLIT_RANGE[0]) & (s <= SPLIT_RANGE[1])
        ratio[ok] *= s[ok]
    if dividend is not None:
        # Previous bar's close: forward-fill closes, shift by one day.
        c = close.astype(np.float64)
        filled = _ffill(c, prev_close)
        prev = np.empty_like(filled)
        prev[:, 1:] = filled[:, :-1]
        prev[:, 0] = prev_close if prev_close is not None else np.nan
        d = dividend.astype(np.float64)
        ok = np.isfinite(d) & (d > 0) & np.isfinite(prev) & (prev > d)
        ratio[ok] *= prev[ok] / (prev[ok] - d[ok])
    return ratio


def _ffill(a: np.ndarray, start: np.ndarray | None) -> np.ndarray:
    """Forward-fill NaNs along axis 1 (vectorised: index of the last finite value so far)."""
    n_sym, n = a.shape
    idx = np.where(np.isfinite(a), np.arange(n)[None, :], -1)
    np.maximum.accumulate(idx, axis=1, out=idx)
    out = a[np.arange(n_sym)[:, None], np.maximum(idx, 0)]
    fill = start[:, None] if start is not None else np.nan
    return np.where(idx >= 0, out, fill)


def cumulative_factor(ratio: np.ndarray, present: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Cumulative product of ``ratio`` along days, continuing from ``start`` [n_sym] (1 for new symbols).

    The product is taken in the same order as over the whole history, so an append continued from the
    float64 ``start`` gives the same bits as a full ingest. NaN where ``present`` is False (no bar).
    """
    s = np.ones(ratio.shape[0]) if start is None else np.where(np.isfinite(start), start, 1.0)
    f = np.cumprod(np.concatenate([s[:, None], ratio], axis=1), axis=1)[:, 1:]
    return np.where(present, f, np.nan)


def last_finite(a: np.ndarray) -> np.ndarray:
    """Last finite value of each row (NaN when none): the state an append continues from."""
    n = a.shape[1]
    fin = np.isfinite(a)
    has = fin.any(axis=1)
    last = n - 1 - fin[:, ::-1].argmax(axis=1)
    return np.where(has, a[np.arange(a.shape[0]), last], np.nan)


def first_finite(a: np.ndarray) -> np.ndarray:
    """First finite value of each row (NaN when none)."""
    fin = np.isfinite(a)
    has = fin.any(axis=1)
    first = fin.argmax(axis=1)
    return np.where(has, a[np.arange(a.shape[0]), first], np.nan)


def rebase(factor: np.ndarray) -> np.ndarray:
    """Divide each row of a vendor factor by its first finite value, in place; returns the divisors.

    Yahoo's ``Adj Close / Close`` is relative to the download date, so its absolute level (and a backward
    adjusted price) would depend on dividends paid after the window. Rebased, the first bar's factor is 1 and
    only ratios remain, which is all forward adjustment needs and what backward adjustment means.
    """
    div = first_finite(factor.astype(np.float64))
    ok = np.isfinite(div) & (div > 0)
    factor[ok] = factor[ok] / div[ok, None]
    return np.where(ok, div, np.nan)


def state_list(state: np.ndarray | None) -> list[float | None] | None:
    """A per-row float64 state as manifest JSON (null for NaN)."""
    return None if state is None else [None if not np.isfinite(x) else float(x) for x in state]


# --------------------------------------------------------------------------- appends


def event_state(old: Store) -> tuple[np.ndarray, np.ndarray]:
    """Last close and last float64 factor per row: where event-based factors continue from.

    Reads one cell per symbol (its last bar), not the close history: the cost of a daily append stays
    proportional to the new data.
    """
    close = np.full(old.n_symbols, np.nan)
    fc = old.field_index("close")
    rows = np.flatnonzero(old.last_bar >= 0)
    if rows.size:   # the last finite close: look a few days back from each last bar, all history if needed
        lo = np.maximum(old.last_bar[rows] - 31, 0)
        span = lo[:, None] + np.arange(32)[None, :]
        recent = old.panel[rows[:, None], np.minimum(span, old.n_dates - 1), fc]
        recent = np.where(span <= old.last_bar[rows][:, None], recent, np.nan)
        close[rows] = last_finite(recent)
        missing = rows[~np.isfinite(close[rows])]
        if missing.size:
            close[missing] = last_finite(np.asarray(old.panel[missing, :, fc]))
    state = old.manifest.get("adj_last_factor") or [None] * old.n_symbols
    return close, np.array([np.nan if x is None else x for x in state], dtype=np.float64)


def stored_divisors(old: Store) -> dict[str, float]:
    """symbol -> the divisor its stored vendor factor was rebased by (manifest ``adj_rebase``)."""
    return {k: v for k, v in zip(old.symbols, old.manifest.get("adj_rebase") or []) if v is not None}


def rescale_to_store(old: Store, names: list[str], sym: np.ndarray, day: np.ndarray, values: np.ndarray,
                     fields: list[str]) -> dict[str, float]:
    """Put a vendor ``adj_factor`` in appended bars on the store's scale (in place); returns symbol -> divisor.

    The store keeps vendor factors rebased to 1 at each symbol's first bar (see :func:`rebase`). An input's
    factor is divided by: the ratio to the stored factor on the first day both have (a Yahoo re-download,
    whose scale moved with later dividends); else the symbol's stored divisor (tushare's absolute factor);
    else, for a new symbol, its own first factor.

    Args:
        old: the store appended to.
        names: symbol code -> name of the appended bars; ``sym``, ``day``: each bar's code and day number.
        values: [bars, fields] float32 values of the bars (the factor column is rewritten).
        fields: the bars' fields.
    """
    source = old.manifest.get("adj_factor_source")
    first_factor = source is None and FACTOR not in old.fields   # a vendor factor arrives now
    if (source != INPUT and not first_factor) or FACTOR not in fields:
        return stored_divisors(old)
    # Stores written before rebasing existed keep their factors as given: divisor 1.
    stored_div = dict(zip(old.symbols, old.manifest.get("adj_rebase") or [1.0] * old.n_symbols))
    if first_factor:
        stored_div = {}
    fi = fields.index(FACTOR)
    given = values[:, fi].astype(np.float64)
    old_days = old.dates.astype(np.int64)   # keys in the store's unit, like ``day``
    order = np.lexsort((day, sym))            # each symbol's bars by date
    starts = np.flatnonzero(np.r_[True, np.diff(sym[order]) != 0])
    divisors: dict[str, float] = {k: v for k, v in stored_div.items() if v is not None}
    for run in np.split(order, starts[1:]) if len(order) else []:
        name = names[int(sym[run[0]])]
        g = given[run]
        scale = np.nan
        if name in stored_div:
            row = old.symbol_index(name)
            pos = np.searchsorted(old_days, day[run])
            on_old = (pos < len(old_days)) & (old_days[np.minimum(pos, len(old_days) - 1)] == day[run])
            if on_old.any():
                stored = old.panel[row, pos[on_old], old.field_index(FACTOR)].astype(np.float64)
                both = np.isfinite(stored) & np.isfinite(g[on_old]) & (stored > 0)
                if both.any():
                    k = int(np.argmax(both))
                    scale = g[on_old][k] / stored[k]
                    known = stored_div[name]
                    if known is not None and abs(scale / known - 1) < 1e-5:
                        scale = known   # the same scale, up to float32 rounding of the stored factor
            if not np.isfinite(scale):
                scale = stored_div[name] if stored_div[name] is not None else np.nan
        if not np.isfinite(scale):
            fin = g[np.isfinite(g)]
            scale = fin[0] if fin.size else np.nan
            if np.isfinite(scale):
                divisors[name] = float(scale)
        if np.isfinite(scale) and scale > 0:
            values[run, fi] = (g / scale).astype(np.float32)
    return divisors
