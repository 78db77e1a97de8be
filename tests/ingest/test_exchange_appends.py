"""Exchange calendars through daily operation (issue 24 part 4): a store ingested with --calendar CODE or
--sessions CODE takes the exchange's next sessions by a plain append; append --calendar CODE; at the real
bound of the installed exchange_calendars (XSHG holidays to 2026-12-31 in 4.13.2) one line with the ways out
and nothing stored, or --assume-weekdays marked in the manifest; a file starting on a holiday or before the
library's first day is one line naming file, line and date (issue 25 part 3)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import run_cli, write
from kline_store import append, ingest, open_store
from kline_store.errors import InputError

xc = pytest.importorskip("exchange_calendars")

from kline_store.ingest import exchanges  # noqa: E402


def _day(s: str) -> int:
    return int(np.datetime64(s, "D").astype(np.int64))


def _show(d: int) -> str:
    return str(np.datetime64(int(d), "D"))


def _sessions(code: str, start: str, end: str) -> list[str]:
    """The library's own sessions: what the store's calendar must be."""
    return [str(d.date()) for d in xc.get_calendar(code, start=start, end=end).sessions
            if start <= str(d.date()) <= end]


def _csv(path, days, first=1.0):
    return write(path, "date,close\n" + "".join(f"{d},{first + i}\n" for i, d in enumerate(days)))


def _digest(folder) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_xshg_bound_is_the_installed_librarys():
    lo, hi = exchanges.covered("XSHG")
    if xc.__version__ == "4.13.2":
        assert (_show(lo), _show(hi)) == ("1990-12-03", "2026-12-31")
    assert exchanges.covered("XNYS") == (None, None)     # holidays by rule: no bound


def test_xshg_store_takes_the_next_sessions_by_a_plain_append(tmp_path):
    # National Day 2026: the sessions after 2026-09-30 skip the holiday week, as the library says.
    days = _sessions("XSHG", "2026-09-21", "2026-10-16")
    cut = days.index("2026-09-30") + 1
    ingest([_csv(tmp_path / "a.csv", days[:cut])], tmp_path / "s", calendar="XSHG", symbol="A")
    rep = append(tmp_path / "s", [_csv(tmp_path / "b.csv", days[cut:], cut + 1)], symbol="A")
    ingest([_csv(tmp_path / "all.csv", days)], tmp_path / "full", calendar="XSHG", symbol="A")
    a, full = open_store(tmp_path / "s"), open_store(tmp_path / "full")
    assert [str(d) for d in a.dates] == days and "2026-10-05" not in days
    assert np.array_equal(a.dates, full.dates) and rep.extra["mode"] == "tail"
    np.testing.assert_array_equal(a.panel, full.panel)
    assert a.manifest["exchange"] == "XSHG" and a.manifest["calendar_source"] == "XSHG"
    before = _digest(tmp_path / "s")
    with pytest.raises(InputError, match=r"h\.csv line 3: A bar at 2026-10-17 is outside the store.s calendar \(XSHG sessions"):
        append(tmp_path / "s", [_csv(tmp_path / "h.csv", ["2026-10-19", "2026-10-17"])], symbol="A")   # a Saturday
    assert _digest(tmp_path / "s") == before


def test_at_the_xshg_bound_one_line_then_the_ways_out(tmp_path):
    _, hi = exchanges.covered("XSHG")
    last = _sessions("XSHG", _show(hi - 10), _show(hi))
    nxt = [_show(d) for d in exchanges.weekdays("XSHG", hi + 1, hi + 8)][:2]     # no holidays known for these yet
    store = tmp_path / "s"
    ingest([_csv(tmp_path / "a.csv", last[:-1])], store, calendar="XSHG", symbol="A")
    append(store, [_csv(tmp_path / "b.csv", last[-1:])], symbol="A")     # the bound itself: a plain append
    assert str(open_store(store).dates[-1]) == _show(hi)
    before = _digest(store)
    new = _csv(tmp_path / "c.csv", nxt[:1], 50)
    r = run_cli(*["append", str(store), str(new), "--symbol", "A"])
    assert r.returncode == 1 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and f"c.csv line 2: {nxt[0]} is after {_show(hi)}" in line
    assert f"exchange_calendars {xc.__version__}" in line and "upgrade" in line
    assert "--calendar FILE" in line and "--assume-weekdays" in line and "nothing stored" in line
    assert _digest(store) == before
    # Way out: a calendar file listing the new dates; the store keeps following XSHG afterwards.
    cal = write(tmp_path / "cal.csv", "date\n" + nxt[0] + "\n")
    append(store, [new], symbol="A", calendar=str(cal))
    assert str(open_store(store).dates[-1]) == nxt[0] and open_store(store).manifest["exchange"] == "XSHG"
    before = _digest(store)
    with pytest.raises(InputError, match="the last day whose XSHG holidays"):
        append(store, [_csv(tmp_path / "d.csv", nxt[1:], 60)], symbol="A")
    assert _digest(store) == before
    # Way out: --assume-weekdays, marked in the manifest and kept by the next appends.
    r = run_cli(*["append", str(store), str(tmp_path / "d.csv"), "--symbol", "A", "--assume-weekdays", "-q"])
    assert r.returncode == 0, r.stderr
    m = json.loads((store / "manifest.json").read_text())
    assert m["assumed_weekdays"]["after"] == _show(hi) and m["assumed_weekdays"]["through"] == nxt[1]
    assert f"calendar XSHG (exchange_calendars), weekdays assumed {_show(hi)} < date <= {nxt[1]}" in \
        run_cli("info", str(store)).stdout
    third = _show(exchanges.weekdays("XSHG", _day(nxt[1]) + 1, _day(nxt[1]) + 7)[0])
    append(store, [_csv(tmp_path / "e.csv", [third], 70)], symbol="A")
    st = open_store(store)
    assert str(st.dates[-1]) == third and st.manifest["assumed_weekdays"]["through"] == third
    assert st.array("close")[0][-1] == 70


def test_xnys_store_takes_the_next_year_and_knows_its_holidays(tmp_path):
    days = _sessions("XNYS", "2026-12-21", "2027-01-08")
    assert "2026-12-25" not in days and "2027-01-01" not in days and "2027-01-04" in days
    cut = days.index("2026-12-30") + 1
    ingest([_csv(tmp_path / "a.csv", days[:cut])], tmp_path / "s", calendar="XNYS", symbol="SPY")
    append(tmp_path / "s", [_csv(tmp_path / "b.csv", days[cut:], cut + 1)], symbol="SPY")
    ingest([_csv(tmp_path / "all.csv", days)], tmp_path / "full", calendar="XNYS", symbol="SPY")
    a, full = open_store(tmp_path / "s"), open_store(tmp_path / "full")
    assert [str(d) for d in a.dates] == days
    np.testing.assert_array_equal(a.panel, full.panel)
    before = _digest(tmp_path / "s")
    r = run_cli(*["append", str(tmp_path / "s"), str(_csv(tmp_path / "h.csv", ["2027-01-18"])), "--symbol", "SPY"])
    assert r.returncode == 1 and "h.csv line 2" in r.stderr and "2027-01-18" in r.stderr   # MLK day
    assert _digest(tmp_path / "s") == before


def test_append_calendar_code_on_a_union_store(tmp_path):
    ingest([_csv(tmp_path / "a.csv", ["2027-01-05", "2027-01-06"])], tmp_path / "s", symbol="SPY")
    r = run_cli(*["append", str(tmp_path / "s"), str(_csv(tmp_path / "b.csv", ["2027-01-12"])), "--symbol", "SPY",
                 "--calendar", "XNYS", "-q"])
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "s")
    assert [str(d) for d in st.dates] == _sessions("XNYS", "2027-01-05", "2027-01-12")
    assert st.manifest["exchange"] == "XNYS"
    append(tmp_path / "s", [_csv(tmp_path / "c.csv", ["2027-01-14"])], symbol="SPY")    # follows XNYS now
    assert [str(d) for d in open_store(tmp_path / "s").dates][-2:] == ["2027-01-13", "2027-01-14"]
    with pytest.raises(InputError, match="the store follows the XNYS calendar"):
        append(tmp_path / "s", [tmp_path / "c.csv"], symbol="SPY", calendar="XSHG")


def _minutes(day: str, intervals) -> list[str]:
    out = []
    for a, b in intervals:
        for m in range(a + 1, b + 1):
            out.append(f"{day} {m // 60:02d}:{m % 60:02d}")
    return out


XSHG_DAY = ((570, 690), (780, 900))    # 09:30-11:30, 13:00-15:00, end-stamped minutes


def test_sessions_store_at_the_xshg_bound(tmp_path):
    _, hi = exchanges.covered("XSHG")
    last = _sessions("XSHG", _show(hi - 10), _show(hi))[-1]
    nxt = _show(exchanges.weekdays("XSHG", hi + 1, hi + 8)[0])
    a = write(tmp_path / "a.csv", "datetime,close\n" + "".join(f"{t},1\n" for t in _minutes(last, XSHG_DAY)))
    b = write(tmp_path / "b.csv", "datetime,close\n" + "".join(f"{t},2\n" for t in _minutes(nxt, XSHG_DAY)))
    ingest([a], tmp_path / "s", sessions="XSHG", symbol="A")
    before = _digest(tmp_path / "s")
    r = run_cli(*["append", str(tmp_path / "s"), str(b), "--symbol", "A"])
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f"is after {_show(hi)}" in r.stderr and "--assume-weekdays" in r.stderr
    assert "--calendar FILE" not in r.stderr and "usual sessions" in r.stderr     # no calendar file intraday
    assert _digest(tmp_path / "s") == before
    append(tmp_path / "s", [b], symbol="A", assume_weekdays=True)
    st = open_store(tmp_path / "s")
    days, counts = np.unique(st.dates.astype("datetime64[D]").astype(str), return_counts=True)
    assert dict(zip(days, counts)) == {last: 240, nxt: 240}
    assert st.manifest["assumed_weekdays"]["through"] == nxt


def test_a_file_on_a_holiday_or_before_the_library_is_one_line(tmp_path):
    hol = _csv(tmp_path / "hol.csv", ["2024-01-01", "2024-01-02"])       # New Year's Day: Euronext closed
    r = run_cli(*["ingest", str(hol), "-o", str(tmp_path / "x"), "--calendar", "XAMS", "--symbol", "A"])
    assert r.returncode == 1 and "Traceback" not in r.stderr and "DateOutOfBounds" not in r.stderr
    assert "hol.csv line 2" in r.stderr and "2024-01-01" in r.stderr and "XAMS" in r.stderr
    assert not (tmp_path / "x").exists()
    old = _csv(tmp_path / "old.csv", ["1985-01-02", "1985-01-03"])
    r = run_cli(*["ingest", str(old), "-o", str(tmp_path / "y"), "--calendar", "XSHG", "--symbol", "A"])
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "old.csv line 2: 1985-01-02 is before 1990-12-03" in r.stderr
    # A first day that is a holiday inside the file's span is fine when the bars skip it.
    ok = _csv(tmp_path / "ok.csv", ["2024-01-02", "2024-01-03"])
    ingest([ok], tmp_path / "z", calendar="XAMS", symbol="A")
    assert [str(d) for d in open_store(tmp_path / "z").dates] == ["2024-01-02", "2024-01-03"]


def test_assume_weekdays_needs_an_exchange(tmp_path):
    f = _csv(tmp_path / "a.csv", ["2027-01-05"])
    with pytest.raises(InputError, match="--assume-weekdays applies"):
        ingest([f], tmp_path / "s", symbol="A", assume_weekdays=True)
    ingest([f], tmp_path / "s", symbol="A")
    with pytest.raises(InputError, match="--assume-weekdays applies"):
        append(tmp_path / "s", [f], symbol="A", assume_weekdays=True)
