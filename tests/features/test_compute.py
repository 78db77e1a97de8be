"""Features stores: written like an ingest, labels stored where they become known, updates equal a full
recompute cell for cell (new days, new symbols, a symbol resuming after a suspension at the end), bad input
refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import run_cli
from kline_store import append, compute_features, ingest, open_store, update_features
from kline_store.errors import InputError, StoreError
from kline_store.features.plan import make_plan

FIELDS = ["open", "high", "low", "close", "volume"]
SMALL = {"MA5": "Mean($close, 5)/$close", "STD10": "Std($close, 10)", "IMAX5": "IdxMax($high, 5)/5",
         "CORR5": "Corr($close, Log($volume+1), 5)", "BETA5": "Slope($close, 5)/$close",
         "ROC3": "Ref($close, 3)/$close", "CNT": "Count($close, 20)", "RSV5":
         "($close-Min($low, 5))/(Max($high, 5)-Min($low, 5)+1e-12)"}


def bars(seed: int, n_sym: int, n_days: int) -> dict[str, pl.DataFrame]:
    """One frame per symbol on business days: late listings, suspensions, a random walk."""
    rng = np.random.default_rng(seed)
    days = np.busday_offset("2021-01-04", np.arange(n_days), roll="forward")
    out = {}
    for s in range(n_sym):
        keep = rng.random(n_days) > 0.08
        keep[: rng.integers(0, n_days // 4)] = False            # listed later
        close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, n_days)))
        opn = close * (1 + rng.normal(0, 0.01, n_days))
        df = pl.DataFrame({"date": days.astype(str), "open": opn, "high": np.maximum(opn, close) * 1.01,
                           "low": np.minimum(opn, close) * 0.99, "close": close,
                           "volume": rng.integers(1000, 100000, n_days).astype(float)})
        out[f"S{s:02d}"] = df.filter(pl.Series(keep))
    return out


def write_folder(folder: Path, frames: dict[str, pl.DataFrame]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for sym, df in frames.items():
        if len(df):
            df.write_csv(folder / f"{sym}.csv")
    return folder


def panel(path: Path) -> np.ndarray:
    with open_store(path) as st:
        return np.array(st.panel)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[str, pl.DataFrame]]:
    tmp = tmp_path_factory.mktemp("hist")
    frames = bars(1, 7, 140)
    return tmp, frames


def test_update_after_append_equals_a_full_recompute(history, tmp_path):
    _, frames = history
    cut = "2021-06-15"
    before = {s: df.filter(pl.col("date") < cut) for s, df in frames.items()}
    after = {s: df.filter(pl.col("date") >= cut) for s, df in frames.items()}
    before["S03"] = before["S03"].filter(pl.col("date") < "2021-06-01")   # suspended on the last days: resumes
    before.pop("S06")                                                    # a symbol new in the append
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", before)], base)
    feats = tmp_path / "feats"
    compute_features(base, feats, sets=[], exprs=SMALL)
    append(base, [write_folder(tmp_path / "b", after)])
    rep = update_features(feats)
    assert rep.mode == "tail" and rep.reason == ""
    full = tmp_path / "full"
    compute_features(base, full, sets=[], exprs=SMALL)
    assert same(panel(feats), panel(full))
    with open_store(feats) as st:
        assert st.symbols[-1] == "S06" and st.n_dates == open_store(base).n_dates
    assert update_features(feats).mode == "none"


def test_update_after_a_revision_recomputes_in_full(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    feats = tmp_path / "feats"
    compute_features(base, feats, sets=[], exprs=SMALL)
    revised = {"S01": frames["S01"].head(30).with_columns(pl.col("close") * 1.5)}
    append(base, [write_folder(tmp_path / "r", revised)])
    rep = update_features(feats)
    assert rep.mode == "full" and "rewritten" in rep.reason
    full = tmp_path / "full"
    compute_features(base, full, sets=[], exprs=SMALL)
    assert same(panel(feats), panel(full))


def test_a_label_is_stored_where_it_becomes_known(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    feats = tmp_path / "feats"
    compute_features(base, feats, sets=[], exprs={"C": "$close"})          # default label: LABEL0
    with open_store(base) as b, open_store(feats) as f:
        assert f.fields == ["C", "LABEL0"]
        meta = f.manifest["features"]
        assert meta["label"] == "LABEL0" and meta["fields"][1]["lookahead"] == 2
        close = np.array(b.array("close"), dtype=np.float64)
        s = b.symbols.index("S00")
        want = close[s, 2:] / close[s, 1:-1] - 1                       # LABEL0 of day t ...
        got = np.array(f.array("LABEL0"))[s, 2:]                        # ... stored at t + 2
        ok = np.isfinite(want) & (np.arange(2, b.n_dates) - 2 >= b.first_bar[s])   # days of the series only
        assert ok.sum() > 50 and np.allclose(got[ok], want[ok], rtol=1e-4, atol=1e-7)
        assert np.isnan(got[: b.first_bar[s]]).all()                    # before the listing: no row, no label
        assert np.isnan(np.array(f.array("LABEL0"))[:, :2]).all()
        np.testing.assert_array_equal(f.first_bar, b.first_bar)


def test_blocks_do_not_change_values(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    compute_features(base, tmp_path / "one", sets=[], exprs=SMALL, block_symbols=1)
    compute_features(base, tmp_path / "all", sets=[], exprs=SMALL)
    assert same(panel(tmp_path / "one"), panel(tmp_path / "all"))


def test_a_store_written_out_of_the_page_cache_is_the_same(history, tmp_path, monkeypatch):
    """The page-cache recycling of large stores (each block's pages sent to disk and dropped one block later)
    writes the same cells and checksums as a store kept cached."""
    from kline_store.features import pagecache
    from kline_store.store import manifest as mf

    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    compute_features(base, tmp_path / "cached", sets=[], exprs=SMALL, block_symbols=2)
    calls, fadvise = [], os.posix_fadvise
    monkeypatch.setattr(pagecache, "SHARE", 0.0)
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: calls.append(a[1:]) or fadvise(*a))
    compute_features(base, tmp_path / "dropped", sets=[], exprs=SMALL, block_symbols=2)
    dropped = [c for c in calls if c[-1] == os.POSIX_FADV_DONTNEED]
    assert len(dropped) == -(-len(frames) // 2) - 1   # every block but the last, one block behind
    assert same(panel(tmp_path / "cached"), panel(tmp_path / "dropped"))
    a, b = (mf.read_manifest(tmp_path / n)["data"] for n in ("cached", "dropped"))
    assert a["row_crc32"] == b["row_crc32"] and a["checksum"] == b["checksum"]


def test_plan_errors_are_one_line():
    with pytest.raises(InputError, match="unknown feature set 'alpha999'.*alpha158"):
        make_plan(["alpha999"])
    with pytest.raises(InputError, match="used twice"):
        make_plan([], {"A": "$close"}, label="A=Ref($close, -1)")
    with pytest.raises(InputError, match=r"Mean\(\$close\).*position"):
        make_plan([], ["BAD=Mean($close)"])
    with pytest.raises(InputError, match="NAME=EXPRESSION"):
        make_plan([], ["Mean($close, 5)"])
    plan = make_plan(["alpha158"])
    assert len(plan.fields) == 159 and plan.label == "LABEL0" and plan.max_lookback == 60
    assert make_plan([], ["X=$close"], label="$close >= $open").fields[-1].name == "LABEL0"


def test_cli_features_and_its_errors(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    out = tmp_path / "f"
    r = run_cli("features", str(base), "-o", str(out), "--expr", "MA5=Mean($close, 5)", "--label", "none")
    assert r.returncode == 0, r.stderr
    assert "1 fields" in r.stdout
    for args, code, needle in [
        (["features", str(base), "-o", str(out), "--expr", "MA5=Mean($close, 5)"], 1, "already there"),
        (["features", str(base), "-o", str(tmp_path / "g"), "--expr", "X=Foo($close)"], 1, "unknown operator"),
        (["features", str(base), "-o", str(tmp_path / "g"), "--set", "nope"], 1, "known sets"),
        (["features", str(base), "-o", str(base / "inside")], 1, "is inside the store"),
        (["features", str(out), "--update", "-o", str(tmp_path / "h")], 2, "--update"),
        (["features", str(base), "--update"], 1, "not a features store"),
    ]:
        r = run_cli(*args)
        assert r.returncode == code, (args, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "g").exists() and not (base / "inside").exists()
    assert run_cli("verify", str(out)).returncode == 0
    info = json.loads(run_cli("info", str(out), "--json").stdout)
    assert info["fields"] == ["MA5"]
    exported = tmp_path / "f.parquet"
    assert run_cli("export", str(out), "-o", str(exported)).returncode == 0
    assert pl.read_parquet(exported).columns[-1] == "MA5"


def test_a_missing_field_is_nan_and_reported(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    rep = compute_features(base, tmp_path / "f", sets=[], exprs={"V": "$vwap/$close", "C": "$close"}, label=None)
    assert rep.missing_fields == ["vwap"] and any("$vwap" in line for line in rep.lines())
    with open_store(tmp_path / "f") as st:
        assert np.isnan(np.array(st.array("V"))).all() and np.isfinite(np.array(st.array("C"))).any()


def test_a_damaged_features_description_is_a_store_error(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    feats = tmp_path / "f"
    compute_features(base, feats, sets=[], exprs={"C": "$close"}, label=None)
    from kline_store.store import manifest as mf
    m = json.loads((feats / "manifest.json").read_text())
    m["features"]["fields"][0]["expr"] = "Mean($close"
    m = mf.seal({k: v for k, v in m.items() if k != mf.CHECKSUM_KEY})
    (feats / "manifest.json").write_bytes(mf.encode(m))
    with pytest.raises(StoreError, match="features.fields"):
        update_features(feats)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_computes_what_the_cpu_does(history, tmp_path):
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    compute_features(base, tmp_path / "cpu", sets=["alpha158"])
    compute_features(base, tmp_path / "gpu", sets=["alpha158"], device="cuda")
    a, b = panel(tmp_path / "cpu"), panel(tmp_path / "gpu")
    assert np.mean(np.isclose(a, b, rtol=1e-4, atol=1e-5) | (np.isnan(a) & np.isnan(b))) > 0.9999


def test_cuda_without_a_gpu_is_one_line(history, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    r = run_cli("features", str(base), "-o", str(tmp_path / "f"), "--device", "cuda")
    assert r.returncode == 1 and "CUDA is not available" in r.stderr and not (tmp_path / "f").exists()


def test_no_stored_cell_depends_on_later_bars(history, tmp_path):
    """Bars after day t change: every stored cell up to t (features and the label stored where it is known)
    stays as it was."""
    _, frames = history
    cut = "2021-05-03"
    later = {s: df.with_columns(pl.when(pl.col("date") > cut).then(pl.col("close") * 1.7).otherwise(pl.col("close"))
                                .alias("close")) for s, df in frames.items()}
    a, b = tmp_path / "a", tmp_path / "b"
    ingest([write_folder(tmp_path / "ia", frames)], a)
    ingest([write_folder(tmp_path / "ib", later)], b)
    compute_features(a, tmp_path / "fa", sets=["alpha158"])
    compute_features(b, tmp_path / "fb", sets=["alpha158"])
    with open_store(a) as st:
        t = int(np.searchsorted(st.dates.astype("datetime64[D]"), np.datetime64(cut), side="right"))
    pa, pb = panel(tmp_path / "fa"), panel(tmp_path / "fb")
    assert same(pa[:, :t], pb[:, :t]) and not same(pa[:, t:], pb[:, t:])


def test_an_intraday_store_counts_bars(tmp_path):
    from kline_store.store import create_store
    rng = np.random.default_rng(0)
    n = 240 * 3
    stamps = (np.datetime64("2024-01-02T09:31") + np.arange(n) % 240 + (np.arange(n) // 240) * 1440).astype(
        "datetime64[m]")
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.001, (2, n)), axis=1))
    p = np.stack([close, close * 1.001, close * 0.999, close, rng.integers(100, 1000, (2, n))], axis=2)
    create_store(tmp_path / "m", p.astype(np.float32), ["A", "B"], stamps, FIELDS, freq="1min")
    compute_features(tmp_path / "m", tmp_path / "f", sets=[], exprs={"MA5": "Mean($close, 5)"}, label=None)
    with open_store(tmp_path / "f") as st:
        assert st.freq == "1min" and st.n_dates == n
        got = np.array(st.array("MA5"))[0]
    want = np.convolve(close[0].astype(np.float32), np.ones(5) / 5, mode="valid")
    np.testing.assert_allclose(got[4:], want, rtol=1e-5)          # five bars, across the day boundary too


def test_replaced_files_are_removed_off_the_critical_path(history, tmp_path):
    """A replace or an update commits, then a background thread removes the files the new version does not
    use: afterwards only the current data file and version copy are left, and the store reads the same."""
    from kline_store.store import reclaim

    _, frames = history
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    compute_features(base, tmp_path / "f", sets=[], exprs=SMALL)
    first = panel(tmp_path / "f")
    for _ in range(2):
        compute_features(base, tmp_path / "f", sets=[], exprs=SMALL, replace=True)
    reclaim.wait()
    assert len(list((tmp_path / "f").glob("data-*"))) == 1
    assert len(list((tmp_path / "f" / "versions").iterdir())) <= 1
    assert same(panel(tmp_path / "f"), first)


@pytest.mark.parametrize("step", [1, 3, 4, 50])
def test_placed_pieces_are_the_stored_layout(step):
    """The blocked layout copy the writers take a few symbols at a time: each field at its own day (a field
    looking ahead stored that many bars later, NaN before), every row and field, whatever the step and the
    first day read (d0) or written (u0)."""
    from kline_store.features.compute import place_cells, placed

    plan = make_plan([], {"A": "$close", "B": "Ref($close, -1)", "C": "$open"}, label="Ref($close, -2)")
    aheads = [f.lookahead for f in plan.fields]
    rng = np.random.default_rng(step)
    n_f, n_rows, d0, u0, u1 = len(plan.fields), 7, 3, 5, 12
    vals = rng.normal(size=(n_f, n_rows, u1 - d0)).astype(np.float32)
    want = np.full((n_rows, u1 - u0, n_f), np.nan, dtype=np.float32)
    for k, a in enumerate(aheads):
        for u in range(u0, u1):
            if u - a >= d0:
                want[:, u - u0, k] = vals[k, :, u - a - d0]
    got = np.full_like(want, 7.0)
    rows_seen = []
    for r0, cells in placed(vals, d0, u0, u1, plan, step):
        assert cells.shape[0] <= step and cells.flags.c_contiguous
        got[r0: r0 + len(cells)] = cells
        rows_seen += range(r0, r0 + len(cells))
    assert rows_seen == list(range(n_rows))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(place_cells(vals, d0, u0, u1, plan), want)
