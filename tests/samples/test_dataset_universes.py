"""Datasets with a universe: exactly the plain dataset's samples whose day t is a member day of their symbol, in
every index (full, segment blocks, day blocks), every dataset (KlineDataset, CrossSectionDataset, make_splits,
FeatureWindows) and every way in (ds[i], gather, loader, pickled workers). Hypothesis draws the spans."""

from __future__ import annotations

import pickle

import numpy as np
import polars as pl
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kline_store as ks
from kline_store.errors import InputError
from kline_store.samples import blocks

N_SYM, N_DATES = 10, 160
START = np.datetime64("2020-01-01", "D")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KLINE_STORE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(11)
    return make_store(tmp_path_factory.mktemp("uni") / "s", random_panel(rng, N_SYM, N_DATES, holes=0.03))


@st.composite
def memberships(draw):
    """Rows of (symbol, start, end or None): per symbol up to three spans, apart, from before the calendar to after
    it, the last perhaps open; some symbols never members."""
    rows = []
    for s in range(N_SYM):
        if draw(st.integers(0, 4)) == 0:
            continue                                     # never a member
        cuts = sorted(draw(st.sets(st.integers(-10, N_DATES + 10), min_size=2, max_size=6)))
        pairs = list(zip(cuts[::2], cuts[1::2]))
        for k, (a, b) in enumerate(pairs):
            open_end = k == len(pairs) - 1 and draw(st.booleans())
            rows.append((f"S{s:03d}", START + a, None if open_end else START + b))
    return rows


def reference(rows) -> np.ndarray:
    days = START + np.arange(N_DATES)
    out = np.zeros((N_SYM, N_DATES), dtype=bool)
    for sym, a, b in rows:
        out[int(sym[1:])] |= (days >= a) & ((days <= b) if b is not None else True)
    return out


def put(store, rows, name: str = "u") -> None:
    frame = pl.DataFrame({"symbol": [r[0] for r in rows] or ["S000"],
                          "start": [str(r[1]) for r in rows] or ["2000-01-03"],
                          "end": [None if r[2] is None else str(r[2]) for r in rows] or ["2000-01-04"]})
    ks.set_universe(store, name, frame)


def on_member_days(valid: np.ndarray, member: np.ndarray) -> np.ndarray:
    return valid[member.reshape(-1)[valid]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=memberships(), window=st.integers(1, 12), horizon=st.integers(1, 3),
       opts=st.sampled_from([{}, {"missing": "ffill"}, {"days": "symbol"}, {"start": "2020-02-01",
                                                                             "end": "2020-04-30"}]))
def test_windows_are_the_plain_ones_on_member_days(store, rows, window, horizon, opts):
    put(store, rows)
    member = reference(rows)
    np.testing.assert_array_equal(ks.open_store(store).universe("u"), member)
    plain = ks.KlineDataset(store, window=window, horizon=horizon, **opts)
    want = on_member_days(plain.valid_index(), member)
    event("no member window" if not len(want) else "compared")
    if not len(want):
        with pytest.raises(InputError, match="no valid window"):
            ks.KlineDataset(store, window=window, horizon=horizon, universe="u", **opts)
        return
    uni = ks.KlineDataset(store, window=window, horizon=horizon, universe="u", **opts)
    np.testing.assert_array_equal(uni.valid_index(), want)
    pick = np.arange(len(uni))[:: max(1, len(uni) // 50)]
    a = uni.gather_batch(pick)
    b = plain.gather_flat(want[pick])
    assert all(torch.equal(a[k], b[k]) for k in a)
    if opts.get("days") != "symbol":
        blk = ks.KlineDataset(store, window=window, horizon=horizon, universe="u", index="blocks", **opts)
        assert len(blk) == len(want)
        np.testing.assert_array_equal(blk._index()[np.arange(len(blk))], want)
        xs_full = ks.CrossSectionDataset(store, window=window, horizon=horizon, universe="u", index="full", **opts)
        xs_blk = ks.CrossSectionDataset(store, window=window, horizon=horizon, universe="u", index="blocks", **opts)
        days = np.unique(want % N_DATES)
        np.testing.assert_array_equal(xs_full.days, days)
        np.testing.assert_array_equal(xs_blk.days, days)
        for i in range(0, len(days), max(1, len(days) // 10)):
            cells = want[want % N_DATES == days[i]]
            np.testing.assert_array_equal(xs_full.day_windows(i), cells)
            np.testing.assert_array_equal(xs_blk.day_windows(i), cells)


def test_a_universe_enters_the_block_counts_and_their_cache_key(store, tmp_path):
    rows_a = [("S001", START + 10, None), ("S004", START, START + 80)]
    rows_b = [("S001", START + 50, None), ("S007", START, None)]
    put(store, rows_a, "a")
    put(store, rows_b, "b")
    st_ = ks.open_store(store)
    plain = ks.KlineDataset(store, window=8, index="blocks")
    ua = ks.KlineDataset(store, window=8, universe="a", index="blocks")
    ub = ks.KlineDataset(store, window=8, universe="b", index="blocks")
    assert ua._index().counts.sum() < plain._index().counts.sum() and not np.array_equal(
        ua._index().counts, ub._index().counts)
    keys = {blocks.cache_key(st_, ua.plan, *blocks.universe_key(m)) for m in (None, ua.member, ub.member)}
    assert len(keys) == 3
    again = ks.KlineDataset(store, window=8, universe="a", index="blocks")   # from the cache: the same counts
    np.testing.assert_array_equal(again._index().counts, ua._index().counts)
    full = ks.KlineDataset(store, window=8, universe="a", index="full")
    np.testing.assert_array_equal(ua.full_index(), full.valid_index())


def test_loaders_pickles_and_single_samples_keep_the_universe(store):
    rows = [("S002", START + 20, START + 90), ("S002", START + 100, None), ("S005", START, None)]
    put(store, rows)
    member = reference(rows)
    for index in ("full", "blocks"):
        ds = ks.KlineDataset(store, window=6, universe="u", index=index)
        again = pickle.loads(pickle.dumps(ds))                                # what a worker process rebuilds
        np.testing.assert_array_equal(again.full_index(), ds.full_index())
        for order in ("uniform", "blocks"):
            seen = [(int(s), int(t)) for b in ds.loader(batch_size=32, order=order, num_workers=2)
                    for s, t in zip(b["symbol"], b["t"])]
            assert len(seen) == len(set(seen)) == len(ds) and all(member[s, t] for s, t in seen)
        item = ds[len(ds) - 1]
        assert member[item["symbol"], item["t"]]
    cs = ks.CrossSectionDataset(store, window=6, universe="u", min_count=2)
    for b in cs.loader(batch_size=4, num_workers=0):
        for t, syms, mask in zip(b["t"], b["symbol"], b["mask"]):
            assert all(member[int(s), int(t)] for s in syms[mask])
            assert int(mask.sum()) >= 2


def test_splits_and_feature_windows_take_a_universe(store):
    rows = [("S001", START, START + 70), ("S003", START + 30, None), ("S008", START + 60, None)]
    put(store, rows)
    member = reference(rows)
    kw = dict(train=("2020-01-01", "2020-03-15"), valid=("2020-03-25", "2020-04-20"), test=("2020-04-30", None),
              window=5)
    plain, uni = ks.make_splits(store, **kw), ks.make_splits(store, universe="u", **kw)
    for a, b in zip(plain, uni):
        np.testing.assert_array_equal(b.valid_index(), on_member_days(a.valid_index(), member))
    exprs = {"MA3": "Mean($close, 3)/$close", "RET": "$close/Ref($close, 1) - 1"}
    fw, fu = ks.FeatureWindows(store, 4, exprs), ks.FeatureWindows(store, 4, exprs, universe="u")
    np.testing.assert_array_equal(fu.base.valid_index(), on_member_days(fw.base.valid_index(), member))
    b = fu.gather_batch(np.arange(len(fu)))
    flat = fu.base.valid_index()
    ref = fw.gather_batch(np.searchsorted(fw.base.valid_index(), flat))
    assert torch.equal(b["x"], ref["x"]) and torch.equal(b["y"], ref["y"])


def test_a_universe_errors_in_one_line(store):
    put(store, [("S001", START + 1000, None)])        # members only after the calendar
    with pytest.raises(InputError, match=r"no universe 'nope'; its universes: .*u"):
        ks.KlineDataset(store, window=5, universe="nope")
    with pytest.raises(InputError, match="universe 'u' has no member on any day of the range"):
        ks.KlineDataset(store, window=5, universe="u")
    with pytest.raises(InputError, match="universe="):
        ks.KlineDataset(store, window=5, universe=3)
