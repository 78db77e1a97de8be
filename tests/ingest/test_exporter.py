"""Export a store back to long format: one row per bar, atomically, in Parquet or CSV."""

import numpy as np
import polars as pl
import pytest

from conftest import run_cli
from kline_store import InputError, ingest, open_store
from kline_store.ingest.exporter import export, to_frame
from kline_store.store import create_store

DATES = np.arange("2024-01-01", "2024-01-06", dtype="datetime64[D]")


@pytest.fixture
def store(tmp_path):
    panel = np.arange(2 * 5 * 2, dtype=np.float32).reshape(2, 5, 2)
    panel[1, :2] = np.nan            # not listed yet: no bar
    panel[0, 3, 1] = np.nan          # a missing value in a bar that exists
    create_store(tmp_path / "s", panel, ["A", "B"], DATES, ["close", "volume"])
    return tmp_path / "s"


def test_one_row_per_bar(store):
    df = to_frame(store)
    assert df.columns == ["symbol", "date", "close", "volume"] and df.height == 8
    assert df.filter(pl.col("symbol") == "B")["date"].to_list()[0].isoformat() == "2024-01-03"
    a4 = df.filter((pl.col("symbol") == "A") & (pl.col("date") == pl.date(2024, 1, 4)))
    assert a4["close"][0] == 6.0 and np.isnan(a4["volume"][0])     # a bar with a missing value stays a bar


@pytest.mark.parametrize("name", ["out.parquet", "out.csv"])
def test_round_trip_through_ingest(store, tmp_path, name):
    assert export(store, tmp_path / name) == 8
    ingest([tmp_path / name], tmp_path / "again")
    a, b = open_store(store), open_store(tmp_path / "again")
    assert a.symbols == b.symbols and np.array_equal(a.panel, b.panel, equal_nan=True)
    assert not list(tmp_path.glob(".out*"))            # no temporary file left


def test_bad_targets(store, tmp_path):
    with pytest.raises(InputError, match="unknown export format"):
        export(store, tmp_path / "out.xlsx")
    assert export(store, tmp_path / "nowhere" / "deep" / "out.csv") > 0   # a new nested folder is made (#18)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="cannot make the export's folder"):
        export(store, tmp_path / "afile" / "sub" / "out.csv")


@pytest.mark.parametrize("fmt,name", [("csv", "manifest.json"), ("parquet", "x.parquet"), ("qlib", "q"),
                                      ("csv", ".")])
def test_an_export_into_its_own_store_is_refused(store, fmt, name):
    """Issue 19: `export STORE -o STORE/manifest.json --format csv` overwrote the store's manifest."""
    before = (store / "manifest.json").read_bytes()
    r = run_cli("export", str(store), "-o", str(store / name), "--format", fmt)
    assert r.returncode == 1 and "is inside the store" in r.stderr and len(r.stderr.splitlines()) == 1
    assert (store / "manifest.json").read_bytes() == before
    assert not (store / "q").exists() and not (store / "x.parquet").exists()


def test_a_failing_parquet_write_is_one_line(store, tmp_path, monkeypatch):
    """Issue 19: a full disk during Parquet export was an "unexpected ComputeError"."""
    def full(self, *a, **k):
        raise pl.exceptions.ComputeError("No space left on device (os error 28)")
    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    with pytest.raises(InputError, match=r"cannot write the export \(No space left on device"):
        export(store, tmp_path / "x.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["s"]


def test_export_of_a_universe(store, tmp_path):
    import kline_store as ks

    ks.set_universe(store, "idx", pl.DataFrame({"symbol": ["A", "B"], "start": ["2024-01-02", "2024-01-04"],
                                                "end": ["2024-01-03", None]}))
    r = run_cli("export", str(store), "-o", str(tmp_path / "u.csv"), "--universe", "idx")
    assert r.returncode == 0 and "wrote 4 rows" in r.stdout, r.stderr
    df = pl.read_csv(tmp_path / "u.csv")
    assert list(zip(df["symbol"], df["date"])) == [("A", "2024-01-02"), ("A", "2024-01-03"), ("B", "2024-01-04"),
                                                   ("B", "2024-01-05")]
    assert to_frame(store, universe="idx").height == 4
    for out, args, what in (("x.csv", ["--universe", "nope"], "no universe 'nope'; its universes: idx"),
                            ("x", ["--universe", "idx", "--format", "qlib"], "not with --format qlib")):
        r = run_cli("export", str(store), "-o", str(tmp_path / out), *args)
        assert r.returncode == 1 and what in r.stderr and r.stderr.count("\n") == 1, r.stderr
    wide = open_store(store).to_pandas(fields="close", wide=True, universe="idx")
    assert wide["A"].notna().tolist() == [False, True, True, False, False]
    assert wide["B"].notna().tolist() == [False, False, False, True, True]
