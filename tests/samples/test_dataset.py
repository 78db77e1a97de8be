"""dataset.py: samples, labels, validity, date bounds, splits, adjustment, normalisation, cross-sections,
pickling and the zero-copy gather, against brute-force references on real and random data."""

from __future__ import annotations

import itertools
import pickle
import tracemalloc

import numpy as np
import pytest
import torch
from helpers_dataset_ref import FIELDS, make_store, random_panel, ref_sample, ref_valid, split_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kline_store.samples import ranges
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset
from kline_store.samples.gather import gather_windows
from kline_store.samples.splits import Splits, make_splits
from kline_store.errors import InputError
from kline_store.store import open_store


@pytest.fixture(scope="module")
def ashare(real, tmp_path_factory):
    from kline_store import ingest

    path = tmp_path_factory.mktemp("dataset") / "ashare"
    ingest([real / "ashare_qfq_daily" / "data_20251009"], path)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    rng = np.random.default_rng(11)
    return make_store(tmp_path_factory.mktemp("dataset") / "small", random_panel(rng, 8, 90, holes=0.05))


def _pairs(ds: KlineDataset) -> list[tuple[int, int]]:
    s, t = ds.locate(np.arange(len(ds)))
    return list(zip(s.tolist(), t.tolist()))


def _check_samples(ds: KlineDataset, positions: np.ndarray, **opts) -> None:
    """Every listed sample equals the cell-by-cell reference."""
    st_ = ds.store
    panel = st_.panel
    batch = ds.gather_batch(positions)
    s, t = ds.locate(positions)
    assert torch.equal(batch["symbol"], torch.from_numpy(s)) and torch.equal(batch["t"], torch.from_numpy(t))
    for k, (si, ti) in enumerate(zip(s, t)):
        x, y, obs = ref_sample(panel, st_.fields, ds.fields, int(si), int(ti), ds.window, ds.horizon, **opts)
        np.testing.assert_allclose(batch["x"][k].numpy(), x, rtol=2e-6, atol=1e-6)
        assert batch["y"][k].item() == pytest.approx(y, rel=1e-6, abs=1e-7)
        if "observed" in batch:
            assert batch["observed"][k].numpy().tolist() == obs.tolist()


# --------------------------------------------------------------------------- real data


def test_real_windows_labels_and_counts(ashare):
    ds = KlineDataset(ashare, window=20, horizon=5, start="2021-01-01", end="2024-12-31")
    st_ = ds.store
    assert ds.fields == ["open", "high", "low", "close", "volume"]
    # validity is per symbol: the reference over the first 40 symbols must match exactly
    lo, hi = ranges.date_bounds(st_.dates, "2021-01-01", "2024-12-31")
    want = ref_valid(st_.panel[:40], list(range(5)), 3, 20, 5, lo, hi)
    assert [p for p in _pairs(ds) if p[0] < 40] == want
    # label days stay inside the range, t starts inside it
    t = ds.locate(np.arange(len(ds)))[1]
    lab = ds.label_days(np.arange(len(ds)))
    assert st_.dates[t].min() >= np.datetime64("2021-01-01") and st_.dates[lab].max() <= np.datetime64("2024-12-31")
    assert np.array_equal(lab, t + 5)
    rng = np.random.default_rng(0)
    _check_samples(ds, rng.choice(len(ds), 200, replace=False))


def test_real_label_options(ashare):
    rng = np.random.default_rng(1)
    ds = KlineDataset(ashare, window=8, horizon=3, label="log_return", fields=["close", "volume"])
    _check_samples(ds, rng.choice(len(ds), 100, replace=False), label="log_return")
    ds = KlineDataset(ashare, window=8, horizon=2, label="volume", fields=["open", "close"])
    _check_samples(ds, rng.choice(len(ds), 100, replace=False), label="volume")
    # a field label only needs that field at the label day
    st_ = ds.store
    lo, hi = 0, st_.n_dates - 1
    want = ref_valid(st_.panel[:20], [0, 3], 3, 8, 2, lo, hi, label="field", label_field=4)
    assert [p for p in _pairs(ds) if p[0] < 20] == want


def test_real_symbol_days_and_ffill(ashare):
    rng = np.random.default_rng(2)
    ds = KlineDataset(ashare, window=12, days="symbol")
    _check_samples(ds, rng.choice(len(ds), 100, replace=False), days="symbol")
    ff = KlineDataset(ashare, window=12, missing="ffill", max_missing=6, normalize="window")
    gaps = np.flatnonzero(~ff.gather_batch(np.arange(len(ff)))["observed"].all(dim=1).numpy())
    assert len(gaps) > 0  # the suspensions of the real data do produce filled windows
    _check_samples(ff, np.r_[gaps[:60], rng.choice(len(ff), 40)], missing="ffill", normalize="window")
    assert len(ff) > len(KlineDataset(ashare, window=12))


def test_real_make_splits(ashare):
    sp = make_splits(ashare, train=("2020-01-01", "2022-12-31"), valid=("2023-01-01", "2023-12-31"),
                     test=("2024-01-01", None), window=16, horizon=5, normalize="zscore")
    assert isinstance(sp, Splits)
    dates = sp.train.dates
    spans = []
    for ds, (a, b) in zip(sp, [("2020-01-01", "2022-12-31"), ("2023-01-01", "2023-12-31"),
                               ("2024-01-01", "2099-01-01")]):
        n = np.arange(len(ds))
        t, lab = ds.locate(n)[1], ds.label_days(n)
        assert dates[t].min() >= np.datetime64(a) and dates[lab].max() <= np.datetime64(b)
        spans.append((t.min(), lab.max()))
    for (_, last_label), (first_t, _) in itertools.pairwise(spans):
        assert first_t - last_label - 1 >= 5  # embargo of at least `horizon` trading days
    # z-score statistics come from the train split and are shared
    assert sp.valid.stats == sp.train.stats == sp.test.stats
    assert sp.train.stats["mean"] != sp.test.estimate_stats()["mean"]
    x = sp.train.gather_batch(np.arange(0, len(sp.train), 7))["x"]
    assert abs(float(x.mean())) < 0.2 and 0.5 < float(x.std()) < 1.5
    _check_samples(sp.test, np.arange(0, len(sp.test), 997), normalize="zscore", stats=sp.train.stats)
    with pytest.raises(InputError, match="embargo"):
        make_splits(ashare, train=(None, "2022-12-31"), valid=("2023-01-01", None), horizon=5, embargo=2)


def test_real_cross_sections(ashare):
    xs = CrossSectionDataset(ashare, window=10, start="2023-01-01", end="2023-06-30")
    ds = xs.windows
    by_t: dict[int, list[int]] = {}
    for s, t in _pairs(ds):
        by_t.setdefault(t, []).append(s)
    assert xs.days.tolist() == sorted(by_t)
    k = len(xs) // 2
    item = xs[k]
    assert item["t"] == xs.days[k] and item["symbol"].tolist() == by_t[item["t"]]
    assert item["x"].shape == (len(by_t[item["t"]]), 10, 5)
    ld = xs.loader(batch_size=4, shuffle=False)
    b = next(iter(ld))
    n = [len(by_t[d]) for d in xs.days[:4]]
    assert b["x"].shape == (4, max(n), 10, 5) and b["mask"].sum(dim=1).tolist() == n
    assert (b["symbol"][~b["mask"]] == -1).all() and (b["x"][~b["mask"]] == 0).all()
    assert torch.equal(b["x"][1][: n[1]], xs[1]["x"]) and torch.equal(b["y"][1][: n[1]], xs[1]["y"])
    assert b["t"].tolist() == xs.days[:4].tolist()
    busy = CrossSectionDataset(ds, min_count=140)
    assert 0 < len(busy) < len(xs) or len(busy) == len(xs)
    assert all(len(busy.day_windows(i)) >= 140 for i in range(len(busy)))


# --------------------------------------------------------------------------- property-based, random panels


@st.composite
def dataset_cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    days = draw(st.sampled_from(["calendar", "symbol"]))
    missing = "drop" if days == "symbol" else draw(st.sampled_from(["drop", "ffill"]))
    opts = dict(
        window=draw(st.integers(1, 6)), horizon=draw(st.integers(1, 3)), days=days, missing=missing,
        label=draw(st.sampled_from(["return", "log_return", "amount"])),
        normalize=draw(st.sampled_from(["none", "window"])),
        fields=draw(st.sampled_from([None, ["close"], ["volume", "open"], ["low", "close", "amount"]])))
    return seed, draw(st.sampled_from([0.0, 0.1, 0.3])), opts


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=dataset_cases())
def test_random_panels_match_reference(tmp_path_factory, case):
    seed, holes, opts = case
    rng = np.random.default_rng(seed)
    panel = random_panel(rng, 4, 25, holes=holes)
    path = make_store(tmp_path_factory.mktemp("h") / "s", panel)
    names = opts["fields"] or FIELDS
    xf = [FIELDS.index(f) for f in names]
    kind = opts["label"] if opts["label"] != "amount" else "field"
    need_close = kind != "field" or opts["normalize"] == "window"
    want = ref_valid(panel, xf, 3 if need_close else None, opts["window"], opts["horizon"], 0, 24, kind,
                     5 if kind == "field" else None, opts["missing"], None, opts["days"])
    if not want:
        with pytest.raises(InputError, match="no valid window"):
            KlineDataset(path, **opts)
        return
    ds = KlineDataset(path, **opts)
    assert _pairs(ds) == want
    ref_opts = {k: opts[k] for k in ("label", "missing", "normalize", "days")}
    _check_samples(ds, np.arange(len(ds)), **ref_opts)


# --------------------------------------------------------------------------- corporate actions


@pytest.fixture(scope="module")
def split7(tmp_path_factory):
    return split_store(tmp_path_factory.mktemp("adj") / "split", n_dates=40, split_day=20)


def test_forward_adjusted_window_is_continuous_across_a_split(split7):
    ds = KlineDataset(split7, window=10, adjust="forward")
    assert ds.fields == ["open", "high", "low", "close", "volume"]  # adj_factor is not an input by default
    st_ = ds.store
    pos = [i for i, (s, t) in enumerate(_pairs(ds)) if s == 0 and 20 <= t <= 28]  # windows across the split
    b = ds.gather_batch(pos)
    raw = st_.panel
    for k, i in enumerate(pos):
        t = int(b["t"][k])
        close = b["x"][k, :, 3].numpy().astype(np.float64)
        assert np.all(np.abs(np.diff(np.log(close))) < 0.01)  # no 7x jump inside the window
        np.testing.assert_allclose(b["x"][k, -1].numpy(), raw[0, t, :5], rtol=1e-6)  # last day equals raw
        np.testing.assert_allclose(b["x"][k, :, 4].numpy(), 7000.0, rtol=1e-6)  # volume in post-split shares
        assert abs(b["y"][k].item()) < 0.01  # label on adjusted closes: no -86% return
    _check_samples(ds, np.array(pos), adjust="forward")
    # a window that ends before the split never sees it (nothing leaks back from the future)
    early = [i for i, (s, t) in enumerate(_pairs(ds)) if s == 0 and t < 19]
    eb = ds.gather_batch(early)
    for k, i in enumerate(early):
        t = int(eb["t"][k])
        np.testing.assert_allclose(eb["x"][k].numpy(), raw[0, t - 9: t + 1, :5], rtol=1e-6)


def test_backward_adjustment_and_errors(split7, small):
    ds = KlineDataset(split7, window=10, adjust="backward")
    pos = [i for i, (s, t) in enumerate(_pairs(ds)) if s == 0 and 20 <= t <= 28]
    b = ds.gather_batch(pos)
    assert np.all(np.abs(np.diff(np.log(b["x"][:, :, 3].numpy().astype(np.float64)), axis=1)) < 0.01)
    _check_samples(ds, np.array(pos), adjust="backward")
    # raw prices jump, and the raw label across the split says -86%
    raw = KlineDataset(split7, window=10)
    i = [k for k, (s, t) in enumerate(_pairs(raw)) if (s, t) == (0, 19)]
    assert raw.gather_batch(i)["y"].item() == pytest.approx(700 * np.exp(0.1 * 20 / 39) / 7 /
                                                           (700 * np.exp(0.1 * 19 / 39)) - 1, rel=1e-4)
    with pytest.raises(InputError, match="no 'adj_factor'"):
        KlineDataset(small, window=5, adjust="forward")
    with pytest.raises(InputError, match="adjust="):
        KlineDataset(split7, window=5, adjust="sideways")  # type: ignore[arg-type]
    with_adj = KlineDataset(split7, window=5, fields=["close", "adj_factor"])
    assert with_adj.fields == ["close", "adj_factor"]


# --------------------------------------------------------------------------- API details


def test_sample_types_and_plain_dataloader(small):
    ds = KlineDataset(small, window=5, fields=["close", "volume"])
    item = ds[3]
    assert item["x"].shape == (5, 2) and item["x"].dtype == torch.float32
    assert item["y"].shape == () and item["y"].dtype == torch.float32
    assert isinstance(item["symbol"], int) and isinstance(item["t"], int)
    assert torch.equal(ds[-1]["x"], ds[len(ds) - 1]["x"])
    with pytest.raises(IndexError):
        ds[len(ds)]
    dl = torch.utils.data.DataLoader(ds, batch_size=32)
    first = next(iter(dl))
    want = ds.gather_batch(np.arange(32))
    assert all(torch.equal(first[k], want[k]) for k in want)
    assert first["symbol"].dtype == torch.int64


def test_field_order_and_non_contiguous_fields(small):
    ds = KlineDataset(small, window=4, fields=["volume", "open", "amount"])
    _check_samples(ds, np.arange(0, len(ds), 5))
    st_ = ds.store
    out = {k: v.clone().zero_() for k, v in ds.gather_batch(np.arange(20)).items()}
    got = ds.gather_batch(np.arange(10), out=out)  # preallocated buffers, longer than the batch
    assert got["x"].shape[0] == 10 and got["x"].data_ptr() == out["x"].data_ptr()
    assert torch.equal(got["x"], ds.gather_batch(np.arange(10))["x"])
    assert st_.fields.index("volume") == 4


def test_gather_windows_function(small):
    st_ = open_store(small)
    mm = np.memmap(st_.data_file, dtype=np.float32, mode="c", shape=(st_.n_symbols * st_.row_stride,))
    panel_t = torch.from_numpy(mm)
    sym = torch.tensor([0, 3, 7, 7])
    t = torch.tensor([9, 40, 89, 9])
    x = gather_windows(panel_t, st_.row_stride, st_.n_fields, sym, t, 10)
    for k in range(4):
        np.testing.assert_array_equal(x[k].numpy(), st_.panel[int(sym[k]), int(t[k]) - 9: int(t[k]) + 1])
    out = torch.empty(4, 10, 2)
    y = gather_windows(panel_t, st_.row_stride, st_.n_fields, sym, t, 10, out=out, fields=(3, 2))
    assert y.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(y.numpy(), x[:, :, 3:5].numpy())  # NaN cells compare equal here


def test_errors_name_the_problem(small, ashare):
    with pytest.raises(InputError, match="unknown field 'vwap'"):
        KlineDataset(small, fields=["close", "vwap"])
    with pytest.raises(InputError, match="longer than the calendar"):
        KlineDataset(small, window=90)
    with pytest.raises(InputError, match="no valid window.*holds 1 trading days"):
        KlineDataset(small, window=10, start="2020-03-20", end="2020-03-20")
    with pytest.raises(InputError, match="no valid window.*holds 0 trading days"):
        KlineDataset(ashare, window=5, start="2030-01-01")
    with pytest.raises(InputError, match="window=0"):
        KlineDataset(small, window=0)
    with pytest.raises(InputError, match="end="):
        KlineDataset(small, end="soon")
    with pytest.raises(InputError, match="missing='ffill'"):
        KlineDataset(small, window=3, max_missing=2)
    with pytest.raises(InputError, match="stats are for fields"):
        KlineDataset(small, window=3, normalize="zscore", stats={"fields": ["close"], "mean": [0], "std": [1]})


def test_empty_range_message(tmp_path):
    panel = np.full((2, 30, 6), np.nan, dtype=np.float32)
    panel[:, :10] = 1.0
    panel[0, 10:, :] = 1.0
    panel[:, :, 5] = np.nan  # amount never present
    path = make_store(tmp_path / "s", panel)
    with pytest.raises(InputError, match="field 'amount' is finite in only 0.0%"):
        KlineDataset(path, window=5, fields=["close", "amount"])
    assert len(KlineDataset(path, window=5, fields=["close"])) > 0
    with pytest.warns(RuntimeWarning, match="amount: 0 of 2 symbols; left out of the default fields"):
        assert KlineDataset(path, window=5).fields == ["open", "high", "low", "close", "volume"]   # issue 25


def test_pickles_as_path_and_parameters(small):
    ds = KlineDataset(small, window=6, normalize="zscore", label="log_return")
    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # no panel, no index
    again = pickle.loads(blob)
    assert again.version == ds.version and again.stats == ds.stats and len(again) == len(ds)
    a, b = ds.gather_batch(np.arange(len(ds))), again.gather_batch(np.arange(len(ds)))
    assert all(torch.equal(a[k], b[k]) for k in a)
    xs = CrossSectionDataset(small, window=6)
    assert len(pickle.dumps(xs)) < 2000
    assert torch.equal(pickle.loads(pickle.dumps(xs))[2]["x"], xs[2]["x"])


def test_reads_the_memmap_without_copying_the_panel(tmp_path):
    rng = np.random.default_rng(5)
    fields = FIELDS + [f"f{i}" for i in range(10)]
    panel = random_panel(rng, 300, 1500, fields, holes=0.0)
    path = make_store(tmp_path / "big", panel, fields)
    panel_bytes = panel.nbytes
    del panel
    tracemalloc.start()
    try:
        ds = KlineDataset(path, window=32)
        ds.gather_batch(np.arange(0, len(ds), 100))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.valid_index().nbytes == 4 * len(ds)   # int32 flat cells
    assert peak < panel_bytes / 3  # the index and per-chunk scratch only


def test_store_version_is_pinned(small, tmp_path):
    import shutil

    path = tmp_path / "copy"
    shutil.copytree(small, path)
    ds = KlineDataset(path, window=5)
    rng = np.random.default_rng(3)
    make_store(path, random_panel(rng, 3, 50))  # a new version replaces the store
    again = pickle.loads(pickle.dumps(ds))
    assert again.version == ds.version and len(again) == len(ds)
    assert KlineDataset(path, window=5).version == ds.version + 1


def test_resident_gather_matches_cpu_gather(small):
    for opts in [dict(), dict(days="symbol"), dict(missing="ffill", normalize="window")]:
        ds = KlineDataset(small, window=7, horizon=2, start="2020-01-20", **opts)
        gather = ds.resident("cpu")
        idx = np.arange(len(ds))[::-1].copy()
        a, b = gather(torch.from_numpy(idx)), ds.gather_batch(idx)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        d0, d1 = ds.day_span()
        assert ds.resident_nbytes() == 8 * (d1 - d0) * 6 * 4
        assert d0 >= 19 - 6 or opts.get("days") == "symbol"  # only the days samples read


def test_resident_copy_keeps_only_used_fields_and_matches(small, split7):
    """A resident copy holds x's fields side by side (plus close/adj/label) and gathers the same batches."""
    cases = [(small, dict(fields=["close", "open"])), (small, dict(fields=["volume"], label="high")),
             (small, dict(fields=["low", "high"], normalize="window")),
             (split7, dict(adjust="forward")), (split7, dict(fields=["volume", "open"], adjust="backward"))]
    for path, opts in cases:
        ds = KlineDataset(path, window=6, horizon=2, **opts)
        gather = ds.resident("cpu")
        idx = np.arange(len(ds))[::-1].copy()
        a, b = gather(torch.from_numpy(idx)), ds.gather_batch(idx)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), opts
        keep = set(ds.fields) | ({"close"} if opts.get("label", "return") in ("return",) else {opts["label"]})
        keep |= {"adj_factor"} if opts.get("adjust", "none") != "none" else set()
        d0, d1 = ds.day_span()
        assert ds.resident_nbytes() == ds.store.n_symbols * (d1 - d0) * len(keep) * 4, opts


def test_cpu_placement_is_the_memmap_unless_a_copy_is_asked_for(small):
    """On the CPU, auto is the shared memmap (N ranks, one page cache); placement="device" makes a RAM copy of the
    fields samples use, with the same batches."""
    subset = KlineDataset(small, window=6, fields=["close", "volume"])
    assert subset.loader(batch_size=8, device="cpu").placement == "memmap"
    ld = subset.loader(batch_size=8, device="cpu", placement="device")
    assert ld.placement == "device"
    ref = subset.loader(batch_size=8, device="cpu", placement="memmap")
    for a, b in zip(ld, ref, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_single_field_may_be_a_string(small):
    assert KlineDataset(small, window=4, fields="close").fields == ["close"]


def test_a_raw_price_label_is_refused_with_adjusted_inputs(split7):
    with pytest.raises(InputError, match="label='close' with adjust='forward'"):
        KlineDataset(split7, window=5, label="close", adjust="forward")


def test_a_dataset_over_a_closed_store_says_so(tmp_path):
    """Issue 19: it failed as "cannot reshape array of size 0"."""
    from kline_store.errors import StoreError
    path = make_store(tmp_path / "s", random_panel(np.random.default_rng(3), 4, 40, holes=0.0))
    st_ = open_store(path)
    st_.close()
    with pytest.raises(StoreError, match="this Store .* is closed"):
        KlineDataset(st_, window=5, horizon=1)


def test_a_loader_state_from_another_store_version_is_refused(tmp_path):
    path = make_store(tmp_path / "s", random_panel(np.random.default_rng(3), 4, 40, holes=0.0))
    ld = KlineDataset(path, window=5, horizon=1).loader(batch_size=8)
    state = ld.state_dict()
    assert state["version"] == 1
    with pytest.raises(InputError, match="taken on store version 7; this dataset reads version 1"):
        ld.load_state_dict({**state, "version": 7})
    ld.load_state_dict(state)


def test_a_version_the_other_ranks_read_that_is_gone_is_one_line(tmp_path, monkeypatch):
    """Issue 19 (DDP on one version): a rank that cannot open the agreed version fails in one line."""
    from kline_store.errors import StoreError
    from kline_store.samples import dataset
    path = make_store(tmp_path / "s", random_panel(np.random.default_rng(3), 4, 40, holes=0.0))
    monkeypatch.setattr(dataset, "agreed_version", lambda store, version: 7)
    with pytest.raises(StoreError, match=r"the other ranks read store version 7, this rank opened version 1") as e:
        KlineDataset(path, window=5, horizon=1)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(dataset, "agreed_version", lambda store, version: None)      # no process group: as opened
    assert KlineDataset(path, window=5, horizon=1).version == 1


@pytest.mark.parametrize("opts", [
    {}, {"missing": "ffill", "max_missing": 3}, {"normalize": "window"}, {"days": "symbol"},
    {"label": "log_return", "horizon": 2}, {"normalize": "window", "days": "symbol", "horizon": 3}])
def test_a_resident_copy_gathers_what_the_memmap_does_by_either_index_path(small, opts):
    """A host copy (pinned or RAM) is indexed with numpy like the memmap; a GPU copy with torch tensors: both index
    paths of the resident gather give the memmap's batch, under every option."""
    ds = KlineDataset(small, window=6, fields=["open", "close", "volume"], **opts)
    idx = np.random.default_rng(5).choice(len(ds), min(len(ds), 200), replace=False)
    ref = ds.gather_batch(idx)
    gather = ds.resident("cpu")
    for got in (gather(idx), gather(torch.from_numpy(idx))):
        assert set(got) == set(ref)
        for k in ref:
            assert torch.equal(torch.nan_to_num(got[k], nan=-7.0), torch.nan_to_num(ref[k], nan=-7.0)), (opts, k)
