"""ingest/universes_in.py: universes from Qlib instruments files, CSV, TSV, Parquet and DataFrames; every bad line one
error naming file, line and symbol with nothing written; a new store version, atomic and crash-safe; kept by
appends (an open span grows), by features stores and their --update, and by a Qlib ingest. Real A-share files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

import kline_store as ks
from conftest import run_cli, write
from kline_store.errors import InputError
from kline_store.ingest.universes_in import read_source

UNIVERSE = [sys.executable, "-m", "kline_store.cli", "universe"]


@pytest.fixture(scope="module")
def files(real) -> list[Path]:
    return sorted((real / "ashare_qfq_daily" / "data_20251009").glob("*.csv"))[:8]


@pytest.fixture
def store(files, tmp_path) -> Path:
    """Eight A-share symbols up to 2025-06-30 (the rest is appended by the tests)."""
    head = tmp_path / "head"
    head.mkdir()
    for f in files:
        df = pl.read_csv(f, schema_overrides={"date": pl.String})
        df.filter(pl.col("date") <= "2025-06-30").write_csv(head / f.name)
    ks.ingest([head], tmp_path / "s")
    return tmp_path / "s"


def member_days(st, name: str) -> dict[str, list[str]]:
    u = st.universe(name)
    return {s: [str(d) for d in st.dates[u[i]]] for i, s in enumerate(st.symbols) if u[i].any()}


def test_every_kind_of_source_gives_the_same_universe(store, tmp_path):
    st = ks.open_store(store)
    a, b, c = st.symbols[:3]
    rows = [(a, "2020-03-02", "2021-06-30"), (a, "2022-01-04", ""), (b, "2019-01-01", "2020-12-31"),
            (c, "2024-02-05", "2025-06-30")]
    qlib_file = write(tmp_path / "q.txt", "".join(f"{s}\t{x}\t{y or '2025-06-30'}\n" for s, x, y in rows))
    csv = write(tmp_path / "u.csv", "symbol,start,end\n" + "".join(f"{s},{x},{y}\n" for s, x, y in rows))
    tsv = write(tmp_path / "u.tsv", "instrument\tstart_date\tend_date\n" + "".join(f"{s}\t{x.replace('-', '')}\t"
                                                                               f"{y.replace('-', '')}\n"
                                                                               for s, x, y in rows))
    frame = pd.DataFrame({"symbol": [r[0] for r in rows], "start": pd.to_datetime([r[1] for r in rows]),
                          "end": pd.to_datetime([r[2] or None for r in rows])})
    pq = tmp_path / "u.parquet"
    pl.from_pandas(frame).write_parquet(pq)
    got = {}
    for name, source in (("q", qlib_file), ("c", csv), ("t", tsv), ("p", pq), ("f", frame),
                         ("pl", pl.from_pandas(frame))):
        rep = ks.set_universe(store, name, source)
        assert rep.symbols == 3 and rep.spans == 4 and rep.opened == (2 if name == "q" else 1)   # last day: open
        got[name] = ks.open_store(store).manifest["universes"][name]["spans"]
    assert all(v == got["c"] for v in got.values())
    assert got["c"][a] == [["2020-03-02", "2021-06-30"], ["2022-01-04", None]]
    st = ks.open_store(store)
    assert st.universes == ["c", "f", "p", "pl", "q", "t"] and st.version == 7
    days = member_days(st, "c")
    assert days[b][-1] == "2020-12-31" and days[a][0] == "2020-03-02" and "2021-07-01" not in days[a]


@pytest.mark.parametrize("text, what", [
    ("symbol,start,end\nNOPE,2020-01-02,2020-06-30\n", r"u.csv: line 2: symbol 'NOPE' is not in the store"),
    ("symbol,start,end\n{a},2020-01-02,2020-06-30\n{a},2021-01-04,2020-12-31\n",
     r"u.csv: line 3: {a}: starts 2021-01-04 after it ends 2020-12-31"),
    ("symbol,start,end\n{a},2020-01-02,2020-06-30\n{b},2020-01-02,\n{a},2020-06-30,2020-12-31\n",
     r"u.csv: line 4: {a}: span 2020-06-30..2020-12-31 overlaps its span 2020-01-02..2020-06-30 \(.*u.csv: line 2\)"),
    ("symbol,start,end\n{a},2020-01-02,\n{a},2021-01-04,2021-02-01\n", r"line 3: {a}: span .* overlaps its span "
                                                                       r"2020-01-02..open"),
    ("symbol,start,end\n{a},2020-13-02,\n", r"u.csv: line 2: start '2020-13-02' is not a date"),
    ("symbol,start,end\n{a},2020-01-02 09:30:00,\n", r"line 2: start '2020-01-02 09:30:00' has a time of day"),
    ("symbol,start,end\n{a},,2020-01-02\n", r"u.csv: line 2: {a}: no start date"),
    ("sym,from,to\n{a},2020-01-02,\n", r"u.csv: no symbol column; columns found: sym, from, to"),
    ("symbol,start,end\n", r"u.csv: no span listed"),
])
def test_a_bad_line_is_one_error_and_nothing_is_written(store, tmp_path, text, what):
    st = ks.open_store(store)
    a, b = st.symbols[:2]
    path = write(tmp_path / "u.csv", text.format(a=a, b=b))
    before = (store / "manifest.json").read_bytes()
    r = run_cli("universe", str(store), "idx", str(path))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kline-store: error: ")
    assert __import__("re").search(what.format(a=a), r.stderr), r.stderr
    assert (store / "manifest.json").read_bytes() == before


def test_qlib_file_and_dataframe_errors_name_their_line(store, tmp_path):
    st = ks.open_store(store)
    a = st.symbols[0]
    path = write(tmp_path / "idx.txt", f"{a}\t2020-01-02\t2020-06-30\nSZ{a}\t2020-07-01\t2020-08-31\n")
    with pytest.raises(InputError, match=rf"idx.txt: line 2: symbol 'SZ{a}' is not in the store"):
        ks.set_universe(store, "idx", path)
    named = write(tmp_path / "n.csv", "symbol,date,close\nSH600000,2020-01-02,1\nSH600000,2020-01-03,2\n")
    ks.ingest([named], tmp_path / "n")
    with pytest.raises(InputError, match=r"idx.txt: line 1: symbol 'sh600000' is not in the store \(the store "
                                         r"spells it 'SH600000'\)"):
        ks.set_universe(tmp_path / "n", "idx", write(tmp_path / "idx.txt", "sh600000\t2020-01-02\t2020-01-03\n"))
    frame = pl.DataFrame({"symbol": [a, a], "start": ["2020-01-02", "2020-03-02"], "end": ["2020-06-30", None]})
    with pytest.raises(InputError, match=rf"DataFrame: row 2: {a}: span 2020-03-02..open overlaps"):
        ks.set_universe(store, "idx", frame)
    with pytest.raises(InputError, match="is not a universe name"):
        ks.set_universe(store, "CSI300", frame)
    with pytest.raises(InputError, match="no such file"):
        ks.set_universe(store, "idx", tmp_path / "missing.csv")
    assert ks.open_store(store).universes == []


def test_cli_replaces_removes_and_says_unchanged(store, tmp_path):
    st = ks.open_store(store)
    path = write(tmp_path / "idx.csv", f"symbol,start,end\n{st.symbols[0]},2020-01-02,\n{st.symbols[1]},2021-01-04,"
                                       f"2022-12-30\n")
    r = run_cli("universe", str(store), "idx", str(path))
    assert r.returncode == 0 and "version 2): universe idx stored: 2 symbols, 2 spans" in r.stdout, r.stderr
    r = run_cli("universe", str(store), "idx", str(path))
    assert "version 2): universe idx unchanged" in r.stdout                 # the same spans: no new version
    write(path, f"symbol,start,end\n{st.symbols[2]},2020-01-02,2020-03-31\n")
    reader = ks.open_store(store)                                            # a reader keeps its snapshot
    r = run_cli("universe", str(store), "idx", str(path))
    assert "version 3): universe idx stored: 1 symbol," in r.stdout
    assert list(member_days(reader, "idx")) == st.symbols[:2]
    assert list(member_days(ks.open_store(store), "idx")) == [st.symbols[2]]
    r = run_cli("universe", str(store), "idx", "--remove")
    assert r.returncode == 0 and "universe idx removed" in r.stdout and ks.open_store(store).universes == []
    assert "universes" not in ks.open_store(store).manifest
    assert run_cli("universe", str(store), "idx").returncode == 2            # a usage error: SOURCE or --remove
    r = run_cli("universe", str(store), "idx", "--remove")
    assert r.returncode == 1 and "no universe 'idx' to remove" in r.stderr
    assert ks.verify_store(store) == []


@pytest.mark.parametrize("point", ["universe:edited", "commit:copied", "commit:manifest-swapped", "commit:done"])
def test_kill9_while_setting_a_universe_leaves_old_or_new(store, tmp_path, point):
    st = ks.open_store(store)
    path = write(tmp_path / "idx.csv", f"symbol,start,end\n{st.symbols[0]},2020-01-02,\n")
    before = (store / "manifest.json").read_bytes()
    r = subprocess.run(UNIVERSE + [str(store), "idx", str(path)], capture_output=True,
                       env=dict(os.environ, KLINE_STORE_CRASH_AT=point))
    assert r.returncode == -signal.SIGKILL
    assert ks.verify_store(store) == []
    after = ks.open_store(store)
    if point in ("universe:edited", "commit:copied"):
        assert (store / "manifest.json").read_bytes() == before and after.universes == []
    else:
        assert after.universes == ["idx"] and after.version == 2
    assert ks.set_universe(store, "idx", path).version == after.version + (after.universes == [])


def test_appends_keep_universes_and_an_open_span_grows(store, files, tmp_path):
    st = ks.open_store(store)
    a, b, c = st.symbols[:3]
    ks.set_universe(store, "idx", pl.DataFrame({"symbol": [a, b, c], "start": ["2024-01-02", "2020-01-02",
                                                                                "2023-03-01"],
                                                "end": [None, "2024-12-31", "2025-06-30"]}))
    before = member_days(ks.open_store(store), "idx")
    rep = ks.append(store, files)                                          # the bars after 2025-06-30
    assert rep.extra["new dates"] > 50
    new = ks.open_store(store)
    assert new.universes == ["idx"] and ks.verify_store(store) == []
    after = member_days(new, "idx")
    tail = [str(d) for d in new.dates if d > np.datetime64("2025-06-30")]
    for sym in (a, c):                                  # open (c's span ended on the store's last day): grown
        assert after[sym] == before[sym] + tail
    assert after[b] == before[b]                                          # closed: unchanged
    ref = tmp_path / "ref"
    ks.ingest(files, ref)
    ks.set_universe(ref, "idx", pl.DataFrame({"symbol": [a, b, c], "start": ["2024-01-02", "2020-01-02",
                                                                             "2023-03-01"],
                                              "end": [None, "2024-12-31", None]}))
    np.testing.assert_array_equal(new.universe("idx"), ks.open_store(ref).universe("idx"))


def test_features_stores_and_their_update_keep_universes(store, files, tmp_path):
    st = ks.open_store(store)
    ks.set_universe(store, "idx", pl.DataFrame({"symbol": st.symbols[:2], "start": ["2021-01-04", "2022-01-04"],
                                                "end": [None, None]}))
    feats = tmp_path / "feats"
    ks.compute_features(store, feats, sets=[], exprs={"MA5": "Mean($close, 5)/$close"})
    f = ks.open_store(feats)
    assert f.universes == ["idx"]
    np.testing.assert_array_equal(f.universe("idx"), ks.open_store(store).universe("idx"))
    ks.append(store, files)
    r = run_cli("features", str(feats), "--update")
    assert r.returncode == 0, r.stderr
    f2 = ks.open_store(feats)
    assert f2.n_dates == ks.open_store(store).n_dates and f2.universes == ["idx"]
    np.testing.assert_array_equal(f2.universe("idx"), ks.open_store(store).universe("idx"))
    assert f2.universe("idx")[:2, -1].all()                                 # the open spans reach the new days
    r = run_cli("process", str(feats), "-o", str(tmp_path / "proc"), "--fit-end", "2022-12-30", "--universe", "idx")
    assert r.returncode == 0 and "of universe idx" in r.stdout, r.stderr
    proc = ks.open_store(tmp_path / "proc")
    assert proc.universes == ["idx"] and proc.manifest["features"]["processing"]["universe"] == "idx"
    assert np.isnan(np.asarray(proc.panel)[~proc.universe("idx")][:, 0]).all()      # MA5 outside: no row
    r = run_cli("process", str(feats), "-o", str(tmp_path / "p2"), "--fit-end", "2022-12-30", "--universe", "no")
    assert r.returncode == 1 and "no universe 'no'; its universes: idx" in r.stderr


def test_a_qlib_ingest_refuses_a_bad_market_it_was_asked_for(tmp_path):
    """The instruments file asked for is checked like any universe; the store is not written."""
    root = tmp_path / "q"
    (root / "calendars").mkdir(parents=True)
    (root / "instruments").mkdir()
    (root / "features" / "sh600000").mkdir(parents=True)
    write(root / "calendars" / "day.txt", "2020-01-02\n2020-01-03\n2020-01-06\n")
    with open(root / "features" / "sh600000" / "close.day.bin", "wb") as fh:
        fh.write(np.array([0, 1, 2, 3], dtype="<f4").tobytes())
    write(root / "instruments" / "all.txt", "SH600000\t2020-01-02\t2020-01-06\n")
    write(root / "instruments" / "idx.txt", "SH600000\t2020-01-02\t2020-01-03\nSH600000\t2020-01-03\t2020-01-06\n")
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "s"), "--instruments", "idx")
    assert r.returncode == 1 and "idx.txt: line 2: SH600000: span 2020-01-03..2020-01-06 overlaps" in r.stderr
    assert not (tmp_path / "s").exists()
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "s"))
    assert r.returncode == 0 and "idx.txt (" in r.stdout and "overlaps" in r.stdout     # another market: left out
    assert ks.open_store(tmp_path / "s").universes == []


def test_read_source_kinds(tmp_path):
    path = write(tmp_path / "x.txt", "SH600000\t2020-01-02 00:00:00\t2020-03-31\n\nSZ000001\t2020-01-02\t2020-02-28\n")
    got, name = read_source(path)
    assert [(x.symbol, str(x.start), str(x.end), x.where.split(": ")[-1]) for x in got] == [
        ("SH600000", "2020-01-02", "2020-03-31", "line 1"), ("SZ000001", "2020-01-02", "2020-02-28", "line 3")]
    with pytest.raises(InputError, match="expected a file"):
        read_source(42)
    assert json.loads(json.dumps(name)) == str(path)
