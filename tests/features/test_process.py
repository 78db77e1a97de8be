"""Qlib's benchmark processing on a features store: RobustZScoreNorm + Fillna on the features, DropnaLabel +
CSRankNorm on the label, statistics from the fit dates only, written as a store the datasets read as it is."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from test_compute import bars, write_folder

from kline_store import KlineDataset, compute_features, ingest, open_store, process_features, update_features
from kline_store.errors import InputError
from kline_store.features.fit import Pipeline, RobustZScoreNorm
from kline_store.features.processors import CSRankNorm, DropnaLabel, Fillna

EXPRS = {"RET1": "$close/Ref($close, 1) - 1", "MA5": "Mean($close, 5)/$close", "STD20": "Std($close, 20)/$close"}


def features_of(tmp, frames, name):
    base = tmp / f"base_{name}"
    ingest([write_folder(tmp / f"in_{name}", frames)], base)
    feats = tmp / f"feats_{name}"
    compute_features(base, feats, sets=[], exprs=EXPRS)
    return feats


def test_the_qlib_pipeline_on_a_store(tmp_path):
    feats = features_of(tmp_path, bars(5, 8, 150), "a")
    st = open_store(feats)
    fit_end = str(st.dates[90])
    rep = process_features(feats, tmp_path / "proc", fit_end=fit_end)
    assert rep.dropped > 0 and "RobustZScoreNorm" in rep.lines()[0]
    proc = open_store(tmp_path / "proc")
    assert proc.fields == st.fields and proc.manifest["features"]["processing"]["fit_end"] == fit_end
    # the same pipeline on the panel by hand: label moved back to its day, Qlib's rows = the symbols' spans
    raw = np.array(st.panel)
    x = np.full((st.n_dates, st.n_symbols, 4), np.nan, dtype=np.float32)
    x[:, :, :3] = raw[:, :, :3].transpose(1, 0, 2)
    x[:-2, :, 3] = raw[:, 2:, 3].T
    t = np.arange(st.n_dates)[:, None]
    present = torch.from_numpy((t >= st.first_bar) & (t <= st.last_bar))
    train = torch.from_numpy(np.arange(st.n_dates) <= 90)
    pipe = Pipeline(infer=[RobustZScoreNorm([0, 1, 2]), Fillna([0, 1, 2])], learn=[DropnaLabel([3]), CSRankNorm([3])])
    view = pipe.apply(torch.from_numpy(x), present, pipe.fit(torch.from_numpy(x), present, train)).learn
    got = np.array(proc.panel)
    want = view.x.numpy()
    inside = present.numpy().T
    np.testing.assert_allclose(got[:, :, :3][inside], want[:, :, :3].transpose(1, 0, 2)[inside], rtol=1e-6)
    lab = np.where(view.present.numpy(), want[:, :, 3], np.nan).T         # dropped rows: NaN labels
    np.testing.assert_allclose(got[:, 2:, 3][inside[:, :-2]], lab[:, :-2][inside[:, :-2]], rtol=1e-6)
    assert np.nanmax(np.abs(got[:, :, 3])) <= 3.46 / 2 + 1e-6              # CSRankNorm's range
    ds = KlineDataset(tmp_path / "proc", window=1)
    assert ds.horizon == 2 and len(ds) > 0
    b = ds.gather_batch(np.arange(len(ds)))
    assert torch.isfinite(b["x"]).all() and torch.isfinite(b["y"]).all()


def test_statistics_come_from_the_fit_dates_only(tmp_path):
    frames = bars(6, 6, 150)
    later = {s: df.with_columns(pl.when(pl.col("date") > "2021-06-01").then(pl.col("close") * 3)
                                .otherwise(pl.col("close")).alias("close")) for s, df in frames.items()}
    a, b = features_of(tmp_path, frames, "a"), features_of(tmp_path, later, "b")
    fit_end = "2021-04-30"
    process_features(a, tmp_path / "pa", fit_end=fit_end)
    process_features(b, tmp_path / "pb", fit_end=fit_end)
    sa, sb = open_store(tmp_path / "pa"), open_store(tmp_path / "pb")
    assert sa.manifest["features"]["processing"]["states"] == sb.manifest["features"]["processing"]["states"]
    upto = int(np.searchsorted(sa.dates.astype("datetime64[D]"), np.datetime64(fit_end), side="right"))
    np.testing.assert_array_equal(np.array(sa.panel)[:, :upto, :3], np.array(sb.panel)[:, :upto, :3])


def test_processing_errors(tmp_path):
    feats = features_of(tmp_path, bars(7, 3, 60), "a")
    with pytest.raises(InputError, match="fit_end is required"):
        process_features(feats, tmp_path / "p")
    with pytest.raises(InputError, match="expected one of"):
        process_features(feats, tmp_path / "p", infer=["Standardize"], fit_end="2021-02-01")
    process_features(feats, tmp_path / "p", fit_end="2021-02-01")
    with pytest.raises(InputError, match="processed store"):
        update_features(tmp_path / "p")


@pytest.mark.parametrize("point", ["process:filled", "process:data-in-place", "commit:copied",
                                   "commit:manifest-swapped"])
def test_kill9_while_processing_leaves_old_or_new(tmp_path, point):
    """process_features goes through the write transaction: killed at each of its steps, the processed store
    is the old version or the new one, and the next run writes the same values."""
    import signal

    from conftest import run_cli
    from kline_store import verify_store
    feats = features_of(tmp_path, bars(5, 8, 150), "k")
    fit_end = str(open_store(feats).dates[90])
    process_features(feats, tmp_path / "proc", fit_end=fit_end)
    before = (tmp_path / "proc" / "manifest.json").read_bytes()
    want = np.array(open_store(tmp_path / "proc").panel)
    r = run_cli("process", str(feats), "-o", str(tmp_path / "proc"), "--fit-end", fit_end, "--replace", "-q",
                env={"KLINE_STORE_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert verify_store(tmp_path / "proc") == []
    swapped = point == "commit:manifest-swapped"
    assert ((tmp_path / "proc" / "manifest.json").read_bytes() == before) != swapped
    assert open_store(tmp_path / "proc").version == 1 + swapped
    process_features(feats, tmp_path / "proc", fit_end=fit_end, replace=True)      # the next writer recovers
    np.testing.assert_array_equal(np.array(open_store(tmp_path / "proc").panel), want)
