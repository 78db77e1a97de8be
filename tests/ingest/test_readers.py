"""Reading single files: encodings, date forms, separators, missing values and precise errors."""

import numpy as np
import polars as pl
import pytest

from conftest import write
from kline_store.errors import InputError
from kline_store.ingest.readers import inspect_source, read_source


def read(path, user_map=None):
    return read_source(inspect_source(path, user_map))


def test_gbk_chinese_headers(tmp_path):
    text = "日期,股票代码,开盘,收盘,最高,最低,成交量,成交额,名称\n" \
           "2024-01-02,600519,1700.5,1710.0,1720.0,1690.0,12345,2.1e9,贵州茅台\n" \
           "2024-01-03,600519,1711.0,1705.0,1715.0,1700.0,12000,2.0e9,贵州茅台\n"
    p = write(tmp_path / "600519.csv", text, "gbk")
    src = inspect_source(p)
    assert src.encoding == "gb18030"
    assert src.dropped == ["名称"]  # a text column is not a field
    df = read_source(src)
    assert df["symbol"].to_list() == ["600519", "600519"]
    assert df["close"].to_list() == [1710.0, 1705.0]
    assert str(df["date"][0]) == "2024-01-02 00:00:00"   # a local timestamp; daily stores keep the date


@pytest.mark.parametrize("cell,expect", [
    ("20240102", "2024-01-02"), ("2024-01-02", "2024-01-02"), ("2024-01-02 15:00:00", "2024-01-02"),
    ("1/2/2024", "2024-01-02"), ("2024/01/02", "2024-01-02"), ("2024-01-02T00:00:00Z", "2024-01-02"),
])
def test_date_forms(tmp_path, cell, expect):
    p = write(tmp_path / "x.csv", f"date,close\n{cell},1.5\n")
    assert str(read(p)["date"].dt.date()[0]) == expect


def test_values_are_float32_of_source(tmp_path):
    p = write(tmp_path / "x.csv", "date,close,volume\n2024-01-02,523.4200440000001,123456789\n")
    df = read(p)
    assert df["close"].dtype == pl.Float32
    assert df["close"][0] == np.float32(523.4200440000001)
    assert df["volume"][0] == np.float32(123456789)  # beyond 2**24: rounded, as documented


def test_null_literals_are_missing(tmp_path):
    p = write(tmp_path / "x.csv", "date,open,close,volume\n2024-01-02,null,--,NA\n2024-01-03,,1,\n")
    df = read(p)
    assert df["open"].null_count() == 2 and df["close"].null_count() == 1


def test_non_numeric_value_names_file_line_column_value(tmp_path):
    p = write(tmp_path / "bad.csv", "date,open,close\n2024-01-02,1,2\n2024-01-03,1,abc\n")
    with pytest.raises(InputError) as e:
        read(p)
    msg = str(e.value)
    assert "bad.csv" in msg and "line 3" in msg and "'close'" in msg and "'abc'" in msg


def test_unparseable_date_is_named(tmp_path):
    p = write(tmp_path / "d.csv", "date,close\n2024-01-02,1\n2024-13-45,2\n")
    with pytest.raises(InputError, match=r"line 3: unparseable date '2024-13-45'"):
        read(p)


def test_missing_close_lists_columns(tmp_path):
    p = write(tmp_path / "m.csv", "date,open,price\n2024-01-02,1,2\n")
    with pytest.raises(InputError, match=r"no close column; columns found: date, open, price"):
        inspect_source(p)


def test_missing_date_column(tmp_path):
    p = write(tmp_path / "m.csv", "when,close\n2024-01-02,1\n")
    with pytest.raises(InputError, match="no date column"):
        inspect_source(p)
    assert read(p, {"when": "date"})["close"][0] == 1.0


def test_empty_file_and_header_only(tmp_path):
    with pytest.raises(InputError, match="empty"):
        inspect_source(write(tmp_path / "e.csv", ""))
    with pytest.raises(InputError, match="no data rows"):
        read(write(tmp_path / "h.csv", "date,close\n"))


def test_semicolon_and_tab_separated(tmp_path):
    assert read(write(tmp_path / "s.csv", "date;close\n2024-01-02;3.5\n"))["close"][0] == 3.5
    assert read(write(tmp_path / "t.tsv", "date\tclose\n2024-01-02\t4.5\n"))["close"][0] == 4.5


def test_parquet_with_typed_dates(tmp_path):
    p = tmp_path / "x.parquet"
    pl.DataFrame({"ticker": ["A", "B"], "date": np.array(["2024-01-02", "2024-01-03"], dtype="datetime64[D]"),
                  "close": [1.0, 2.0]}).write_parquet(p)
    df = read(p)
    assert df["symbol"].to_list() == ["A", "B"] and str(df["date"][1]) == "2024-01-03 00:00:00"


def test_real_quirks(real):
    ptr = read(real / "us_yahoo_daily" / "PTR.csv")
    row = ptr.filter(pl.col("date").dt.date() == pl.date(2016, 6, 29))
    assert row["close"].is_null().all()      # the literal null row
    czsc = read(real / "index_with_time" / "000001.SH_D.csv")
    assert str(czsc["date"][0]) == "2006-11-06 15:00:00" and czsc["symbol"][0] == "000001.SH"
    sp = read(real / "yahoo_mplfinance" / "SP500_NOV2019_Hist.csv")
    assert str(sp["date"].dt.date()[0]) == "2019-11-01"


def test_big_file_chunks_match_whole_read(tmp_path):
    """Cutting a CSV into pieces at line ends gives the same rows, row numbers and errors."""
    from kline_store.ingest import readers
    lines = ["ts_code,trade_date,close,vol"] + [f"S{i % 7},{20200101 + i % 28},{i}.5,{i}" for i in range(5000)]
    p = write(tmp_path / "long.csv", "\n".join(lines) + "\n")
    src = inspect_source(p)
    whole = list(readers.iter_chunks(src, chunk_bytes=1 << 30))
    old = readers.WHOLE_FILE
    readers.WHOLE_FILE = 0
    try:
        parts = list(readers.iter_chunks(src, chunk_bytes=4096))
        assert len(whole) == 1 and len(parts) > 5
        assert pl.concat(parts).equals(whole[0])
        bad = write(tmp_path / "bad.csv", "\n".join(lines[:3000] + ["S1,20200105,oops,1"] + lines[3000:]) + "\n")
        with pytest.raises(InputError, match="line 3001: column 'close': non-numeric value 'oops'"):
            list(readers.iter_chunks(inspect_source(bad), chunk_bytes=4096))
    finally:
        readers.WHOLE_FILE = old


@pytest.mark.parametrize("text,message", [
    ("date,symbol,close\n2024-01-02,A,1\n2024/01/03,A,2\n",
     "mixed date formats in column 'date': '2024-01-02' (line 2) and '2024/01/03' (line 3)"),
    ("date,symbol,close,volume\n2024-01-02,A,1,1,234.5\n", "line 2: 5 fields, the header has 4"),
    ("date,symbol,close\n2024-01-02,A,inf\n", "line 2: column 'close': infinite value"),
    ("date,symbol,close\n2024-01-02, ,1\n", "line 2: empty symbol in column 'symbol'"),
])
def test_nasty_inputs_are_named(tmp_path, text, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read(write(tmp_path / "x.csv", text))


def test_forgiving_where_meaning_is_clear(tmp_path):
    assert read(write(tmp_path / "a.csv", "date, symbol, close\n2024-01-02,A,1\n"))["close"][0] == 1.0  # spaces
    assert read(write(tmp_path / "b.csv", "date,symbol,close\n2024-01-02,A,1\n\n")).height == 1   # blank line
    nan = read(write(tmp_path / "c.csv", "date,symbol,close\n2024-01-02,A,1\n2024-01-03,A,NaN\n"))
    assert nan["close"].null_count() == 1                       # NaN text is a missing value, like "null"
    assert read(write(tmp_path / "IBM.CSV", "date,close\n2024-01-02,1\n"))["symbol"][0] == "IBM"


def test_time_zone_aware_parquet_keeps_the_local_date(tmp_path):
    p = tmp_path / "tz.parquet"
    pl.DataFrame({"date": ["2024-01-02 00:00", "2024-01-03 00:00"], "close": [1.0, 2.0]}).with_columns(
        pl.col("date").str.to_datetime().dt.replace_time_zone("Asia/Shanghai")).write_parquet(p)
    assert [str(d) for d in read(p)["date"]] == ["2024-01-02 00:00:00", "2024-01-03 00:00:00"]   # local clock


CUT = ("Date,Open,High,Low,Close,Adj Close,Volume\n2017-09-05,100.5,102.25,99.75,101.0,101.0,1000\n"
       "2017-09-06,101.5\n")


def test_a_cut_line_is_an_error_not_missing_values(tmp_path):
    """Case 1: the issue's file was stored with "problems: none"."""
    with pytest.raises(InputError, match=r"cut\.csv: line 3: 2 fields, the header has 7 \(a cut line\?\)"):
        read(write(tmp_path / "cut.csv", CUT))


def test_a_long_and_a_short_line_that_balance_are_both_caught(tmp_path):
    """The separator totals balance; polars' full parse rejects the long line and the exact pass names it."""
    text = "date,close,volume\n2024-01-02,1,1\n2024-01-03,1\n2024-01-04,1,2,3\n"
    with pytest.raises(InputError, match="line 3: 2 fields, the header has 3"):
        read(write(tmp_path / "x.csv", text))


def test_field_counts_are_checked_in_every_piece_of_a_big_file(tmp_path):
    from kline_store.ingest import readers
    lines = ["ts_code,trade_date,close,vol"] + [f"S{i % 7},{20200101 + i % 28},{i}.5,{i}" for i in range(5000)]
    bad = write(tmp_path / "bad.csv", "\n".join(lines[:4000] + ["S1,20200105,16"] + lines[4000:]) + "\n")
    old = readers.WHOLE_FILE
    readers.WHOLE_FILE = 0
    try:
        with pytest.raises(InputError, match="bad.csv: line 4001: 3 fields, the header has 4"):
            list(readers.iter_chunks(inspect_source(bad), chunk_bytes=4096))
    finally:
        readers.WHOLE_FILE = old


def test_gbk_text_after_64_kib_of_ascii(real, tmp_path):
    """Case 6: a real tushare file with a GBK name column whose first 64 KiB are ASCII was rejected."""
    src = (real / "tushare_daily" / "000001.SZ.csv").read_text().splitlines()
    rows = [f"{line},{'PAYH' if i < 900 else '平安银行'}" for i, line in enumerate(src[1:])]
    text = src[0] + ",name\n" + "\n".join(rows) + "\n"
    assert text.index("平") > 1 << 16
    p = write(tmp_path / "000001.SZ.csv", text, "gbk")
    s = inspect_source(p)
    assert s.encoding == "gb18030" and s.dropped == ["name"]
    df = read_source(s)
    assert df.height == len(src) - 1 and df["symbol"][0] == "000001.SZ"


def test_a_list_typed_parquet_column_is_named(tmp_path):
    """Case 8: a list column gave `unexpected SchemaError` without the file name."""
    p = tmp_path / "x.parquet"
    pl.DataFrame({"date": ["2024-01-02"], "close": [[1.0, 2.0]]}).write_parquet(p)
    with pytest.raises(InputError, match=r"x\.parquet: column 'close' has type List\(Float64\); close needs numbers"):
        inspect_source(p)
    q = tmp_path / "y.parquet"
    pl.DataFrame({"date": ["2024-01-02"], "close": [1.0], "tags": [["a", "b"]]}).write_parquet(q)
    s = inspect_source(q)
    assert s.dropped == ["tags"] and read_source(s)["close"][0] == 1.0


@pytest.mark.parametrize("tight", [True, False])
def test_big_parquet_slices_match_whole_read(tmp_path, monkeypatch, tight):
    """A Parquet file read in slices of whole row groups (memory tight) or by polars' streaming reader gives the
    same rows and row numbers as in one go."""
    from kline_store.ingest import readers
    n = 5000
    df = pl.DataFrame({"ts_code": [f"S{i % 7}" for i in range(n)], "trade_date": [20200101 + i % 28 for i in range(n)],
                       "close": [i + 0.5 for i in range(n)], "vol": [float(i) for i in range(n)]})
    p = tmp_path / "long.parquet"
    df.write_parquet(p, row_group_size=300)
    src = inspect_source(p)
    whole = list(readers.iter_chunks(src, chunk_bytes=1 << 30))
    monkeypatch.setattr(readers, "WHOLE_FILE", 0)
    monkeypatch.setattr(readers, "STREAM_MEMORY", 1 << 62 if tight else 0)
    parts = list(readers.iter_chunks(src, chunk_bytes=4096))
    assert len(whole) == 1 and len(parts) > 5
    assert pl.concat(parts).equals(whole[0])
    bad = tmp_path / "bad.parquet"
    df.with_columns(pl.col("close").cast(pl.String)).with_columns(
        pl.when(pl.int_range(n) == 3000).then(pl.lit("oops")).otherwise(pl.col("close")).alias("close")
    ).write_parquet(bad, row_group_size=300)
    with pytest.raises(InputError, match="row 3001: column 'close': non-numeric value 'oops'"):
        list(readers.iter_chunks(inspect_source(bad), chunk_bytes=4096))


def test_a_file_read_again_from_its_start(tmp_path, monkeypatch):
    """Words that mean "missing" after the first chunk, and GBK text after an ASCII first block: the file is read
    again on the text path or as GB18030 (readers.Reread) and its bars are those of a read in one go."""
    import importlib

    from kline_store.ingest import readers, textscan
    from kline_store.ingest.bars import read_bars
    bars = importlib.import_module("kline_store.ingest.bars")
    lines = ["ts_code,trade_date,close,vol,name"] + [f"S{i % 7},{20200101 + i % 28},{i}.5,{i},abc"
                                                     for i in range(5000)]
    na = write(tmp_path / "na.csv", "\n".join(lines[:4000] + ["S1,20200105,NA,1,abc"] + lines[4000:]) + "\n")
    gbk = tmp_path / "gbk.csv"
    gbk.write_bytes(("\n".join(lines) + "\nS1,20200105,1.5,2,平安银行\n").encode("gbk"))
    whole = {p: read_bars([p]) for p in (na, gbk)}
    monkeypatch.setattr(textscan, "BLOCK", 4096)          # the GBK name lies past the first block
    assert read_bars([gbk]).sources[0]["encoding"] == "gb18030"     # one chunk: found before it is handed out
    monkeypatch.setattr(readers, "WHOLE_FILE", 0)
    monkeypatch.setattr(bars, "PIECES_FROM", 0)
    monkeypatch.setattr(bars, "PIECE_BYTES", 4096)
    for p, want in whole.items():
        got = read_bars([p])
        assert got.sources[0]["encoding"] == want.sources[0]["encoding"]
        assert sorted(got.names) == sorted(want.names) and len(got) == len(want) == (5000 if p == na else 5001)
        np.testing.assert_array_equal(np.asarray(got.names)[got.sym], np.asarray(want.names)[want.sym])
        for col in ("minute", "row", "values"):
            np.testing.assert_array_equal(getattr(got, col), getattr(want, col))
        assert sorted(got.stamps) == sorted(want.stamps)
    assert whole[gbk].sources[0]["encoding"] == "gb18030"


def test_stamp_set_marks_what_unique_finds(monkeypatch):
    from kline_store.ingest.sink import StampSet
    rng = np.random.default_rng(1)
    for span in (50, 10 ** 6):
        monkeypatch.setattr(StampSet, "MAX_SPAN", span)
        s, seen = StampSet(), []
        for _ in range(20):
            block = rng.integers(-500, 500, rng.integers(0, 40)) * int(rng.choice([1, 1440])) + int(rng.integers(-10**5, 10**5))
            s.add(block)
            seen.append(block)
        assert s.values().tolist() == np.unique(np.concatenate(seen)).tolist()
