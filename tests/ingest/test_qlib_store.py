"""Qlib provider directories both ways, checked against Qlib itself on the 154 real A-share files.

Qlib (pyqlib 0.9.7) runs in its own virtualenv as a subprocess (tests/helpers_qlib.py); scripts/test.sh builds
it (.venv-qlib, see scripts/_qlib_env.sh). These tests skip only when it could not be built.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import kline_store as ks
from conftest import ROOT, run_cli
from kline_store.ingest.exporter import export

QLIB_PY = Path(os.environ.get("KLINE_QLIB_PYTHON", ROOT / ".venv-qlib" / "bin" / "python"))
HELPER = Path(__file__).resolve().parents[1] / "helpers_qlib.py"
FIELDS = ["open", "high", "low", "close", "volume"]


@pytest.fixture(scope="module")
def qlib_python() -> Path:
    venv = QLIB_PY.parent.parent
    if not QLIB_PY.exists():
        pytest.skip(f"no Qlib virtualenv at {venv}: scripts/test.sh builds it (log: {venv}/install.log)")
    r = subprocess.run([QLIB_PY, "-c", "import qlib.data.storage.file_storage"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"pyqlib does not import in {venv} (build log: {venv}/install.log): "
                    f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return QLIB_PY


def qlib(python: Path, *args: str | Path, cwd: Path) -> None:
    r = subprocess.run([python, HELPER, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def ashare(real) -> Path:
    return real / "ashare_qfq_daily" / "data_20251009"


@pytest.fixture(scope="module")
def qlib_dir(qlib_python, ashare, tmp_path_factory) -> Path:
    """The 154 files as a provider directory written by Qlib's own storage classes."""
    out = tmp_path_factory.mktemp("qlib") / "cn_data"
    qlib(qlib_python, "write", ashare, out, cwd=out.parent)
    return out


def csv_bars(ashare: Path) -> pl.DataFrame:
    """Every bar of the CSVs, as Qlib names the symbols, values as float32."""
    frames = [pl.read_csv(f, schema_overrides={"date": pl.String}).with_columns(
        pl.lit(("SH" if f.stem.startswith("6") else "SZ") + f.stem).alias("symbol")) for f in sorted(ashare.glob("*.csv"))]
    return pl.concat(frames).with_columns(pl.col("date").str.to_date(), *[pl.col(c).cast(pl.Float32) for c in FIELDS])


def test_reader_equals_the_csvs(qlib_dir, ashare, tmp_path):
    r = run_cli("ingest", str(qlib_dir), "-o", str(tmp_path / "st"))
    assert r.returncode == 0 and "stored 202997 bars from 770 file(s)" in r.stdout, r.stderr
    st = ks.open_store(tmp_path / "st")
    bars = csv_bars(ashare)
    assert st.symbols == sorted(bars["symbol"].unique()) and st.fields == FIELDS
    assert [str(d) for d in st.dates] == sorted(str(d) for d in bars["date"].unique())   # Qlib's calendar
    s = np.searchsorted(np.asarray(st.symbols), bars["symbol"].to_numpy())
    t = np.searchsorted(st.dates, bars["date"].to_numpy().astype("datetime64[D]"))
    panel = np.asarray(st.panel)
    np.testing.assert_array_equal(panel[s, t], bars.select(FIELDS).to_numpy())    # every value, bit for bit
    present = np.zeros(panel.shape[:2], bool)
    present[s, t] = True
    assert np.isnan(panel[~present]).all()          # NaN wherever the CSVs have no bar (Qlib's gaps included)
    assert int(np.count_nonzero(np.isnan(panel[present]))) == 0
    assert st.manifest["n_bars"] == bars.height == 202_997


def test_qlib_reads_the_export_back_equal(qlib_python, ashare, tmp_path):
    ks.ingest([ashare], tmp_path / "st")
    r = run_cli("export", str(tmp_path / "st"), "--format", "qlib", "-o", str(tmp_path / "qlib"))
    assert r.returncode == 0 and "wrote 154 symbols" in r.stdout, r.stderr
    qlib(qlib_python, "read", tmp_path / "qlib", tmp_path / "got.npz", cwd=tmp_path)
    got = np.load(tmp_path / "got.npz")
    st = ks.open_store(tmp_path / "st")
    assert list(got["fields"]) == sorted(FIELDS) and set(got["dtypes"]) == {"float32"}
    # D.features gives one row per calendar day from each symbol's first to its last bar, none outside
    spans = {(sym, d) for i, sym in enumerate(st.symbols)
             for d in st.dates[st.first_bar[i]: st.last_bar[i] + 1].tolist()}
    rows = set(zip(got["instrument"].tolist(), got["date"].tolist()))
    assert len(rows) == len(got["instrument"]) and rows == spans
    s = np.searchsorted(np.asarray(st.symbols), got["instrument"])
    t = np.searchsorted(st.dates, got["date"])
    want = np.asarray(st.panel)[s, t][:, [st.fields.index(f) for f in got["fields"]]]
    np.testing.assert_array_equal(got["values"], want)           # every value; NaN on the same days
    assert int(np.isnan(got["values"]).all(axis=1).sum()) == len(spans) - st.manifest["n_bars"] > 0


def test_a_qlib_directory_round_trips_byte_for_byte(qlib_dir, tmp_path):
    ks.ingest([qlib_dir], tmp_path / "st")
    export(tmp_path / "st", tmp_path / "back", fmt="qlib")
    ours = sorted(p.relative_to(tmp_path / "back") for p in (tmp_path / "back").rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(qlib_dir) for p in qlib_dir.rglob("*") if p.is_file())
    assert ours == theirs and len(ours) == 2 + 154 * 5
    assert all((tmp_path / "back" / p).read_bytes() == (qlib_dir / p).read_bytes() for p in ours)


def test_dump_bin_dump_all(qlib_python, ashare, tmp_path):
    """Qlib's scripts/dump_bin.py is not in the pyqlib wheel: this runs only with a copy of it at hand."""
    dump_bin = os.environ.get("KLINE_QLIB_DUMP_BIN")
    if not dump_bin:
        pytest.skip("set KLINE_QLIB_DUMP_BIN to a copy of Qlib's scripts/dump_bin.py (not in the pyqlib wheel)")
    qlib(qlib_python, "dump_all", dump_bin, ashare, tmp_path / "dumped", cwd=tmp_path)
    ks.ingest([tmp_path / "dumped"], tmp_path / "a")
    ks.ingest([ashare], tmp_path / "b")
    a, b = ks.open_store(tmp_path / "a"), ks.open_store(tmp_path / "b")
    assert a.symbols == b.symbols and a.fields == b.fields and (a.dates == b.dates).all()
    np.testing.assert_array_equal(np.asarray(a.panel), np.asarray(b.panel))
    export(tmp_path / "a", tmp_path / "back", fmt="qlib")
    for p in (tmp_path / "dumped").rglob("*"):
        if p.is_file():
            assert (tmp_path / "back" / p.relative_to(tmp_path / "dumped")).read_bytes() == p.read_bytes(), p


@pytest.mark.parametrize("bar", ["1w", "1mo"])
def test_a_qlib_round_trip_keeps_the_bar_size(qlib_python, ashare, tmp_path, bar):
    """A weekly or monthly store exported to Qlib (its dates are the calendar) and ingested back is weekly or
    monthly again, value for value; Qlib reads the bars on their dates."""
    ks.ingest(sorted(ashare.glob("*.csv"))[:20], tmp_path / "daily")
    r = run_cli("resample", str(tmp_path / "daily"), "-o", str(tmp_path / "long"), "--freq", bar)
    assert r.returncode == 0, r.stderr
    export(tmp_path / "long", tmp_path / "qlib", fmt="qlib")
    r = run_cli("ingest", str(tmp_path / "qlib"), "-o", str(tmp_path / "back"))
    assert r.returncode == 0 and ("weekly" if bar == "1w" else "monthly") + " bar dates" in r.stdout, r.stdout
    a, b = ks.open_store(tmp_path / "long"), ks.open_store(tmp_path / "back")
    assert a.bar == b.bar == bar and b.info()["bar"] == bar
    assert (a.dates == b.dates).all() and a.symbols == b.symbols
    np.testing.assert_array_equal(np.asarray(b.panel), np.asarray(a.panel)[:, :, [a.fields.index(f) for f in b.fields]])
    qlib(qlib_python, "read", tmp_path / "qlib", tmp_path / "got.npz", cwd=tmp_path)
    got = np.load(tmp_path / "got.npz")
    assert set(got["date"].tolist()) <= set(a.dates.tolist())            # Qlib's rows: the bars' dates
    s = np.searchsorted(np.asarray(a.symbols), got["instrument"])
    t = np.searchsorted(a.dates, got["date"])
    want = np.asarray(a.panel)[s, t][:, [a.fields.index(f) for f in got["fields"]]]
    np.testing.assert_array_equal(got["values"], want)


@pytest.mark.parametrize("point", ["qlib:filled", "qlib:data-in-place", "commit:copied", "commit:manifest-swapped"])
def test_kill9_while_ingesting_a_qlib_directory_leaves_old_or_new(qlib_dir, tmp_path, point):
    """A Qlib directory is written through the write transaction: killed at each of its steps, the store is the
    old version or the new one; killed before the commit, a first ingest leaves nothing a retry refuses."""
    import signal
    ks.ingest([qlib_dir], tmp_path / "s")
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    r = run_cli("ingest", "-q", "--replace", str(qlib_dir), "-o", str(tmp_path / "s"),
                env={"KLINE_STORE_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert ks.verify_store(tmp_path / "s") == []
    swapped = point == "commit:manifest-swapped"
    assert ((tmp_path / "s" / "manifest.json").read_bytes() == before) != swapped
    assert ks.open_store(tmp_path / "s").version == 1 + swapped
    assert ks.ingest([qlib_dir], tmp_path / "s", replace=True).version == 2 + swapped   # the next writer recovers
    assert ks.verify_store(tmp_path / "s") == [] and ks.open_store(tmp_path / "s").n_symbols == 154
    if point.startswith("qlib:"):
        r = run_cli("ingest", "-q", str(qlib_dir), "-o", str(tmp_path / "first"), env={"KLINE_STORE_CRASH_AT": point})
        assert r.returncode == -signal.SIGKILL and not (tmp_path / "first" / "manifest.json").exists()
        assert ks.ingest([qlib_dir], tmp_path / "first").version == 1
