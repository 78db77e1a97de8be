"""Every operator against Qlib 0.9.7 itself: random instruments with NaN runs, suspensions, flat runs, ties
and differing first/last bars, written with Qlib's storage classes and computed by D.features."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kline_store.features.evaluate import evaluate

sys.path.insert(0, str(Path(__file__).parent))
from qlib_run import agreement, qlib_features  # noqa: E402
from qlib_run import one_thread  # noqa: E402,F401  (an autouse fixture)

WINDOWED = ["Mean", "Sum", "Std", "Var", "Max", "Min", "IdxMax", "IdxMin", "Med", "Mad", "Rank", "Count",
            "Delta", "Slope", "Rsquare", "Resi", "WMA"]

EXPRS = [
    "$close+$open", "$close-$open*2", "$close/$open", "2/$open", "Power($close, 2)", "$close**0.5",
    "Abs($close-$open)", "Log($volume)", "Sign($close-$open)", "Greater($close, $open)", "Less($close, 10)",
    "Gt($close, $open)", "$close >= $open", "$close < Ref($close, 1)", "Le($close, $open)",
    "Eq($close, Ref($close, 1))", "Ne($close, Ref($close, 1))", "($close > $open) & ($volume > 1000)",
    "($close > $open) | ($volume > 1000)", "If($close > $open, $close, $open)", "If($close > $open, 1, 0)",
    "($high-$low)/($high-$low+1e-12)",
    *[f"{op}($close, {n})" for op in WINDOWED for n in (5, 20, 0)],
    *[f"{op}($volume, 10)" for op in WINDOWED],
    "Mean($close, 1)", "Sum($close>$open, 5)", "Mean($close>Ref($close, 1), 10)",
    "Skew($close, 5)", "Skew($volume, 20)", "Skew($close, 0)", "Kurt($close, 6)", "Kurt($volume, 20)",
    "Kurt($close, 0)", "Quantile($close, 10, 0.8)", "Quantile($volume, 7, 0.25)", "Quantile($close, 0, 0.2)",
    "EMA($close, 5)", "EMA($volume, 20)", "EMA($close, 0.3)", "EMA($close, 0)", "EMA($close, 1)",
    "Ref($close, 1)", "Ref($close, 5)", "Ref($close, -2)", "Ref($close, 0)", "Delta($close, -1)",
    "Corr($close, $volume, 10)", "Corr($close, Log($volume), 5)", "Corr($close/Ref($close,1), $open, 20)",
    "Cov($close, $volume, 10)", "Cov($close, $open, 3)", "Rsquare($volume, 5)", "Slope($volume, 20)",
    "IdxMax($close, 60)/60", "Resi(Mean($close, 5), 10)", "Std(Ref($close, -1), 5)",
]


def make_panel(seed: int, n_sym: int = 6, n_bars: int = 160) -> dict:
    rng = np.random.default_rng(seed)
    dates = np.datetime_as_string(np.busday_offset("2020-01-01", np.arange(n_bars), roll="forward"), unit="D")
    edge = min(40, n_bars // 4)
    first = np.r_[0, rng.integers(0, edge, n_sym - 1)]
    last = np.r_[n_bars - 1, rng.integers(n_bars - edge, n_bars, n_sym - 1)]
    close = np.round(10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_bars)), axis=1)), 2)
    flat = n_bars // 3
    close[1, flat: flat + 10] = close[1, flat]  # a flat run: Corr/Rsquare guards, Skew/Kurt of a constant
    open_ = np.round(close * np.exp(rng.normal(0, 0.01, close.shape)), 2)
    high = np.maximum(open_, close) + np.round(rng.uniform(0, 0.2, close.shape), 2)
    low = np.minimum(open_, close) - np.round(rng.uniform(0, 0.2, close.shape), 2)
    high[-1, 30:33] = low[-1, 30:33] = open_[-1, 30:33] = close[-1, 30:33]  # limit-locked bars: high == low
    volume = np.round(rng.lognormal(8, 1, close.shape), -2)  # rounded: ties for Rank/IdxMax
    values = np.stack([close, open_, high, low, volume]).astype(np.float32)
    for s in range(n_sym):
        for _ in range(3):  # suspensions: whole NaN rows inside the span
            at = rng.integers(first[s] + 1, last[s])
            values[:, s, at: at + rng.integers(1, 6)] = np.nan
        holes = rng.random(n_bars) < 0.05
        values[4, s, holes] = np.nan  # volume alone missing
    values[:, n_sym // 2, first[n_sym // 2]] = np.nan  # a series whose first row is NaN (Ref(x, 0), IdxMax's NaN rule)
    values[:, np.arange(n_sym)[:, None], np.arange(n_bars)] *= np.where(
        (np.arange(n_bars) >= first[:, None]) & (np.arange(n_bars) <= last[:, None]), 1, np.nan)
    return {"dates": dates, "symbols": np.array([f"SH60{s:04d}" for s in range(n_sym)]),
            "fields": np.array(["close", "open", "high", "low", "volume"]), "values": values,
            "first": first.astype(np.int64), "last": last.astype(np.int64)}


def engine(panel: dict, exprs: list[str]) -> np.ndarray:
    values = {str(f): torch.from_numpy(panel["values"][k]) for k, f in enumerate(panel["fields"])}
    res = evaluate(exprs, values, torch.from_numpy(panel["first"]), torch.from_numpy(panel["last"]))
    return res.values.permute(2, 0, 1).numpy()


@pytest.mark.parametrize("seed", [7, 2024])
def test_every_operator_matches_qlib(tmp_path, seed):
    panel = make_panel(seed)
    qlib = qlib_features(tmp_path, panel, EXPRS)
    ours = engine(panel, EXPRS)
    t = np.arange(len(panel["dates"]))
    span = (t >= panel["first"][:, None]) & (t <= panel["last"][:, None])
    assert np.array_equal(qlib["returned"], span), "Qlib's rows differ from the symbols' spans"
    assert np.isnan(ours[:, ~span]).all(), "cells outside a span must be NaN"
    bad = []
    for k, expr in enumerate(EXPRS):
        assert np.isfinite(qlib["values"][k][span]).mean() > 0.3, f"{expr}: Qlib gave too few values to compare"
        ok = agreement(ours[k][span], qlib["values"][k][span])
        if not ok.all():
            s, b = np.argwhere(span)[np.flatnonzero(~ok)[0]]
            bad.append(f"{expr}: {int((~ok).sum())} of {ok.size} cells differ, e.g. symbol {s} bar {b}: "
                       f"engine {ours[k, s, b]!r} vs Qlib {qlib['values'][k, s, b]!r}")
    assert not bad, "\n".join(bad)
