"""The files users have (issue 25 part 3): JSON and NDJSON records of bars, a .tar.gz/.tgz holding one CSV, a long
symbol,date,price file read as close-only bars (not "ticks"), and a wide SYM:field file refused in one line that
shows the reshape (which, run as shown, gives a file that ingests exactly)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write
from kline_store import ingest, open_store
from kline_store.errors import InputError


def frame(n=30, seed=0):
    rng = np.random.default_rng(seed)
    c = np.round(10 + np.cumsum(rng.normal(0, 0.2, n)), 4)
    return pd.DataFrame({"date": pd.bdate_range("2024-01-02", periods=n).strftime("%Y-%m-%d"),
                         "open": np.round(c * 1.001, 4), "high": np.round(c * 1.01, 4), "low": np.round(c * 0.99, 4),
                         "close": c, "volume": rng.integers(100, 10_000, n)})


def same_as(st, df, row=0):
    for f in ("open", "high", "low", "close", "volume"):
        assert np.array_equal(st.array(f)[row], df[f].to_numpy(np.float32)), f


@pytest.mark.parametrize("kind", ["json", "ndjson", "jsonl", "epoch"])
def test_json_records_of_bars(tmp_path, kind):
    df = frame()
    p = tmp_path / f"AAA.{'json' if kind == 'epoch' else kind}"
    if kind == "epoch":   # pandas' default to_json: datetimes as epoch milliseconds
        df.assign(date=pd.to_datetime(df["date"])).to_json(p, orient="records", date_format="epoch")
    else:
        df.to_json(p, orient="records", lines=kind != "json")
    rep = ingest([p], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert st.symbols == ["AAA"] and [str(d) for d in st.dates] == df["date"].tolist()
    same_as(st, pd.read_json(p, orient="records", lines=kind in ("ndjson", "jsonl")))
    assert any("epoch milliseconds" in n for n in rep.notes) == (kind == "epoch")


def test_json_messages_name_the_record(tmp_path):
    df = frame(5).astype({"close": object})
    df.loc[3, "close"] = "n/a?"
    df.to_json(tmp_path / "a.json", orient="records")
    r = run_cli("ingest", str(tmp_path / "a.json"), "-o", str(tmp_path / "s"))
    assert r.returncode == 1 and "a.json: record 4" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    write(tmp_path / "n.json", '[{"date": "2024-01-02", "px": {"close": 1}}]')
    with pytest.raises(InputError, match="n.json: expected records of bars.*px hold lists or objects"):
        ingest([tmp_path / "n.json"], tmp_path / "t")
    write(tmp_path / "bad.json", '{"date": ')
    with pytest.raises(InputError, match="bad.json: cannot read as a JSON array of records"):
        ingest([tmp_path / "bad.json"], tmp_path / "t")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_a_tar_gz_of_one_csv_reads_like_a_zip(tmp_path, suffix):
    df = frame(seed=2)
    raw = df.to_csv(index=False).encode()
    p = tmp_path / f"BBB{suffix}"
    with tarfile.open(p, "w:gz") as t:
        info = tarfile.TarInfo("data/BBB.csv")
        info.size = len(raw)
        t.addfile(info, io.BytesIO(raw))
    ingest([p], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert st.symbols == ["BBB"]
    same_as(st, pd.read_csv(io.BytesIO(raw)))
    two = tmp_path / f"two{suffix}"
    with tarfile.open(two, "w:gz") as t:
        for name in ("a.csv", "b.csv"):
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    r = run_cli("ingest", str(two), "-o", str(tmp_path / "t"))
    assert r.returncode == 1 and "a tar archive is read when it holds one CSV file; it holds a.csv, b.csv" in r.stderr


def test_a_long_price_file_is_close_only_bars_and_ticks_stay_ticks(tmp_path):
    months = pd.date_range("2000-01-31", periods=24, freq="ME").strftime("%Y-%m-%d")
    rows = [(s, d, round(100 + i + k * 7.25, 2)) for k, s in enumerate(("GS10", "CPI")) for i, d in enumerate(months)]
    p = write(tmp_path / "series.csv", "symbol,date,price\n" + "".join(f"{s},{d},{v}\n" for s, d, v in rows))
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "column 'price' read as close: close-only bars" in r.stdout and "ticks" not in r.stdout
    st = open_store(tmp_path / "s")
    src = pd.read_csv(p)
    assert st.fields == ["close"] and st.manifest["bar"] == "1mo"
    for i, s in enumerate(st.symbols):
        assert np.array_equal(st.array("close")[i], src[src.symbol == s]["price"].to_numpy(np.float32))
    t = write(tmp_path / "trades.csv", "symbol,time,price\nA,2020-01-02 09:30:01,1.5\nA,2020-01-02 09:30:02,1.6\n")
    r = run_cli("ingest", str(t), "-o", str(tmp_path / "t"))
    assert r.returncode == 1 and "ticks (one price per trade), not bars" in r.stderr


def test_a_wide_file_is_refused_showing_the_reshape(tmp_path):
    a, b = frame(seed=3), frame(seed=4)
    wide = pd.DataFrame({"date": a["date"]})
    for sym, df in (("BTC", a), ("ETH", b)):
        for f in ("open", "high", "low", "close", "volume"):
            wide[f"{sym}:{f}"] = df[f]
    p = tmp_path / "wide.csv"
    wide.to_csv(p, index=False)
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"))
    err = r.stderr.strip()
    assert r.returncode == 1 and "\n" not in err and "a wide file, one column per symbol and field" in err, err
    assert not (tmp_path / "s").exists()
    code = err.split("e.g. ", 1)[1]
    subprocess.run([sys.executable, "-c", "import pandas; " + code], cwd=tmp_path, check=True)
    ingest([tmp_path / "long.csv"], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert st.symbols == ["BTC", "ETH"]
    same_as(st, a, 0)
    same_as(st, b, 1)
