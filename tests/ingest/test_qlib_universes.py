"""Universes and labels at the exits, against Qlib 0.9.7 itself, on a Qlib directory of the 154 real A-share files
with an instruments file of our own whose symbols enter, leave and come back.

Qlib runs in its own virtualenv (tests/helpers_qlib.py: `features` is D.features(D.instruments(NAME), exprs),
`handler` is DataHandlerLP(instruments=NAME, ...) with Qlib's benchmark processors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas.testing as pd_testing
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from test_qlib_store import ashare, qlib, qlib_python  # noqa: F401  (fixtures)

import kline_store as ks
from conftest import run_cli
from kline_store.ingest.exporter import export

FIELDS = ["open", "high", "low", "close", "volume"]
LABEL = "Ref($close, -2)/Ref($close, -1) - 1"
EXPRS = {"RET1": "$close/Ref($close, 1) - 1", "MA5": "Mean($close, 5)/$close", "STD20": "Std($close, 20)/$close",
         "KMID": "($close-$open)/$open", "CORR10": "Corr($close, Log($volume+1), 10)", "RANK10": "Rank($close, 10)"}
FIT = ("2020-01-02", "2022-12-30")


def calendar(root: Path) -> list[str]:
    return (root / "calendars" / "day.txt").read_text().split()


def listed(root: Path) -> list[str]:
    return sorted(line.split("\t")[0] for line in (root / "instruments" / "all.txt").read_text().splitlines())


def our_spans(symbols: list[str], days: list[str]) -> list[tuple[str, str, str]]:
    """Five kinds of membership: the whole calendar, entering, leaving, leaving and coming back twice, and spans
    reaching outside the calendar (from before its first day, to years after its last)."""
    out = []
    for k, s in enumerate(symbols):
        kind = k % 5
        if kind == 0:
            out.append((s, days[0], days[-1]))
        elif kind == 1:
            out.append((s, days[300], days[-1]))
        elif kind == 2:
            out.append((s, days[0], days[700]))
        elif kind == 3:
            out += [(s, days[100], days[400]), (s, days[800], days[1100]), (s, days[1200], days[-1])]
        else:
            sat = str(np.datetime64(days[600]) + 1)        # may be a weekend: the span starts between trading days
            out += [(s, "2019-06-03", days[250]), (s, sat, "2030-12-31")]
    return out


def write_market(root: Path, name: str, spans: list[tuple[str, str, str]]) -> None:
    (root / "instruments" / f"{name}.txt").write_text("".join(f"{s}\t{a}\t{b}\n" for s, a, b in spans))


@pytest.fixture(scope="module")
def qdir(qlib_python, ashare, tmp_path_factory) -> Path:
    """The 154 files written by Qlib's storage classes, plus markets: ``mine`` (40 symbols), ``sub`` (a part of
    it), ``wide`` (symbols outside it) and ``bad`` (overlapping spans)."""
    out = tmp_path_factory.mktemp("qu") / "cn_data"
    qlib(qlib_python, "write", ashare, out, cwd=out.parent)
    days, symbols = calendar(out), listed(out)
    picked = symbols[::3][:40]
    mine = our_spans(picked, days)
    write_market(out, "mine", mine)
    write_market(out, "sub", [m for m in mine if m[0] in picked[:10]])
    write_market(out, "wide", [(s, days[0], days[-1]) for s in symbols if s not in picked][:5])
    write_market(out, "bad", [(picked[0], days[0], days[500]), (picked[0], days[400], days[-1])])
    return out


@pytest.fixture(scope="module")
def store(qdir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qu_store") / "st"
    r = run_cli("ingest", str(qdir), "-o", str(out), "--instruments", "mine")
    assert r.returncode == 0, r.stderr
    assert "universes mine (40 symbols), sub (10 symbols)" in r.stdout
    assert "bad.txt" in r.stdout and "overlaps" in r.stdout and "wide.txt (5 of its symbols are not in the store)" \
        in r.stdout, r.stdout
    return out


def qlib_rows(python: Path, root: Path, market: str, exprs: list[str], tmp: Path) -> pl.DataFrame:
    spec = tmp / f"spec-{market}-{abs(hash(tuple(exprs)))}.json"
    spec.write_text(json.dumps({"market": market, "exprs": exprs}))
    out = spec.with_suffix(".npz")
    qlib(python, "features", root, spec, out, cwd=tmp)
    got = np.load(out)
    return pl.DataFrame({"symbol": got["instrument"], "date": got["date"],
                         **{n: got["values"][:, j] for j, n in enumerate(got["names"])}})


def reference_member(root: Path, name: str, symbols: list[str], days: list[str]) -> np.ndarray:
    """Membership straight from the instruments file: day d of symbol s is inside one of its lines' spans."""
    out = np.zeros((len(symbols), len(days)), dtype=bool)
    dd = np.array(days, dtype="datetime64[D]")
    for line in (root / "instruments" / f"{name}.txt").read_text().splitlines():
        s, a, b = line.split("\t")
        if s in symbols:
            out[symbols.index(s)] |= (dd >= np.datetime64(a)) & (dd <= np.datetime64(b))
    return out


def test_ingest_keeps_the_markets_as_universes(qdir, store):
    st = ks.open_store(store)
    assert st.universes == ["mine", "sub"] and st.n_symbols == 40
    days = calendar(qdir)
    for name in st.universes:
        u = st.universe(name)
        assert u.dtype == bool and u.shape == (st.n_symbols, st.n_dates) and not u.flags.writeable
        np.testing.assert_array_equal(u, reference_member(qdir, name, st.symbols, days))
    spans = st.manifest["universes"]["mine"]["spans"]
    assert sum(len(v) for v in spans.values()) == 8 * 1 + 8 + 8 + 8 * 3 + 8 * 2
    assert all(v[-1][1] is None for k, v in spans.items() if st.symbols.index(k) % 5 in (0, 1, 3))   # open
    assert ks.verify_store(store) == []
    info = run_cli("info", str(store))
    assert "universe mine (40 symbols, 32 members on 2025-09-30, 64 spans)" in info.stdout, info.stdout


def test_universe_rows_are_qlibs_rows(qlib_python, qdir, store, tmp_path):
    """to_polars(universe=) / export --universe: exactly D.features(D.instruments(NAME), ...)'s rows, cell for cell
    (Qlib also returns all-NaN rows on member days inside a symbol's span without a bar: no bar, no row here)."""
    theirs = qlib_rows(qlib_python, qdir, "mine", [f"${f}" for f in FIELDS], tmp_path)
    st = ks.open_store(store)
    ours = st.to_polars(universe="mine")
    r = run_cli("export", str(store), "-o", str(tmp_path / "mine.parquet"), "--universe", "mine")
    assert r.returncode == 0 and f"wrote {ours.height} rows" in r.stdout, r.stderr
    assert_frame_equal(pl.read_parquet(tmp_path / "mine.parquet"), ours)
    joined = theirs.join(ours, on=["symbol", "date"], how="left", suffix="_ours")
    have = joined.filter(pl.col("close").is_not_null())
    assert have.height == ours.height > 10_000                         # every row of ours is one of Qlib's
    for f in FIELDS:
        np.testing.assert_array_equal(have[f"${f}"].cast(pl.Float32).to_numpy(), have[f].to_numpy())
    rest = joined.filter(pl.col("close").is_null()).select([f"${f}" for f in FIELDS]).to_numpy()
    assert np.isnan(rest).all() and len(rest) > 0                      # Qlib's other rows: days without a bar
    assert ours.height < st.to_polars().height                          # the universe left rows out


def test_a_qlib_export_gives_qlib_the_same_rows(qlib_python, qdir, store, tmp_path):
    export(store, tmp_path / "back", fmt="qlib")
    text = (tmp_path / "back" / "instruments" / "mine.txt").read_text()
    assert len(text.splitlines()) == 64 and (tmp_path / "back" / "instruments" / "sub.txt").is_file()
    for market in ("mine", "sub"):
        a = qlib_rows(qlib_python, qdir, market, ["$close", "$volume"], tmp_path).sort(["symbol", "date"])
        b = qlib_rows(qlib_python, tmp_path / "back", market, ["$close", "$volume"], tmp_path).sort(["symbol", "date"])
        assert a.height > 0
        assert_frame_equal(a, b)
    ks.ingest([tmp_path / "back"], tmp_path / "again", instruments="mine")
    again, st = ks.open_store(tmp_path / "again"), ks.open_store(store)
    assert again.universes == st.universes
    for name in st.universes:
        assert again.manifest["universes"][name]["spans"] == st.manifest["universes"][name]["spans"]


def test_labels_leave_a_features_store_on_their_day(qlib_python, qdir, store, tmp_path):
    """LABEL0 is stored two bars after the day it labels; every row that leaves the store has it on that day:
    equal to Qlib's own LABEL0 of the same rows, in Parquet and through a Qlib export read by Qlib."""
    feats = tmp_path / "feats"
    ks.compute_features(store, feats, sets=[], exprs={"RET1": EXPRS["RET1"]})
    fs = ks.open_store(feats)
    assert fs.universes == ["mine", "sub"]                              # the source's universes kept
    theirs = qlib_rows(qlib_python, qdir, "mine", [LABEL], tmp_path).rename({LABEL: "qlib"})
    export(feats, tmp_path / "f.parquet", universe="mine")
    ours = pl.read_parquet(tmp_path / "f.parquet")
    pd_testing.assert_frame_equal(fs.to_pandas(universe="mine"), ours.to_pandas())
    both = theirs.join(ours, on=["symbol", "date"], how="inner")
    assert both.height == ours.height
    q, o = both["qlib"].to_numpy(), both["LABEL0"].to_numpy().astype(np.float64)
    agree = (np.isnan(q) & np.isnan(o)) | (np.abs(q - o) <= 1e-5 + 1e-4 * np.abs(q))
    assert agree.mean() >= 0.999, agree.mean()
    stored = fs.array("LABEL0")                                          # the stored layout: the day's own return
    s = np.searchsorted(np.asarray(fs.symbols), both["symbol"].to_numpy())
    t = np.searchsorted(fs.dates, both["date"].to_numpy().astype("datetime64[D]"))
    moved = stored[s, t].astype(np.float64)
    assert ((np.abs(q - moved) <= 1e-5 + 1e-4 * np.abs(q)) & np.isfinite(q)).mean() < 0.05
    whole = fs.to_polars()
    last = whole.group_by("symbol").tail(2)                              # the last two rows: not known yet
    assert last["LABEL0"].is_nan().all() and whole.group_by("symbol").len()["len"].min() > 2
    export(feats, tmp_path / "fq", fmt="qlib")
    read = qlib_rows(qlib_python, tmp_path / "fq", "mine", ["$label0"], tmp_path)
    both = theirs.join(read, on=["symbol", "date"], how="inner")
    assert both.height == theirs.height
    q, o = both["qlib"].to_numpy(), both["$label0"].to_numpy()
    agree = (np.isnan(q) & np.isnan(o)) | (np.abs(q - o) <= 1e-5 + 1e-4 * np.abs(q))
    assert agree.mean() >= 0.999, agree.mean()


def test_processing_a_universe_is_qlibs_handler(qlib_python, qdir, store, tmp_path):
    """process_features(universe=NAME) equals DataHandlerLP(instruments=NAME, infer=[RobustZScoreNorm, Fillna],
    learn=[DropnaLabel, CSRankNorm])'s learn view; rows outside the universe are NaN."""
    feats, proc = tmp_path / "feats", tmp_path / "proc"
    ks.compute_features(store, feats, sets=[], exprs=EXPRS)
    rep = ks.process_features(feats, proc, fit_start=FIT[0], fit_end=FIT[1], universe="mine")
    assert "of universe mine" in rep.lines()[0]
    spec = tmp_path / "handler.json"
    spec.write_text(json.dumps({"market": "mine", "exprs": list(EXPRS.values()), "names": list(EXPRS),
                                "label": LABEL, "fit_start": FIT[0], "fit_end": FIT[1]}))
    qlib(qlib_python, "handler", qdir, spec, tmp_path / "handler.npz", cwd=tmp_path)
    got = np.load(tmp_path / "handler.npz")
    names = list(got["names"])
    theirs = pl.DataFrame({"symbol": got["instrument"], "date": got["date"],
                           **{f"q_{n}": got["values"][:, j] for j, n in enumerate(names)}})
    ps = ks.open_store(proc)
    ours = ps.to_polars(universe="mine")
    both = theirs.join(ours, on=["symbol", "date"], how="inner")
    assert both.height == theirs.height > 10_000                       # every row Qlib kept is one of ours
    q = both.select([f"q_{n}" for n in names]).to_numpy()
    o = both.select(names).to_numpy().astype(np.float64)
    agree = (np.isnan(q) & np.isnan(o)) | (np.abs(q - o) <= 1e-4 + 1e-3 * np.abs(q))
    assert agree.mean() >= 0.999, agree.mean(axis=0)
    extra = ours.join(theirs, on=["symbol", "date"], how="anti")       # rows Qlib dropped: NaN label here
    assert extra["LABEL0"].is_nan().all()
    member = ps.universe("mine")
    panel = np.asarray(ps.panel)
    assert np.isnan(panel[~member][:, :len(EXPRS)]).all()               # outside the universe: no row
