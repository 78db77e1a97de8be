"""Compiled (numba) CPU kernels for the rolling operators that cost the most: window sums and extremes (the
moment family in moments.py reads only those) and the order statistics (Quantile/Med, Rank, IdxMax/IdxMin).

Each kernel gives the torch operator's values cell for cell (the same float operations in the same order:
window sums add a window's own terms oldest first, as moments.wsum does), on a C-contiguous [S, T] array, one
symbol after another: parallelism comes from the caller's symbol blocks (evaluate's threads), not from here,
so a kernel never spins threads of its own. nogil: blocks run side by side in threads. Imported only through
kernels.py, which points numba's cache at kline-store's cache folder before numba is imported.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_JIT = dict(cache=True, nogil=True, fastmath=False, boundscheck=False)


@numba.njit(**_JIT)
def window_sum(z, n, out):
    """out[s, t] = z[s, t-n+1] + ... + z[s, t] summed oldest first; bars before the block are +0.0 terms
    (as torch's zero padding, which also turns a leading -0.0 into +0.0)."""
    n_sym, n_bars = z.shape
    for s in range(n_sym):
        for t in range(n_bars):
            lo = t - n + 1
            if lo <= 0:
                acc = 0.0
                lo = 0
            else:
                acc = z[s, lo]
                lo += 1
            for j in range(lo, t + 1):
                acc += z[s, j]
            out[s, t] = acc


@numba.njit(**_JIT)
def window_extreme(z, n, largest, fill, out):
    """Maximum (largest) or minimum of z (no NaN) over the n bars ending at each bar; `fill` before the block."""
    n_sym, n_bars = z.shape
    for s in range(n_sym):
        for t in range(n_bars):
            lo = t - n + 1
            best = fill
            if lo >= 0:
                best = z[s, lo]
            else:
                lo = 0
            for j in range(lo, t + 1):
                v = z[s, j]
                if (v > best) if largest else (v < best):
                    best = v
            out[s, t] = best


@numba.njit(**_JIT)
def quantile(x, n, q, out):
    """pandas' rolling quantile (linear interpolation) of the valid values of each window: a sorted buffer of
    the window's valid values, one insertion and one removal a bar."""
    n_sym, n_bars = x.shape
    buf = np.empty(min(n, n_bars) + 1, dtype=x.dtype)
    for s in range(n_sym):
        m = 0
        for t in range(n_bars):
            if t - n >= 0:
                old = x[s, t - n]
                if not math.isnan(old):
                    i = np.searchsorted(buf[:m], old)
                    while i < m - 1 and buf[i] != old:  # -0.0 == 0.0: the first equal one goes
                        i += 1
                    for k in range(i, m - 1):
                        buf[k] = buf[k + 1]
                    m -= 1
            v = x[s, t]
            if not math.isnan(v):
                i = np.searchsorted(buf[:m], v)
                for k in range(m, i, -1):
                    buf[k] = buf[k - 1]
                buf[i] = v
                m += 1
            if m == 0:
                out[s, t] = np.nan
                continue
            pos = q * float(m - 1)
            lo = int(math.floor(pos))
            hi = min(lo + 1, m - 1)
            frac = pos - math.floor(pos)
            v_lo = np.float64(buf[lo])
            if frac > 0:
                out[s, t] = v_lo + (np.float64(buf[hi]) - v_lo) * frac
            else:
                out[s, t] = v_lo


@numba.njit(**_JIT)
def rank(x, n, out):
    """pandas' rolling rank(pct=True) of the newest value: (count + sum(sign(newest - w))) / 2 + 1/2, / count,
    the differences taken in x's dtype as the torch operator does (NaN rows: sign 0)."""
    n_sym, n_bars = x.shape
    for s in range(n_sym):
        for t in range(n_bars):
            new = x[s, t]
            if math.isnan(new):
                out[s, t] = np.nan
                continue
            count = 0
            total = 0
            for j in range(max(0, t - n + 1), t + 1):
                w = x[s, j]
                if not math.isnan(w):
                    count += 1
                d = new - w
                if d > 0:
                    total += 1
                elif d < 0:
                    total -= 1
            c = float(count)
            out[s, t] = ((c + float(total)) / 2 + 0.5) / c


@numba.njit(**_JIT)
def arg_extreme(x, first, last, n, largest, out):
    """Qlib's IdxMax/IdxMin: 1-based position of the window's first maximum (minimum) among the rows of the
    symbol's series in the window, a NaN row counting as the extreme (numpy's argmax); NaN when the window
    holds no valid row. Rows outside the span and bars before the block never win."""
    win = np.inf if largest else -np.inf
    lose = -win
    n_sym, n_bars = x.shape
    for s in range(n_sym):
        for t in range(n_bars):
            lo = t - n + 1
            best = lose
            at = 0
            count = 0
            for j in range(max(lo, 0), t + 1):
                v = x[s, j]
                if math.isnan(v):
                    key = win
                else:
                    key = v
                    count += 1
                if j < first[s] or j > last[s]:
                    key = lose
                if j == lo or ((key > best) if largest else (key < best)):
                    best = key
                    at = j - lo
            if count == 0:
                out[s, t] = np.nan
                continue
            length = min(max(t - first[s] + 1, 0), n)
            out[s, t] = float(at - (n - length) + 1)
