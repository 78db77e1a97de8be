"""Byte-level checks: the encoding over the whole file, and the field count of every line."""

import csv
import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import write
from kline_store.ingest import textscan
from kline_store.errors import InputError


def check(text: str, n_fields: int, sep: str = ",") -> int:
    """check_lines (counts first, exact on a mismatch), as readers call it before polars parses the file."""
    return textscan.check_lines(text.encode(), sep, n_fields, "f.csv")


def exact(text: str, n_fields: int, sep: str = ",") -> int:
    return textscan.exact_lines(np.frombuffer(text.encode(), np.uint8), sep, n_fields, "f.csv")


def test_good_files_count_their_lines():
    assert check("a,b,c\n1,2,3\n4,5,6\n", 3) == 3
    assert check("a,b,c\n1,2,3\n4,5,6", 3) == 3                  # no line end at the end
    assert check("a,b,c\r\n1,2,3\r\n", 3) == 2
    assert check("a,b,c\n1,2,3\n\n\n", 3) == 4                   # trailing blank lines: allowed
    assert check("a,b,c\n1,,\n,,\n", 3) == 3                      # empty cells are cells
    assert check("a;b\n1;2\n", 2, sep=";") == 2


@pytest.mark.parametrize("text,line,got", [
    ("Date,Open,High,Low,Close,Adj Close,Volume\n2017-09-05,100.5,102.25,99.75,101.0,101.0,1000\n"
     "2017-09-06,101.5\n", 3, 2),                                 # case 1: a cut line
    ("a,b,c\n1,2,3\n1,2\n4,5,6,7\n", 3, 2),                       # a short and a long line cancel in the totals
    ("a,b,c\n1,2,3,4\n1,2\n", 2, 4),
    ("a,b,c\n1,2,3\n\n1,2\n", 4, 2),                              # after a blank line
    ("a,b,c\n1,2,3\n   \n", 3, 1),                                # whitespace is not a blank line
    ('a,b,c\n"1,5",2\n', 2, 2),                                   # a quoted separator is no separator
    ("a,b,c\n1,2,3\n1,2", 3, 2),                                  # a last line cut mid-number, no line end
])
def test_wrong_field_counts_are_named(text, line, got):
    k = text.split("\n")[0].count(",") + 1
    with pytest.raises(InputError, match=rf"f\.csv: line {line}: {got} fields?, the header has {k}"):
        exact(text, k)
    try:
        check(text, k)
    except InputError as exc:
        assert f"line {line}:" in str(exc)
    else:   # the counts balance only when a line has more fields, which polars' full parse rejects
        assert any(row.count(",") >= k for row in text.split("\n")[1:]), text


def test_quoted_separators_and_line_ends_are_inside_fields():
    assert check('a,b,c\n"x,y",2,3\n"multi\nline",5,6\n"say ""hi, there""",8,9\n', 3) == 4


def test_a_line_longer_than_a_block_and_pieces_from_a_line(monkeypatch):
    monkeypatch.setattr(textscan, "BLOCK", 16)
    long = "x" * 100
    assert textscan.exact_lines(np.frombuffer(f"a,b\n{long},1\n1,2\n".encode(), np.uint8), ",", 2, "f.csv") == 3
    with pytest.raises(InputError, match="line 7: 1 field,"):
        textscan.exact_lines(np.frombuffer(f"{long},1\n1\n".encode(), np.uint8), ",", 2, "f.csv", first_line=6)


def _csv_text(rows):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


cell = st.text(alphabet=st.sampled_from(list('ab1.,"\n ')), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda k: st.lists(st.lists(cell, min_size=max(k - 1, 1), max_size=k + 1),
                                                        min_size=1, max_size=8).map(lambda rows: (k, rows))))
def test_agrees_with_the_csv_module(case):
    """Reference: Python's csv module reading what csv.writer wrote (quotes where needed)."""
    k, rows = case
    header = [f"c{i}" for i in range(k)]
    text = _csv_text([header] + rows)
    records = list(csv.reader(io.StringIO(text)))
    bad = next((i for i, r in enumerate(records) if r and len(r) != k), None)
    lines = text.count("\n") - sum(c.count("\n") for r in rows for c in r)
    if bad is None:
        assert exact(text, k) == lines and check(text, k) == lines
        return
    with pytest.raises(InputError, match=rf"line {bad + 1}: {len(records[bad])} field"):
        exact(text, k)
    try:
        check(text, k)
    except InputError as exc:
        assert f"line {bad + 1}: " in str(exc)
    else:
        assert max(len(r) for r in records) > k       # left to polars, which rejects a longer line


def test_encoding_over_the_whole_file(tmp_path):
    """Case 6: a GBK file whose first 64 KiB are ASCII was taken for UTF-8 and rejected."""
    ascii_rows = "".join(f"2020-01-{i % 28 + 1:02d},{i},abc\n" for i in range(5000))
    text = "date,close,name\n" + ascii_rows + "2021-01-04,1,平安银行\n"
    assert len(ascii_rows) > 1 << 16
    gbk = write(tmp_path / "gbk.csv", text, "gbk")
    enc, data = textscan.detect_encoding(gbk)
    assert enc == "gb18030" and data.decode("utf-8") == text
    assert textscan.detect_encoding(write(tmp_path / "u.csv", text)) == ("utf-8", None)
    assert textscan.detect_encoding(write(tmp_path / "a.csv", "date,close\n")) == ("utf-8", None)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert textscan.detect_encoding(bom) == ("utf-8-sig", None)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"date,close\n2020-01-02,1\n\xff\xfe\xff\n")
    with pytest.raises(InputError, match=r"bad\.csv: line 3: neither UTF-8 nor GBK/GB18030"):
        textscan.detect_encoding(bad)


def test_archives_and_compressed_files_are_named(tmp_path):
    """A zipped or gzipped CSV (vendors ship minute bars so) is named as such, not reported as bad text."""
    import gzip
    import zipfile
    text = "date,close\n2020-01-02,1\n"
    with zipfile.ZipFile(tmp_path / "bars.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bars.csv", text)
    (tmp_path / "bars.csv.gz").write_bytes(gzip.compress(text.encode()))
    for name, what in (("bars.zip", "a zip archive, not CSV text readable here; unzip it"),
                       ("bars.csv.gz", "gzip-compressed, not CSV text readable here; gunzip it")):
        with pytest.raises(InputError, match=f"{name}: {what}"):
            textscan.detect_encoding(tmp_path / name)
    (tmp_path / "u16.csv").write_bytes(text.encode("utf-16"))
    with pytest.raises(InputError, match=r"u16\.csv: UTF-16 text .*save it as UTF-8"):
        textscan.detect_encoding(tmp_path / "u16.csv")
