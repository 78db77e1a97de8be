import pytest

from kline_store.ingest import columns
from kline_store.errors import InputError


@pytest.mark.parametrize("header,expect", [
    (["ts_code", "trade_date", "open", "high", "low", "close", "pre_close", "change", "pct_chg", "vol", "amount"],
     {"ts_code": "symbol", "trade_date": "date", "vol": "volume", "amount": "amount", "pct_chg": "pct_chg"}),
    (["日期", "股票代码", "开盘", "收盘", "最高", "最低", "成交量", "成交额"],
     {"日期": "date", "股票代码": "symbol", "开盘": "open", "收盘": "close", "成交额": "amount"}),
    (["Date", "Open", "High", "Low", "Close", "Adj Close", "Volume"], {"Adj Close": "adj_close", "Date": "date"}),
    (["code", "date", "open", "close"], {"code": "symbol"}),  # baostock
    (["ticker", "date", "ex-dividend", "split_ratio", "adj_close"],
     {"ticker": "symbol", "ex-dividend": "ex_dividend", "split_ratio": "split_ratio"}),
    (["symbol", "dt", "open", "close"], {"dt": "date"}),
    (["day", "OPEN", "CLOSE"], {"day": "date", "OPEN": "open", "CLOSE": "close"}),
])
def test_vendor_conventions(header, expect):
    got = columns.resolve_columns(header)
    for src, dst in expect.items():
        assert got[src] == dst


def test_pandas_index_column_is_ignored_and_first_alias_wins():
    got = columns.resolve_columns(["Unnamed: 0", "ts_code", "code", "date", "close"])
    assert "Unnamed: 0" not in got
    assert got["ts_code"] == "symbol" and "code" not in got
    # a row number (czsc's minute files: symbol,id,dt,...) is no field; --map keeps it when asked
    assert "id" not in columns.resolve_columns(["symbol", "id", "dt", "close"])
    assert columns.resolve_columns(["symbol", "id", "dt", "close"], {"id": "id"})["id"] == "id"


def test_user_map_wins_over_an_earlier_column_of_that_field():
    """--map 'Adj Close=close' once lost to the 'Close' column before it: close kept the unadjusted price."""
    got = columns.resolve_columns(["Date", "Close", "Adj Close"], {"Adj Close": "close"})
    assert got == {"Date": "date", "Adj Close": "close"}
    with pytest.raises(InputError, match="columns 'a' and 'b' both map to 'close'"):
        columns.resolve_columns(["date", "a", "b"], {"a": "close", "b": "close"})


def test_user_map_wins_over_aliases():
    got = columns.resolve_columns(["Trade Day", "px", "close"], {"Trade Day": "date", "px": "close", "close": "prev"})
    assert got == {"Trade Day": "date", "px": "close", "close": "prev"}


def test_parse_mapping():
    assert columns.parse_mapping(["Trade Day=date", "Px=Close"]) == {"Trade Day": "date", "Px": "close"}
    with pytest.raises(InputError, match="SOURCE=FIELD"):
        columns.parse_mapping(["nonsense"])


def test_missing_message_lists_found_and_accepted():
    msg = columns.describe_missing("close", ["a", "b"], "f.csv")
    assert "f.csv" in msg and "a, b" in msg and "收盘" in msg and "--map" in msg
