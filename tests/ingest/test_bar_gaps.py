"""Gaps of grouped bars a chunk at a time (bar_gaps.py) agree with the sorted reference definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kline_store.ingest import bar_gaps, barsize
from kline_store.store import timeaxis


def _grouped(rng, n_groups, descending, dup=False):
    """Bars whose groups come together, each in time order (oldest or newest first)."""
    parts = []
    for g in range(n_groups):
        n = int(rng.integers(1, 30))
        t = np.sort(rng.choice(np.arange(0, 400), size=n, replace=dup)).astype(np.int64)
        parts.append((g, t[::-1] if descending[g % len(descending)] else t))
    order = rng.permutation(len(parts))
    return [parts[i] for i in order]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(st.booleans(), min_size=1, max_size=4), st.booleans(),
       st.sampled_from([3, 7, 1 << 21]))
def test_by_file_of_grouped_bars_matches_the_sorted_definition(seed, descending, dup, step):
    rng = np.random.default_rng(seed)
    runs_ = _grouped(rng, 12, descending, dup)
    n_sym = 4
    days = np.concatenate([t * int(rng.choice([1, 7, 30, 100])) + 15000 for _, t in runs_])   # gaps past CLIP
    sym = np.concatenate([np.full(len(t), g % n_sym) for g, t in runs_])
    file = np.concatenate([np.full(len(t), g // n_sym) for g, t in runs_])
    old = bar_gaps.STEP
    bar_gaps.STEP = step
    try:
        got = barsize.by_file(days, sym, file)
    finally:
        bar_gaps.STEP = old
    assert got == barsize._by_file_sorted(days, sym, file, 1)


def test_split_or_unsorted_groups_are_refused_then_sorted():
    days = np.array([1, 2, 3, 1, 2], dtype=np.int64)
    sym = np.array([0, 0, 1, 1, 0])            # symbol 0 comes back after symbol 1: split
    file = np.zeros(5, dtype=np.int64)
    with pytest.raises(bar_gaps.NotGrouped):
        list(bar_gaps.chunks(5, bar_gaps.column(file * 2 + sym), bar_gaps.column(days), 2))
    zigzag = np.array([1, 3, 2], dtype=np.int64)   # neither oldest nor newest first
    with pytest.raises(bar_gaps.NotGrouped):
        list(bar_gaps.chunks(3, bar_gaps.column(np.zeros(3)), bar_gaps.column(zigzag), 1, step=2))
    assert barsize.by_file(days * 7, sym, file) == barsize._by_file_sorted(days * 7, sym, file, 1)


def _minute_bars(rng, n_sym, descending):
    minute, sym = [], []
    for s in rng.permutation(n_sym):
        for day in range(3):
            base = (19000 + day) * 1440 + 570
            gap = int(rng.choice([1, 5, 5, 5, 15]))
            t = base + gap * np.arange(int(rng.integers(1, 12)))
            if rng.random() < 0.3 and len(t) > 2:
                t[1] = t[0] + 1                  # a bar finer than the rest
            minute.append(t[::-1] if descending else t)
            sym.append(np.full(len(t), s))
    return np.concatenate(minute).astype(np.int64), np.concatenate(sym)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.booleans(), st.sampled_from([2, 5, 1 << 21]))
def test_minute_gaps_of_grouped_bars_match_the_sorted_definition(seed, descending, step):
    rng = np.random.default_rng(seed)
    minute, sym = _minute_bars(rng, 5, descending)
    old = bar_gaps.STEP
    bar_gaps.STEP = step
    try:
        try:
            want = timeaxis.detect_freq(minute, sym)
        except Exception as exc:                  # a gap that does not divide a day: the same error
            with pytest.raises(type(exc)):
                bar_gaps.detect_freq(minute, sym, 5)
        else:
            assert bar_gaps.detect_freq(minute, sym, 5) == want
        for freq in ("5min", "15min"):
            assert bar_gaps.finer_than(freq, minute, sym, 5) == timeaxis.finer_than(freq, minute, sym)
    finally:
        bar_gaps.STEP = old


def test_histogram_median_is_numpys():
    for values in ([3], [1, 2], [1, 1, 5, 9], [2, 2, 2, 7, 7], list(range(10)), [0, 0, 4]):
        assert bar_gaps.median(np.bincount(values)) == float(np.median(values))


def test_clipped_gaps_keep_the_class():
    """A median of gaps clipped at CLIP classifies as the exact one, an even count's average included."""
    for gaps in ([44, 100], [45, 46], [4, 500], [40, 90, 200, 300], [1, 2, 3, 46, 47, 48]):
        clipped = np.minimum(gaps, barsize.CLIP)
        assert barsize.classify(float(np.median(clipped))) == barsize.classify(float(np.median(gaps)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-10**6, 10**6), min_size=0, max_size=50), st.integers(0, 3))
def test_unique_keys_and_key_index(values, spread):
    keys = np.asarray(values, dtype=np.int64) * (10 ** spread)     # dense, then too sparse for a table
    assert timeaxis.unique_keys(keys).tolist() == np.unique(keys).tolist()
    cal = np.unique(keys[: len(keys) // 2])
    want = np.array([int(np.flatnonzero(cal == k)[0]) if k in cal else -1 for k in keys], dtype=np.int64)
    assert timeaxis.KeyIndex(cal).find(keys).tolist() == want.tolist()
