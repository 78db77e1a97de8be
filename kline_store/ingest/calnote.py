"""What a union calendar costs: dates that only a few symbols trade (a European index among US stocks, a
Hong Kong holiday in a Shanghai list) are NaN days for every other symbol, and each such day drops the windows
of the others that cross it. Ingest reports them; ``days="symbol"`` in the dataset (windows over each symbol's
own bars) or ``--calendar`` (a trading calendar, or an exchange code) is the way out.
"""

from __future__ import annotations

import numpy as np

WINDOW = 64            # the window length the cost is reported for (the datasets' default)
MINORITY = 0.5         # a date traded by fewer than this share of the symbols listed on it is "foreign"
# (and so is a date traded by one of two listed symbols: a US stock beside a European index)


def _valid_windows(present: np.ndarray, window: int, rows: int = 512) -> np.ndarray:
    """Per symbol: windows of ``window`` bars with a next bar (horizon 1), every cell present (``rows`` symbols
    at a time: bounded memory)."""
    n_sym, n = present.shape
    out = np.zeros(n_sym, dtype=np.int64)
    if n < window + 1:
        return out
    span = window + 1                       # t - window + 1 .. t + 1
    for lo in range(0, n_sym, rows):
        p = present[lo: lo + rows]
        c = np.concatenate([np.zeros((len(p), 1), np.int32), np.cumsum(p, axis=1, dtype=np.int32)], axis=1)
        out[lo: lo + rows] = ((c[:, span:] - c[:, :-span]) == span).sum(axis=1)
    return out


def foreign_dates(present: np.ndarray, first: np.ndarray, last: np.ndarray, dates: np.ndarray,
                  symbols: list[str], window: int = WINDOW) -> str | None:
    """One summary line when some dates are traded by a minority of the symbols listed on them, else None.

    Args:
        present: [n_symbols, n_dates] bool, a bar on the date.
        first, last: each symbol's first and last bar (calendar index, -1 without bars).
        dates: the calendar (for the examples).
        symbols: names, for the most affected one.
    """
    n_sym, n = present.shape
    if n_sym < 2 or n < 2:
        return None
    idx = np.arange(n)
    listed = (idx[None, :] >= first[:, None]) & (idx[None, :] <= last[:, None]) & (first[:, None] >= 0)
    n_listed = listed.sum(axis=0)
    n_trading = present.sum(axis=0)
    strict = (n_listed >= 2) & (n_trading < MINORITY * n_listed)
    pair = (n_listed == 2) & (n_trading == 1)     # one of two symbols: a date of one market only
    foreign = strict | pair
    if not foreign.any():
        return None
    with_all = _valid_windows(present, window)
    keep = ~foreign
    without = _valid_windows(present[:, keep], window)
    lost = np.maximum(without - with_all, 0)          # windows a symbol loses to the foreign dates
    affected = listed[:, foreign].any(axis=1) & ~present[:, foreign].all(axis=1)
    k = np.flatnonzero(foreign)
    shown = ", ".join(str(dates[i]) for i in k[:3]) + (", ..." if len(k) > 3 else "")
    worst = int(np.argmax(lost))
    cost = (f"with window={window}: {int(lost.sum()):,} of {int(without.sum()):,} windows lost"
            + (f", {symbols[worst]} {int(lost[worst]):,} of {int(without[worst]):,} "
               f"({lost[worst] / max(1, without[worst]):.1%})" if lost[worst] else ""))
    who = ("fewer than half of the symbols listed then" if not (pair & ~strict).any() else
           "one of the two symbols listed then" if not (strict & ~pair).any() else
           "fewer than half (or one of two) of the symbols listed then")
    return (f"calendar: {len(k)} date(s) traded by {who} ({shown}) are NaN "
            f"days for {int(affected.sum())} symbol(s); {cost}; use days='symbol' in the dataset (windows over "
            f"each symbol's own bars) or ingest with --calendar FILE|EXCHANGE")
