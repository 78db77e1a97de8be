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

_JIT = dict(cache=True, nogil=True, fastmath=False, boundscheck=False, error_model="numpy")  # x / 0 is inf


@numba.njit(**_JIT)
def window_sum(z, n, out):
    """out[s, t] = z[s, t-n+1] + ... + z[s, t] summed oldest first; bars before the block are +0.0 terms
    (as torch's zero padding, which also turns a leading -0.0 into +0.0). Lag by lag over the whole row, so
    that the adds of one lag run side by side in vector registers while each cell keeps its own order (into
    a local buffer, over unit-stride slices: what lets LLVM vectorise, 2.6x)."""
    n_sym, n_bars = z.shape
    acc = np.empty(n_bars)
    for s in range(n_sym):
        row = z[s]
        if n >= n_bars:  # every window starts before the block: a running sum from its start
            total = 0.0
            for t in range(n_bars):
                total += row[t]
                acc[t] = total
        else:
            for t in range(n - 1):
                acc[t] = 0.0
            for t in range(n - 1, n_bars):
                acc[t] = row[t - n + 1]
            for lag in range(n - 2, -1, -1):
                dst, src = acc[lag:], row[: n_bars - lag]
                for t in range(n_bars - lag):
                    dst[t] += src[t]
        out[s, :] = acc


@numba.njit(**_JIT)
def window_count(v, n, out):
    """out[s, t] = v[s, t-n+1] + ... + v[s, t] for 0/1 values v (moments.wcount): running-count differences,
    exact integers."""
    n_sym, n_bars = v.shape
    total = np.empty(n_bars)
    for s in range(n_sym):
        row, res = v[s], out[s]
        run = 0.0
        for t in range(n_bars):
            run += row[t]
            total[t] = run
        for t in range(n_bars):
            res[t] = total[t] - total[t - n] if t >= n else total[t]


@numba.njit(**_JIT)
def window_extreme(z, n, largest, fill, out):
    """Maximum (largest) or minimum of z (no NaN) over the n bars ending at each bar; `fill` before the block."""
    n_sym, n_bars = z.shape
    n = min(n, n_bars)
    best = np.empty(n_bars)
    for s in range(n_sym):
        row = z[s]
        best[:] = fill
        for lag in range(n - 1, -1, -1):
            dst, src = best[lag:], row[: n_bars - lag]
            if largest:
                for t in range(n_bars - lag):
                    dst[t] = src[t] if src[t] > dst[t] else dst[t]
            else:
                for t in range(n_bars - lag):
                    dst[t] = src[t] if src[t] < dst[t] else dst[t]
        out[s, :] = best


@numba.njit(**_JIT)
def _position(buf, m, v):
    """First index of buf[:m] (ascending) whose value is not below v."""
    lo, hi = 0, m
    while lo < hi:
        mid = (lo + hi) // 2
        if buf[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(**_JIT)
def quantile(x, n, q, out):
    """pandas' rolling quantile (linear interpolation) of the valid values of each window: a sorted buffer of
    the window's valid values, one insertion and one removal a bar."""
    n_sym, n_bars = x.shape
    buf = np.empty(min(n, n_bars) + 1, dtype=x.dtype)
    for s in range(n_sym):
        row, res = x[s], out[s]
        m = 0
        for t in range(n_bars):
            if t - n >= 0:
                old = row[t - n]
                if not math.isnan(old):  # present: the first equal one goes (-0.0 == 0.0 either way)
                    for k in range(_position(buf, m, old), m - 1):
                        buf[k] = buf[k + 1]
                    m -= 1
            v = row[t]
            if not math.isnan(v):
                i = _position(buf, m, v)
                for k in range(m, i, -1):
                    buf[k] = buf[k - 1]
                buf[i] = v
                m += 1
            if m == 0:
                res[t] = np.nan
                continue
            pos = q * float(m - 1)
            lo = int(math.floor(pos))
            hi = min(lo + 1, m - 1)
            frac = pos - math.floor(pos)
            v_lo = np.float64(buf[lo])
            if frac > 0:
                res[t] = v_lo + (np.float64(buf[hi]) - v_lo) * frac
            else:
                res[t] = v_lo


@numba.njit(**_JIT)
def _valid_counts(row, n, count):
    """count[t]: valid (non-NaN) rows among the n ending at t, from a running count (exact integers)."""
    n_bars = row.shape[0]
    total = 0
    for t in range(n_bars):
        if not math.isnan(row[t]):
            total += 1
        count[t] = total
    for t in range(n_bars - 1, n - 1, -1):
        count[t] -= count[t - n]


@numba.njit(**_JIT)
def rank(x, n, out):
    """pandas' rolling rank(pct=True) of the newest value: (count + sum(sign(newest - w))) / 2 + 1/2, / count,
    the differences taken in x's dtype as the torch operator does (NaN rows: sign 0)."""
    n_sym, n_bars = x.shape
    count = np.empty(n_bars, dtype=np.int64)
    total = np.empty(n_bars, dtype=np.int64)
    for s in range(n_sym):
        row, res = x[s], out[s]
        _valid_counts(row, n, count)
        total[:] = 0
        for lag in range(1, min(n, n_bars)):
            new, old, dst = row[lag:], row[: n_bars - lag], total[lag:]
            for t in range(n_bars - lag):
                d = new[t] - old[t]
                dst[t] += (d > 0) - (d < 0)
        for t in range(n_bars):
            if math.isnan(row[t]):
                res[t] = np.nan
            else:
                c = float(count[t])
                res[t] = ((c + float(total[t])) / 2 + 0.5) / c


@numba.njit(**_JIT)
def arg_extreme(x, first, last, n, largest, out):
    """Qlib's IdxMax/IdxMin: 1-based position of the window's first maximum (minimum) among the rows of the
    symbol's series in the window, a NaN row counting as the extreme (numpy's argmax); NaN when the window
    holds no valid row. Rows outside the span and bars before the block never win."""
    win = np.inf if largest else -np.inf
    lose = -win
    n_sym, n_bars = x.shape
    key = np.empty(n_bars, dtype=x.dtype)
    best = np.empty(n_bars, dtype=x.dtype)
    at = np.empty(n_bars, dtype=np.int64)
    count = np.empty(n_bars, dtype=np.int64)
    for s in range(n_sym):
        row, res = x[s], out[s]
        _valid_counts(row, n, count)
        for j in range(n_bars):
            v = row[j]
            key[j] = lose if (j < first[s] or j > last[s]) else (win if math.isnan(v) else v)
        best[:] = lose  # window slot 0: a bar before the block, or (below) the window's oldest row
        at[:] = 0
        for t in range(n - 1, n_bars):
            best[t] = key[t - n + 1]
        for k in range(1, min(n, n_bars + n - 1)):  # slots oldest to newest: a later one wins only if better
            lag = n - 1 - k
            if lag >= n_bars:
                continue
            src, top, where = key[: n_bars - lag], best[lag:], at[lag:]
            if largest:
                for t in range(n_bars - lag):
                    better = src[t] > top[t]
                    top[t] = src[t] if better else top[t]
                    where[t] = k if better else where[t]
            else:
                for t in range(n_bars - lag):
                    better = src[t] < top[t]
                    top[t] = src[t] if better else top[t]
                    where[t] = k if better else where[t]
        for t in range(n_bars):
            if count[t] == 0:
                res[t] = np.nan
            else:
                length = min(max(t - first[s] + 1, 0), n)
                res[t] = float(at[t] - (n - length) + 1)


@numba.njit(**_JIT)
def flat_windows(x, n, out):
    """out[s, t]: the valid (non-NaN) values of the n bars ending at t are all equal and there is one (what
    max == min of them says, NaN rows and bars before the block left out). One pass a row whatever n: `start`
    is the earliest bar from which every valid value up to t equals the newest valid one."""
    n_sym, n_bars = x.shape
    for s in range(n_sym):
        row, res = x[s], out[s]
        start = 0
        last = -1  # the newest valid bar so far
        for t in range(n_bars):
            v = row[t]
            if not math.isnan(v):
                if last >= 0 and v != row[last]:
                    start = last + 1
                last = t
            res[t] = last >= 0 and last > t - n and start <= max(t - n + 1, 0)


# Sums of terms about each window's own centre c[t] (moments.centred): slot k of the window ending at t
# reads bar j = t - n + 1 + k, or raw 0 and validity 0 before the block, as torch's zero padding does; the
# window's terms are added oldest slot first (moments.oldest_first), lag by lag over the row.


@numba.njit(**_JIT)
def centred_moments(raw, v, c, n, out):
    """out[s, t] = (sum d, sum d * d) over the window's slots, d = (raw - c[t]) * v (Prepared.moments)."""
    n_sym, n_bars = raw.shape
    s1, s2 = np.empty(n_bars), np.empty(n_bars)
    for s in range(n_sym):
        r, w, ct = raw[s], v[s], c[s]
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            for t in range(min(lag, n_bars)):  # the slot lies before the block
                d = (0.0 - ct[t]) * 0.0
                s1[t] = d if first else s1[t] + d
                s2[t] = d * d if first else s2[t] + d * d
            if lag < n_bars:
                src, val, cen, a1, a2 = r[: n_bars - lag], w[: n_bars - lag], ct[lag:], s1[lag:], s2[lag:]
                if first:
                    for t in range(n_bars - lag):
                        d = (src[t] - cen[t]) * val[t]
                        a1[t] = d
                        a2[t] = d * d
                else:
                    for t in range(n_bars - lag):
                        d = (src[t] - cen[t]) * val[t]
                        a1[t] += d
                        a2[t] += d * d
        for t in range(n_bars):
            out[s, t, 0] = s1[t]
            out[s, t, 1] = s2[t]


@numba.njit(**_JIT)
def co_moment(ra, rb, v, ca, cb, n, out):
    """out[s, t] = sum over the window of ((ra - ca[t]) * (rb - cb[t])) * v (moments._co_moment)."""
    n_sym, n_bars = ra.shape
    acc = np.empty(n_bars)
    for s in range(n_sym):
        xa, xb, w, cx, cy = ra[s], rb[s], v[s], ca[s], cb[s]
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            for t in range(min(lag, n_bars)):
                d = ((0.0 - cx[t]) * (0.0 - cy[t])) * 0.0
                acc[t] = d if first else acc[t] + d
            if lag < n_bars:
                sa, sb, val, ka, kb, dst = (xa[: n_bars - lag], xb[: n_bars - lag], w[: n_bars - lag], cx[lag:],
                                            cy[lag:], acc[lag:])
                if first:
                    for t in range(n_bars - lag):
                        dst[t] = ((sa[t] - ka[t]) * (sb[t] - kb[t])) * val[t]
                else:
                    for t in range(n_bars - lag):
                        dst[t] += ((sa[t] - ka[t]) * (sb[t] - kb[t])) * val[t]
        out[s, :] = acc


@numba.njit(**_JIT)
def position_sums(raw, v, c, n, out):
    """out[s, t] = (sum vp, sum vp * slot, sum (raw - c[t]) * vp) with vp = v * slot, slot = k - (n - 1) / 2
    (moments._position_sums)."""
    n_sym, n_bars = raw.shape
    half = (n - 1) / 2
    sx, sxx, sxy = np.empty(n_bars), np.empty(n_bars), np.empty(n_bars)
    for s in range(n_sym):
        r, w, ct = raw[s], v[s], c[s]
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            slot = (n - 1 - lag) - half
            for t in range(min(lag, n_bars)):
                vp = 0.0 * slot
                xy = (0.0 - ct[t]) * vp
                sx[t] = vp if first else sx[t] + vp
                sxx[t] = vp * slot if first else sxx[t] + vp * slot
                sxy[t] = xy if first else sxy[t] + xy
            if lag < n_bars:
                src, val, cen, a, b, e = (r[: n_bars - lag], w[: n_bars - lag], ct[lag:], sx[lag:], sxx[lag:],
                                          sxy[lag:])
                if first:
                    for t in range(n_bars - lag):
                        vp = val[t] * slot
                        a[t] = vp
                        b[t] = vp * slot
                        e[t] = (src[t] - cen[t]) * vp
                else:
                    for t in range(n_bars - lag):
                        vp = val[t] * slot
                        a[t] += vp
                        b[t] += vp * slot
                        e[t] += (src[t] - cen[t]) * vp
        for t in range(n_bars):
            out[s, t, 0] = sx[t]
            out[s, t, 1] = sxx[t]
            out[s, t, 2] = sxy[t]


# The element-wise tail of Var and Corr/Cov on the window sums (moments._var, _pair): the same operations in
# the same order as the torch code, in one pass instead of ~10-30 over the panel. (Square roots stay in torch:
# its CPU sqrt is not always the correctly rounded one that numba's is.)


@numba.njit(**_JIT)
def var_tail(cnt, s1, s2, flat, out):
    """((s2 - s1 * s1 / cnt) / (cnt - 1)).clamp(min=0), 0 where flat, NaN below 2 values."""
    n_sym, n_bars = cnt.shape
    for s in range(n_sym):
        for t in range(n_bars):
            c = cnt[s, t]
            v = (s2[s, t] - s1[s, t] * s1[s, t] / c) / (c - 1)
            if v < 0:
                v = 0.0
            if flat[s, t]:
                v = 0.0
            out[s, t] = v if c >= 2 else np.nan


@numba.njit(**_JIT)
def pair_tail(cnt, sa, sb, co, s2a, s2b, flat_a, flat_b, corr, num, prod):
    """Cov (corr False): num = sab / (cnt - 1), NaN below 2 values. Corr: num = sab, prod = saa * sbb, num NaN
    where below 2 values or a second moment is 0 (the caller divides by sqrt(prod) and applies the std guard)."""
    n_sym, n_bars = cnt.shape
    for s in range(n_sym):
        for t in range(n_bars):
            c = cnt[s, t]
            sab = co[s, t] - sa[s, t] * sb[s, t] / c
            if not corr:
                num[s, t] = sab / (c - 1) if c >= 2 else np.nan
                continue
            saa = s2a[s, t] - sa[s, t] * sa[s, t] / c
            sbb = s2b[s, t] - sb[s, t] * sb[s, t] / c
            if saa < 0:
                saa = 0.0
            if sbb < 0:
                sbb = 0.0
            if flat_a[s, t]:
                saa = 0.0
            if flat_b[s, t]:
                sbb = 0.0
            prod[s, t] = saa * sbb
            num[s, t] = sab if (c >= 2 and saa != 0 and sbb != 0) else np.nan


# Whole-window statistics about the window's own mean (rolling.r_skew, r_kurt, r_mad): slot k of the window
# ending at t reads bar t - n + 1 + k (invalid before the block, as rolling's NaN padding); sums oldest slot
# first, like moments.oldest_first in the torch code.


@numba.njit(**_JIT)
def central_sums(x, n, power, out):
    """out[s, t] = (count, sum d * d, sum p) over the window's valid values, d = x - mean (0 for a NaN slot),
    p = d * d * d (power 3), (d * d) * (d * d) (power 4) or |d| (power 1); mean = (sum of valid x) / count."""
    n_sym, n_bars = x.shape
    cnt, tot, s2, sp = np.empty(n_bars), np.empty(n_bars), np.empty(n_bars), np.empty(n_bars)
    for s in range(n_sym):
        row = x[s]
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            for t in range(min(lag, n_bars)):  # the slot lies before the block: a NaN slot, term +0.0
                cnt[t] = 0.0 if first else cnt[t]
                tot[t] = 0.0 if first else tot[t] + 0.0
            if lag < n_bars:
                src, c, a = row[: n_bars - lag], cnt[lag:], tot[lag:]
                for t in range(n_bars - lag):
                    v = src[t]
                    ok = not math.isnan(v)
                    term = v if ok else 0.0
                    c[t] = (1.0 if ok else 0.0) if first else c[t] + (1.0 if ok else 0.0)
                    a[t] = term if first else a[t] + term
        for t in range(n_bars):
            tot[t] = tot[t] / cnt[t]  # the mean
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            for t in range(min(lag, n_bars)):
                d = 0.0
                d2 = d * d
                p = abs(d) if power == 1 else (d2 * d if power == 3 else d2 * d2)
                s2[t] = d2 if first else s2[t] + d2
                sp[t] = p if first else sp[t] + p
            if lag < n_bars:
                src, mean, a2, ap = row[: n_bars - lag], tot[lag:], s2[lag:], sp[lag:]
                for t in range(n_bars - lag):
                    v = src[t]
                    d = v - mean[t] if not math.isnan(v) else 0.0
                    d2 = d * d
                    p = abs(d) if power == 1 else (d2 * d if power == 3 else d2 * d2)
                    a2[t] = d2 if first else a2[t] + d2
                    ap[t] = p if first else ap[t] + p
        for t in range(n_bars):
            out[s, t, 0] = cnt[t]
            out[s, t, 1] = s2[t]
            out[s, t, 2] = sp[t]


@numba.njit(**_JIT)
def weighted_mean(x, first, n, out):
    """Qlib's WMA (rolling.r_wma): sum of x * w over the window's valid slots, oldest first, w = 1 .. L for
    the L rows of the (truncated) window, / (L (L + 1) / 2), / the count of valid slots."""
    n_sym, n_bars = x.shape
    acc, cnt = np.empty(n_bars), np.empty(n_bars)
    for s in range(n_sym):
        row, res = x[s], out[s]
        for lag in range(n - 1, -1, -1):
            first_slot = lag == n - 1
            k = n - 1 - lag  # the slot's index in the window
            for t in range(min(lag, n_bars)):
                cnt[t] = 0.0 if first_slot else cnt[t]
                acc[t] = 0.0 if first_slot else acc[t] + 0.0
            if lag < n_bars:
                src, a, c = row[: n_bars - lag], acc[lag:], cnt[lag:]
                for t in range(n_bars - lag):
                    end = t + lag
                    length = float(min(max(end - first[s] + 1, 0), n))
                    weight = (float(k) - (float(n) - length)) + 1.0
                    v = src[t]
                    ok = not math.isnan(v)
                    term = v * weight if ok else 0.0
                    c[t] = (1.0 if ok else 0.0) if first_slot else c[t] + (1.0 if ok else 0.0)
                    a[t] = term if first_slot else a[t] + term
        for t in range(n_bars):
            length = float(min(max(t - first[s] + 1, 0), n))
            res[t] = acc[t] / (length * (length + 1.0) / 2.0) / cnt[t]


@numba.njit(**_JIT)
def weighted_window(x, weight, out):
    """smooth._ewm's windows: (sum of x * weight) / (sum of weight) over the valid slots of the len(weight)
    bars ending at each bar, each sum oldest slot first (NaN slots and bars before the block add +0.0)."""
    n_sym, n_bars = x.shape
    n = weight.shape[0]
    num, den = np.empty(n_bars), np.empty(n_bars)
    for s in range(n_sym):
        row = x[s]
        for lag in range(n - 1, -1, -1):
            first = lag == n - 1
            w = weight[n - 1 - lag]
            for t in range(min(lag, n_bars)):
                num[t] = 0.0 if first else num[t] + 0.0
                den[t] = 0.0 if first else den[t] + 0.0
            if lag < n_bars:
                src, a, b = row[: n_bars - lag], num[lag:], den[lag:]
                for t in range(n_bars - lag):
                    v = src[t]
                    ok = not math.isnan(v)
                    p = v * w if ok else 0.0
                    q = w if ok else 0.0
                    a[t] = p if first else a[t] + p
                    b[t] = q if first else b[t] + q
        for t in range(n_bars):
            out[s, t] = num[t] / den[t]
