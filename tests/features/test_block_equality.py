"""A cell's rounding does not depend on where its block starts (issue 26 part 7): evaluated from any later block
start with enough history, `features --update` at any block size, and FeatureWindows' short blocks all give the
full computation's float32 bits exactly (NaN equal to NaN), on series whose window sums cancel badly."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kline_store import FeatureWindows, append, compute_features, ingest, open_store, update_features
from kline_store.features.evaluate import evaluate, lookback
from kline_store.store.snapshot import verify_store
from kline_store.features.parse import parse

# The four that differed (CORR5, RESI5, RESI20, RSQR20), the rest of the window-sum family, and a few
# whole-window operators, on a price far from 0 and a small move: the sums cancel to a few bits.
EXPRS = {"CORR5": "Corr($close, Log($volume+1), 5)", "RESI5": "Resi($close, 5)/$close",
         "RESI20": "Resi($close, 20)/$close", "RSQR20": "Rsquare($close, 20)", "BETA10": "Slope($close, 10)/$close",
         "CORD10": "Corr($close/Ref($close,1), Log($volume/Ref($volume, 1)+1), 10)", "STD5": "Std($close, 5)",
         "VAR20": "Var($high-$low, 20)", "COV10": "Cov($close, $volume, 10)", "MEAN7": "Mean($close, 7)/$close",
         "SUM3": "Sum($close-$open, 3)", "WVMA5": "Std(Abs($close/Ref($close, 1)-1)*$volume, 5)/"
         "(Mean(Abs($close/Ref($close, 1)-1)*$volume, 5)+1e-12)", "SKEW6": "Skew($close, 6)", "WMA4": "WMA($close, 4)",
         "RANK5": "Rank($close, 5)", "MAX9": "Max($high, 9)", "NESTED": "Std(Mean($close, 3), 4)"}


def prices(seed: int, n_sym: int, n_days: int, level: float) -> dict[str, np.ndarray]:
    """A price that rises a hundredfold over the first 40 days, then moves by about 0.001% a day: window sums
    about any centre far from the window (the series' first value) lose their low bits to cancellation."""
    rng = np.random.default_rng(seed)
    steps = np.where(np.arange(n_days) < 40, np.log(100) / 40, 0.0) + rng.normal(0, 1e-5, (n_sym, n_days))
    close = level * np.exp(np.cumsum(steps, 1))
    close = close.astype(np.float32)
    close[rng.random(close.shape) < 0.06] = np.nan                           # suspensions
    vol = rng.integers(1000, 90000, close.shape).astype(np.float32)
    vol[rng.random(close.shape) < 0.03] = 0.0
    return {"close": close, "open": close * np.float32(1.0003), "high": close * np.float32(1.002),
            "low": close * np.float32(0.998), "volume": vol}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), start=st.integers(1, 150), level=st.sampled_from([1.0, 37.5, 4321.0, 1e5]))
def test_any_later_block_start_gives_the_full_blocks_bits(seed, start, level):
    n_sym, n_days = 9, 190
    vals = prices(seed, n_sym, n_days, level)
    first = torch.from_numpy(np.random.default_rng(seed).integers(0, 60, n_sym))   # late listings
    last = torch.full((n_sym,), n_days - 1)
    full = evaluate(EXPRS, {k: torch.from_numpy(v) for k, v in vals.items()}, first, last).values.numpy()
    part = evaluate(EXPRS, {k: torch.from_numpy(np.ascontiguousarray(v[:, start:])) for k, v in vals.items()},
                    first - start, last - start).values.numpy()
    for k, (name, expr) in enumerate(EXPRS.items()):
        back = lookback(parse(expr))
        for s in range(n_sym):
            ok = max(0, back - max(0, int(first[s]) - start))       # history the block holds for this symbol
            a, b = full[s, start + ok:, k], part[s, ok:, k]
            assert same(a, b), (name, s, start, np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b))))[:5])


def bar_frames(seed: int, n_sym: int, n_days: int) -> dict[str, pl.DataFrame]:
    vals = prices(seed, n_sym, n_days, 2500.0)
    days = np.busday_offset("2020-01-02", np.arange(n_days), roll="forward").astype(str)
    out = {}
    for s in range(n_sym):
        keep = np.isfinite(vals["close"][s])
        keep[: 7 * s] = False                                                  # listed later
        out[f"S{s}"] = pl.DataFrame({"date": days, **{k: v[s].astype(np.float64) for k, v in vals.items()}}) \
            .filter(pl.Series(keep))
    return out


def write(folder, frames: dict[str, pl.DataFrame], lo: str | None, hi: str | None):
    folder.mkdir(parents=True, exist_ok=True)
    for sym, df in frames.items():
        part = df.filter((pl.col("date") >= (lo or "")) & (pl.col("date") < (hi or "9999")))
        if len(part):
            part.write_csv(folder / f"{sym}.csv")
    return folder


def cells(path) -> np.ndarray:
    with open_store(path) as s:
        return np.array(s.panel)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(40, 150), grow=st.integers(1, 30), block=st.sampled_from([None, 1, 2, 5]),
       block2=st.sampled_from([None, 1, 3]))
def test_update_equals_a_full_recompute_at_every_block_size(tmp_path_factory, cut, grow, block, block2):
    tmp = tmp_path_factory.mktemp("upd")
    frames = bar_frames(7, 6, 190)
    days = np.busday_offset("2020-01-02", np.arange(190), roll="forward").astype(str)
    base = tmp / "base"
    ingest([write(tmp / "a", frames, None, days[cut])], base)
    compute_features(base, tmp / "f", sets=[], exprs=EXPRS, block_symbols=block)
    append(base, [write(tmp / "b", frames, days[cut], days[min(189, cut + grow)])])
    rep = update_features(tmp / "f", block_symbols=block2)
    assert rep.mode == "tail", rep.reason
    compute_features(base, tmp / "full", sets=[], exprs=EXPRS)
    assert same(cells(tmp / "f"), cells(tmp / "full"))


def test_feature_windows_equal_the_features_store_bit_for_bit(tmp_path):
    frames = {s: df.filter(pl.col("close").is_not_null()) for s, df in bar_frames(11, 5, 150).items()}
    base = tmp_path / "base"
    ingest([write(tmp_path / "a", frames, None, None)], base)
    exprs = EXPRS
    compute_features(base, tmp_path / "f", sets=[], exprs=exprs, label=None)
    stored = cells(tmp_path / "f")
    for window in (1, 4):
        fw = FeatureWindows(base, window, exprs)
        idx = np.arange(len(fw))
        got = fw.gather_batch(idx)["x"].numpy()
        s, t = fw.base.locate(idx)
        want = np.stack([stored[s[k], t[k] - window + 1: t[k] + 1] for k in range(len(idx))])
        assert len(idx) > 100 and same(got, want), np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want))))[:5]


def test_an_update_of_a_store_shorter_than_its_longest_window_appends_only_new_days(tmp_path):
    """History shorter than the look-back: the update reads from the first day and writes the new days only
    (the old rows' committed cells and their checksums stay as they are)."""
    frames = bar_frames(3, 4, 70)
    days = np.busday_offset("2020-01-02", np.arange(70), roll="forward").astype(str)
    base = tmp_path / "base"
    ingest([write(tmp_path / "a", frames, None, days[50])], base)
    compute_features(base, tmp_path / "f", sets=[], exprs={"M60": "Mean($close, 60)", "R20": "Resi($close, 20)"})
    append(base, [write(tmp_path / "b", frames, days[50], None)])
    assert update_features(tmp_path / "f").mode == "tail"
    compute_features(base, tmp_path / "full", sets=[], exprs={"M60": "Mean($close, 60)", "R20": "Resi($close, 20)"})
    assert same(cells(tmp_path / "f"), cells(tmp_path / "full"))
    with open_store(tmp_path / "f") as a, open_store(tmp_path / "full") as b:
        assert a.manifest["data"]["row_crc32"] == b.manifest["data"]["row_crc32"]
    assert verify_store(tmp_path / "f") == []
