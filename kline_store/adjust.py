"""Adjustment factors for corporate actions (splits, dividends), in one convention.

``adj_factor`` is cumulative and backward ("hfq"): ``raw[u] * adj_factor[u]`` is a continuous series, and the
forward adjustment of day u relative to day t is ``raw[u] * adj_factor[u] / adj_factor[t]``. Vendors differ:
tushare ships it (``adj_factor``); Yahoo's ``Adj Close / Close`` equals it up to a constant; zipline (``split``,
``dividend``) and Quandl (``split_ratio``, ``ex_dividend``) give events, turned here into a cumulative product.
"""

from __future__ import annotations

import numpy as np

EVENT_COLUMNS = (("split", "dividend"), ("split_ratio", "ex_dividend"))


def event_columns(fields: list[str]) -> tuple[str | None, str | None]:
    """(split column, dividend column) present in ``fields``, by vendor convention."""
    for split, div in EVENT_COLUMNS:
        if split in fields or div in fields:
            return (split if split in fields else None, div if div in fields else None)
    return None, None


def event_ratios(close: np.ndarray, split: np.ndarray | None, dividend: np.ndarray | None,
                 prev_close: np.ndarray | None = None) -> np.ndarray:
    """Per-bar jump of the cumulative factor, [n_sym, n_days] float64 (1 where nothing happens).

    Args:
        close: raw closes [n_sym, n_days], NaN where no bar.
        split: split ratio (new shares per old share, 7.0 for a 7:1 split) on its ex-date; NaN/0/1 = none.
        dividend: cash dividend per share on its ex-date; NaN/0 = none.
        prev_close: [n_sym] close of each symbol's last bar before these days (for a dividend on day 0).
    """
    n_sym, n_days = close.shape
    ratio = np.ones((n_sym, n_days), dtype=np.float64)
    if split is not None:
        s = split.astype(np.float64)
        ok = np.isfinite(s) & (s > 0)
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
