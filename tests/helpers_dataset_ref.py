"""Brute-force references and small synthetic stores for the window / dataset / loader tests.

The references loop over symbols, days and window cells in plain Python, written straight from the rules in
the docs, independently of the vectorised code in kline_store.samples.windows and kline_store.samples.dataset.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

FIELDS = ["open", "high", "low", "close", "volume", "amount"]
PRICE = {"open", "high", "low", "close", "pre_close", "vwap", "change"}
VOLUME_LIKE = {"volume", "amount", "turnover"}


# --------------------------------------------------------------------------- synthetic panels and stores


def random_panel(rng: np.random.Generator, n_sym: int, n_dates: int, fields: list[str] = FIELDS,
                 holes: float = 0.05) -> np.ndarray:
    """[n_sym, n_dates, len(fields)] float32 K-line-like panel with late listings, delistings, suspensions
    and scattered NaN cells."""
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_dates)), axis=1))
    cols = {"open": close * (1 + rng.normal(0, 0.005, close.shape)), "high": close * 1.01,
            "low": close * 0.99, "close": close, "volume": rng.lognormal(10, 1, close.shape),
            "amount": rng.lognormal(14, 1, close.shape), "adj_factor": np.ones_like(close)}
    panel = np.stack([cols.get(f, rng.normal(0, 1, close.shape)) for f in fields], axis=2).astype(np.float32)
    for s in range(n_sym):
        r = rng.random()
        if r < 0.2:
            panel[s, : rng.integers(0, n_dates)] = np.nan  # listed late
        elif r < 0.35:
            panel[s, rng.integers(0, n_dates):] = np.nan  # delisted
        if rng.random() < 0.3:
            a = rng.integers(0, n_dates)
            panel[s, a: a + rng.integers(1, 12)] = np.nan  # suspension
    cells = rng.random(panel.shape) < holes / len(fields)
    panel[cells] = np.nan
    return panel


def make_store(path: Path, panel: np.ndarray, fields: list[str] = FIELDS, start: str = "2020-01-01",
               symbols: list[str] | None = None) -> Path:
    from kline_store.store import create_store

    n_sym, n_dates = panel.shape[:2]
    dates = np.datetime64(start, "D") + np.arange(n_dates)
    create_store(path, panel, symbols or [f"S{i:03d}" for i in range(n_sym)], dates, fields)
    return path


def split_store(path: Path, n_dates: int = 40, split_day: int = 20, ratio: float = 7.0) -> Path:
    """One symbol with a ``ratio``:1 split at ``split_day``, plus a control symbol without corporate actions.

    Raw prices drop by ``ratio`` and volume rises by ``ratio`` on the split day; ``adj_factor`` (cumulative,
    backward: raw * factor is continuous) is 1 before and ``ratio`` from the split day on.
    """
    fields = ["open", "high", "low", "close", "volume", "adj_factor"]
    smooth = 700 * np.exp(np.linspace(0, 0.1, n_dates))
    factor = np.where(np.arange(n_dates) >= split_day, ratio, 1.0)
    raw = smooth / factor
    vol = 1000 * factor
    a = np.stack([raw, raw * 1.01, raw * 0.99, raw, vol, factor], axis=1)
    b = np.stack([smooth, smooth * 1.01, smooth * 0.99, smooth, np.full(n_dates, 1000.0), np.ones(n_dates)], 1)
    return make_store(path, np.stack([a, b]).astype(np.float32), fields, symbols=["SPLIT", "PLAIN"])


# --------------------------------------------------------------------------- reference validity


def ref_valid(panel: np.ndarray, x_fields: list[int], close: int | None, window: int, horizon: int, lo: int,
              hi: int, label: str = "return", label_field: int | None = None, missing: str = "drop",
              max_missing: int | None = None, days: str = "calendar", adj: int | None = None
              ) -> list[tuple[int, int]]:
    """Valid ``(symbol, t)`` pairs, by the documented rules, one cell at a time."""
    n_sym, n_dates = panel.shape[:2]
    out = []
    adjust_label = adj is not None and label != "field"
    for s in range(n_sym):
        row = panel[s].astype(np.float64)

        def adj_ok(u: int, row: np.ndarray = row) -> bool:
            return adj is None or (math.isfinite(row[u, adj]) and row[u, adj] > 0)

        xok = [all(math.isfinite(row[u, f]) for f in x_fields) and adj_ok(u) for u in range(n_dates)]

        def base(t: int, row: np.ndarray = row) -> bool:
            if close is None:
                return True
            c = row[t, close]
            good = math.isfinite(c) and (c > 0 if label == "log_return" else c != 0)
            return good and (adj_ok(t) if adjust_label else True)

        def target(u: int, row: np.ndarray = row) -> bool:
            if label == "field":
                return math.isfinite(row[u, label_field])
            c = row[u, close]
            good = (c > 0) if label == "log_return" else math.isfinite(c)
            return bool(good) and (adj_ok(u) if adjust_label else True)

        if days == "calendar":
            for t in range(n_dates):
                if t < lo or t < window - 1 or t + horizon > hi or t + horizon >= n_dates:
                    continue
                cells = [xok[u] for u in range(t - window + 1, t + 1)]
                if missing == "drop":
                    ok = all(cells)
                else:
                    ok = xok[t] and (max_missing is None or cells.count(False) <= max_missing)
                if ok and base(t) and target(t + horizon):
                    out.append((s, t))
        else:
            bars = [u for u in range(n_dates) if xok[u]]
            for j, t in enumerate(bars):
                if j < window - 1 or j + horizon >= len(bars):
                    continue
                lab = bars[j + horizon]
                if t >= lo and lab <= hi and base(t) and target(lab):
                    out.append((s, t))
    return out


def ref_window_days(panel: np.ndarray, s: int, t: int, window: int, x_fields: list[int], days: str,
                    adj: int | None = None) -> list[int]:
    """Calendar days of the window ending at ``t``: consecutive days, or the symbol's last bars."""
    if days == "calendar":
        return list(range(t - window + 1, t + 1))
    row = panel[s]
    bars = [u for u in range(t + 1) if all(np.isfinite(row[u, f]) for f in x_fields)
            and (adj is None or (np.isfinite(row[u, adj]) and row[u, adj] > 0))]
    return bars[-window:]


def ref_sample(panel: np.ndarray, fields: list[str], x_names: list[str], s: int, t: int, window: int,
               horizon: int, *, label: str = "return", adjust: str = "none", missing: str = "drop",
               normalize: str = "none", stats: dict | None = None, days: str = "calendar"
               ) -> tuple[np.ndarray, float, np.ndarray]:
    """``(x, y, observed)`` of one sample in float64, computed cell by cell."""
    xi = [fields.index(f) for f in x_names]
    adj = fields.index("adj_factor") if adjust != "none" else None
    ci = fields.index("close") if "close" in fields else None
    wd = ref_window_days(panel, s, t, window, xi, days, adj)
    row = panel[s].astype(np.float64)
    x = np.array([[row[u, f] for f in xi] for u in wd])
    if adjust != "none":
        for k, u in enumerate(wd):
            ratio = row[u, adj] / row[t, adj] if adjust == "forward" else row[u, adj]
            for c, name in enumerate(x_names):
                if name in PRICE:
                    x[k, c] *= ratio
                elif name == "volume":
                    x[k, c] /= ratio
    observed = np.isfinite(x).all(axis=1)
    if missing == "ffill":
        first = int(np.argmax(observed))
        for k in range(window):
            if not observed[k]:
                x[k] = x[k - 1] if k > first else x[first]
    if days == "calendar":
        lab = t + horizon
    else:
        bars = [u for u in range(panel.shape[1]) if all(np.isfinite(row[u, f]) for f in xi)
                and (adj is None or (np.isfinite(row[u, adj]) and row[u, adj] > 0))]
        lab = bars[bars.index(t) + horizon]
    if label in ("return", "log_return"):
        c0, c1 = row[t, ci], row[lab, ci]
        if adjust != "none":
            c0, c1 = c0 * row[t, adj], c1 * row[lab, adj]
        y = c1 / c0 - 1 if label == "return" else math.log(c1 / c0)
    else:
        y = row[lab, fields.index(label)]
    if normalize == "window":
        last_close = row[t, ci] * (row[t, adj] if adjust == "backward" else 1.0)
        for c, name in enumerate(x_names):
            if name in PRICE:
                x[:, c] /= last_close
            elif name in VOLUME_LIKE:
                m = x[:, c].mean()
                if m > 0:
                    x[:, c] /= m
    elif normalize == "zscore":
        assert stats is not None
        x = (x - np.array(stats["mean"])) / np.array(stats["std"])
    return x, float(y), observed
