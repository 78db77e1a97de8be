"""Cross-sectional operators (CSRank, CSZScore, CSDemean, CSScale, GroupDemean, GroupRank) against pandas
transcriptions (hypothesis: NaN, ties, infinities, constant days, universes), against Qlib 0.9.7's CSRankNorm and
CSZScoreNorm processors where they coincide, evaluated in symbol blocks as in one pass, and in features stores
(blocks, universes, `--update`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.features.evaluate import evaluate

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

EXPRS = ["CSRank($a)", "CSZScore($a)", "CSDemean($a)", "CSScale($a)", "GroupDemean($a, $g)", "GroupRank($a, $g)"]


def pandas_side(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The operators as a pandas user writes them over a (datetime, instrument) frame: [S, T, 6]."""
    n_sym, n_bars = a.shape
    df = pd.DataFrame({"a": a.T.ravel().astype(np.float64), "g": g.T.ravel().astype(np.float64),
                       "datetime": np.repeat(np.arange(n_bars), n_sym)})
    by_day = df.groupby("datetime")["a"]
    by_group = df.groupby(["datetime", "g"])["a"]
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = [by_day.rank(pct=True), (df.a - by_day.transform("mean")) / by_day.transform("std"),
                df.a - by_day.transform("mean"), df.a / df.a.abs().groupby(df.datetime).transform("sum"),
                df.a - by_group.transform("mean"), by_group.rank(pct=True)]
    return np.stack([np.asarray(c, dtype=np.float64).reshape(n_bars, n_sym).T for c in cols], axis=-1)


@st.composite
def panels(draw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_sym, n_bars = draw(st.integers(1, 9)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n_sym, n_bars)).round(draw(st.sampled_from([0, 1, 3])))   # rounding: ties
    a[rng.random(a.shape) < draw(st.sampled_from([0.0, 0.2, 0.6]))] = np.nan
    if draw(st.booleans()):
        a[rng.random(a.shape) < 0.1] = np.inf
    if n_bars > 1 and draw(st.booleans()):
        a[:, 0] = 2.5                                                     # a constant day
    g = rng.integers(0, 3, (n_sym, n_bars)).astype(np.float64)
    g[rng.random(g.shape) < 0.1] = np.nan                                 # no industry: out of its groups
    members = rng.random(a.shape) < draw(st.sampled_from([1.0, 0.6]))
    return a.astype(np.float32), g.astype(np.float32), members


def ours(a, g, members=None, per_pass=None) -> np.ndarray:
    n_sym, n_bars = a.shape
    first, last = torch.zeros(n_sym, dtype=torch.int64), torch.full((n_sym,), n_bars - 1)
    ev = evaluate(EXPRS, {"a": torch.from_numpy(a), "g": torch.from_numpy(g)}, first, last, per_pass,
                  None if members is None else torch.from_numpy(members), dtype=torch.float64)
    return ev.values.numpy()


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):
        ok = np.where(np.isfinite(want), np.abs(got - want) <= 1e-9 + 1e-9 * np.abs(want),
                      (np.isnan(got) & np.isnan(want)) | (got == want))
    bad = np.argwhere(~ok)
    assert ok.all(), f"{len(bad)} cells differ, first {bad[0]} ({EXPRS[bad[0][2]]}): ours " \
                     f"{got[tuple(bad[0])]}, pandas {want[tuple(bad[0])]}"


@settings(max_examples=150, deadline=None)
@given(case=panels())
def test_the_operators_are_their_pandas_transcriptions(case):
    a, g, members = case
    assert_close(ours(a, g), pandas_side(a, g))
    # a universe: non-members leave the cross-sections and come out NaN, as if their values were NaN
    hidden = np.where(members, a, np.nan).astype(np.float32)
    want = pandas_side(hidden, g)
    got = ours(a, g, members)
    assert_close(got, want)
    assert np.isnan(got[~members]).all()


@settings(max_examples=40, deadline=None)
@given(case=panels(), per_pass=st.integers(1, 4))
def test_symbol_passes_give_one_pass_values(case, per_pass):
    a, g, members = case
    exprs = ["Mean(CSRank($a), 2) + CSZScore(Ref($a, 1) + CSDemean($a))", "GroupRank(CSScale($a)*2, $g)",
             "CSRank(CSRank($a)) - $a"]
    n_sym, n_bars = a.shape
    args = ({"a": torch.from_numpy(a), "g": torch.from_numpy(g)}, torch.zeros(n_sym, dtype=torch.int64),
            torch.full((n_sym,), n_bars - 1))
    for m in (None, torch.from_numpy(members)):
        one = evaluate(exprs, *args, members=m).values.numpy()
        split = evaluate(exprs, *args, per_pass, members=m).values.numpy()
        assert np.array_equal(one, split, equal_nan=True)


def test_parse_errors_are_one_line():
    first, last = torch.zeros(2, dtype=torch.int64), torch.full((2,), 3)
    values = {"a": torch.zeros(2, 4)}
    with pytest.raises(InputError, match="CSRank takes 1 arguments"):
        evaluate(["CSRank($a, 5)"], values, first, last)
    with pytest.raises(InputError, match="GroupRank takes 2 arguments"):
        evaluate(["GroupRank($a)"], values, first, last)


# ---------------------------------------------------------------- Qlib's processors


@pytest.fixture(scope="module")
def qlib_python():
    env = os.environ.get("KLINE_QLIB_PYTHON")
    python = Path(env) if env else Path(__file__).parents[2] / ".venv-qlib" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"Qlib's python not found ({python}); set KLINE_QLIB_PYTHON")
    return python


def test_csrank_and_cszscore_are_qlibs_processors(qlib_python, tmp_path):
    """CSRankNorm is (CSRank - 0.5) * 3.46, CSZScoreNorm is CSZScore: on Qlib's own classes (its frame holds
    only the present rows: ours are NaN there)."""
    import json
    rng = np.random.default_rng(5)
    n_dates, n_sym, n_col = 30, 12, 3
    x = rng.normal(size=(n_dates, n_sym, n_col)).round(1).astype(np.float32)     # ties
    x[rng.random(x.shape) < 0.1] = np.nan
    x[3, :, 1] = 1.0                                                               # a constant day
    present = rng.random((n_dates, n_sym)) < 0.85
    specs = [{"name": "rank", "proc": ["CSRankNorm", {"fields_group": "feature"}]},
             {"name": "z", "proc": ["CSZScoreNorm", {"fields_group": "feature"}]}]
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    np.savez(tmp_path / "in.npz", x=x, present=present, n_feat=n_col, fit_lo=0, fit_hi=n_dates - 1)
    proc = subprocess.run([str(qlib_python), str(HERE / "helpers_qlib_processors.py"), str(tmp_path / "specs.json")],
                          input=f"{tmp_path / 'in.npz'} {tmp_path / 'out.npz'}\n", capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.splitlines()[-1] == "ok", proc.stdout[-2000:] + proc.stderr[-2000:]
    theirs = np.load(tmp_path / "out.npz")
    values = {f"f{c}": torch.from_numpy(np.where(present, x[..., c], np.nan).T.copy()) for c in range(n_col)}
    first, last = torch.zeros(n_sym, dtype=torch.int64), torch.full((n_sym,), n_dates - 1)
    exprs = [f"(CSRank($f{c}) - 0.5) * 3.46" for c in range(n_col)] + [f"CSZScore($f{c})" for c in range(n_col)]
    got = evaluate(exprs, values, first, last, dtype=torch.float64).values.numpy().transpose(1, 0, 2)
    for k, name in enumerate(("rank", "z")):
        want, kept = theirs[f"{name}.x"], theirs[f"{name}.kept"]
        assert np.array_equal(kept, present)
        a, b = got[..., k * n_col:(k + 1) * n_col][present], want[present]
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=1e-6, atol=1e-7), name


# ---------------------------------------------------------------- features stores


@pytest.fixture(scope="module")
def frames():
    from test_compute import bars
    return bars(3, 9, 120)


CROSS = {"R": "CSRank($close)", "Z": "CSZScore(Mean($close, 5)/$close)", "T": "Mean(CSRank($volume), 10)",
         "G": "GroupDemean(Delta($close, 3), $volume > 50000)", "S": "CSScale(Rank($close, 5) - 0.5)"}


def test_a_features_store_in_blocks_equals_one_pass_and_pandas(frames, tmp_path):
    from kline_store import compute_features, ingest, open_store
    from test_compute import panel, same, write_folder
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    compute_features(base, tmp_path / "one", sets=[], exprs=CROSS, block_symbols=2, label=None)
    compute_features(base, tmp_path / "all", sets=[], exprs=CROSS, label=None)
    assert same(panel(tmp_path / "one"), panel(tmp_path / "all"))
    with open_store(base) as b:
        close = np.array(b.array("close"), dtype=np.float64)
    want = pd.DataFrame(close).rank(axis=0, pct=True).to_numpy()
    got = panel(tmp_path / "all")[..., 0]
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6)


def test_a_universe_and_update_recompute_the_new_days_only(frames, tmp_path):
    from kline_store import append, compute_features, ingest, open_store, set_universe, update_features
    from test_compute import panel, same, write_folder
    cut = "2021-05-20"
    before = {s: df.filter(pl.col("date") < cut) for s, df in frames.items()}
    after = {s: df.filter(pl.col("date") >= cut) for s, df in frames.items()}
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", before)], base)
    spans = pl.DataFrame({"symbol": ["S00", "S01", "S02", "S03", "S05", "S02"],
                          "start": ["2021-01-01", "2021-01-01", "2021-01-01", "2021-02-01", "2021-01-01", "2021-04-01"],
                          "end": [None, "2021-06-30", "2021-03-01", None, None, None]})
    set_universe(base, "core", spans)
    feats = tmp_path / "feats"
    label = "CSRank(Ref($close, -2)/Ref($close, -1) - 1)"               # a cross-sectional label: looks ahead
    compute_features(base, feats, sets=[], exprs=CROSS, universe="core", label=label)
    append(base, [write_folder(tmp_path / "b", after)])
    rep = update_features(feats)
    assert rep.mode == "tail" and rep.reason == "", rep.reason
    compute_features(base, tmp_path / "full", sets=[], exprs=CROSS, universe="core", block_symbols=3, label=label)
    assert same(panel(feats), panel(tmp_path / "full"))
    with open_store(base) as b:
        inside = b.universe("core")
        close = np.where(inside, np.array(b.array("close"), dtype=np.float64), np.nan)
    got = panel(feats)[..., 0]
    assert np.isnan(got[~inside]).all() and np.isfinite(got[inside]).sum() > 200
    want = pd.DataFrame(close).rank(axis=0, pct=True).to_numpy()
    assert np.allclose(got[inside & np.isfinite(want)], want[inside & np.isfinite(want)], rtol=1e-6)
    # the universe's spans change: the past cross-sections change, a full recompute says why
    set_universe(base, "core", spans.head(4))
    rep = update_features(feats)
    assert rep.mode == "full" and "universe core" in rep.reason


def test_new_symbols_recompute_the_cross_sections_in_full(frames, tmp_path):
    from kline_store import append, compute_features, ingest, update_features
    from test_compute import panel, same, write_folder
    first = {s: df for s, df in frames.items() if s != "S08"}
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", first)], base)
    compute_features(base, tmp_path / "feats", sets=[], exprs=CROSS)
    append(base, [write_folder(tmp_path / "b", {"S08": frames["S08"]})])
    rep = update_features(tmp_path / "feats")
    assert rep.mode == "full" and "cross-sections" in rep.reason
    compute_features(base, tmp_path / "full", sets=[], exprs=CROSS)
    assert same(panel(tmp_path / "feats"), panel(tmp_path / "full"))


def test_universe_errors_are_one_line(frames, tmp_path):
    from conftest import run_cli
    from kline_store import compute_features, ingest
    from test_compute import write_folder
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    with pytest.raises(InputError, match="no universe 'csi300'"):
        compute_features(base, tmp_path / "f", sets=[], exprs=CROSS, universe="csi300")
    with pytest.raises(InputError, match="no expression holds a cross-sectional operator"):
        compute_features(base, tmp_path / "f", sets=[], exprs={"M": "Mean($close, 5)"}, universe="csi300")
    res = run_cli(*["features", str(base), "-o", str(tmp_path / "f"), "--expr", "R=CSRank($close)",
                   "--universe", "nope"])
    assert res.returncode != 0 and "no universe 'nope'" in res.stderr and "Traceback" not in res.stderr
    res = run_cli(*["features", str(base), "-o", str(tmp_path / "g"), "--expr", "R=CSRank($close)", "--label", "none"])
    assert res.returncode == 0, res.stderr
    from kline_store import FeatureWindows
    with pytest.raises(InputError, match="R are cross-sectional"):
        FeatureWindows(base, 6, {"M": "Mean($close, 5)", "R": "CSRank($close)"})


@settings(max_examples=20, deadline=None)
@given(case=panels(), max_operands=st.integers(1, 3))
def test_stages_in_parts_give_the_same_values(case, max_operands):
    from kline_store.features.parse import parse
    from kline_store.features.stages import stage
    a, g, _ = case
    n_sym, n_bars = a.shape
    values = {"a": torch.from_numpy(a), "g": torch.from_numpy(g)}
    first, last = torch.zeros(n_sym, dtype=torch.int64), torch.full((n_sym,), n_bars - 1)
    roots = [parse(e) for e in ("CSRank($a) + CSZScore($a*2)", "GroupRank(CSDemean($a), $g) - CSScale($a)",
                                "CSRank(CSRank($a) + CSDemean(Ref($a, 1)))")]

    def run(operands, pseudo):
        return evaluate(operands, {**values, **pseudo}, first, last, dtype=torch.float64).values.permute(2, 0, 1)
    results = []
    for parts in (None, max_operands):
        final, pseudo = stage(roots, run, parts)
        results.append(evaluate(final, {**values, **pseudo}, first, last).values.numpy())
    assert np.array_equal(results[0], results[1], equal_nan=True)
    assert np.array_equal(results[0], evaluate(roots, values, first, last).values.numpy(), equal_nan=True)


def test_a_deep_expression_stages_without_recursion():
    """A sum of thousands of terms is a tree thousands deep: the stages' walks need no Python recursion."""
    a = torch.tensor(np.random.default_rng(2).normal(size=(5, 8)), dtype=torch.float32)
    deep = "CSRank(" + "+".join(["$a"] * 3000) + ") + " + "+".join(["0"] * 2000 + ["CSDemean($a)"])
    first, last = torch.zeros(5, dtype=torch.int64), torch.full((5,), 7)
    members = torch.ones(5, 8, dtype=torch.bool)
    got = evaluate([deep], {"a": a}, first, last, 2, members).values[..., 0].numpy()
    want = evaluate(["CSRank($a) + CSDemean($a)"], {"a": a}, first, last).values[..., 0].numpy()
    assert np.allclose(got, want, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_computes_what_the_cpu_does():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(40, 30)).round(1).astype(np.float32)
    a[rng.random(a.shape) < 0.2] = np.nan
    g = rng.integers(0, 4, a.shape).astype(np.float32)
    members = rng.random(a.shape) < 0.7
    cpu = ours(a, g, members)
    n_sym, n_bars = a.shape
    ev = evaluate(EXPRS, {"a": torch.from_numpy(a).cuda(), "g": torch.from_numpy(g).cuda()},
                  torch.zeros(n_sym, dtype=torch.int64), torch.full((n_sym,), n_bars - 1), 7,
                  torch.from_numpy(members).cuda(), dtype=torch.float64)
    assert np.allclose(ev.values.cpu().numpy(), cpu, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_operators_over_a_universe_equal_the_processors_over_it(frames, tmp_path):
    """CSRank/CSZScore inside expressions over universe members equal process_features' CSRankNorm/CSZScoreNorm
    over the same universe (the route compared with Qlib's DataHandlerLP(instruments=NAME) in test_process)."""
    from kline_store import compute_features, ingest, process_features, set_universe
    from test_compute import panel, write_folder
    base = tmp_path / "base"
    ingest([write_folder(tmp_path / "a", frames)], base)
    spans = pl.DataFrame({"symbol": ["S00", "S01", "S03", "S04", "S06", "S07", "S01"],
                          "start": ["2021-01-01", "2021-01-01", "2021-02-10", "2021-01-01", "2021-03-01",
                                    "2021-01-01", "2021-05-03"],
                          "end": [None, "2021-04-01", None, "2021-02-26", None, None, None]})
    set_universe(base, "core", spans)
    compute_features(base, tmp_path / "raw", sets=[], exprs={"C": "$close", "V": "Mean($volume, 5)"}, label=None)
    for proc, expr in (("CSRankNorm", "(CSRank($close) - 0.5) * 3.46"), ("CSZScoreNorm", "CSZScore($close)")):
        process_features(tmp_path / "raw", tmp_path / proc, infer=[proc], learn=[], universe="core")
        compute_features(base, tmp_path / f"ours{proc}", sets=[], exprs={"C": expr}, label=None, universe="core",
                         block_symbols=3)
        want, got = panel(tmp_path / proc)[..., 0], panel(tmp_path / f"ours{proc}")[..., 0]
        assert np.array_equal(np.isnan(want), np.isnan(got)), proc
        assert np.isfinite(got).sum() > 300 and np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), proc


def test_threads_keep_cross_sections_whole():
    """Threads split the symbols into tasks: a cross-section still spans every symbol of the day."""
    import torch
    from kline_store.features.evaluate import evaluate
    gen = torch.Generator().manual_seed(3)
    close = torch.rand(200, 40, generator=gen, dtype=torch.float32) + 1
    close[5, 3] = float("nan")
    first, last = torch.zeros(200, dtype=torch.int64), torch.full((200,), 39, dtype=torch.int64)
    exprs = {"r": "CSRank($close)", "z": "CSZScore(Mean($close, 5))"}
    one = evaluate(exprs, {"close": close}, first, last, threads=1).values
    two = evaluate(exprs, {"close": close}, first, last, threads=2).values
    assert torch.equal(one.isnan(), two.isnan()) and torch.equal(one.nan_to_num(), two.nan_to_num())
    ranks = one[:, 10, 0]                        # day 10: ranks of 200 symbols, not of a task's 32
    assert ranks.max().item() == 1.0 and abs(ranks.min().item() - 1 / 200) < 1e-6
