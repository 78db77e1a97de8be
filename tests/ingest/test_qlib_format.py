"""The Qlib provider format on its own (no Qlib needed): layout, spans, NaN, case, and one-line errors.

Directories here are written byte by byte with numpy, as the format says, independently of the writer under
test; tests/test_qlib_store.py checks both directions against Qlib itself.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import kline_store as ks
from conftest import run_cli, write
from kline_store.ingest import qlib_format
from kline_store.errors import InputError
from kline_store.ingest.exporter import export
from kline_store.ingest.ingestion import ingest

DAYS = ["2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-08"]


def provider(root: Path, bins: dict[str, dict[str, tuple[int, list[float]]]], days=DAYS,
             listed: list[str] | None = None) -> Path:
    """A provider directory: bins[symbol][field] = (start index, values); all.txt lists ``listed``."""
    write(root / "calendars" / "day.txt", "".join(f"{d}\n" for d in days))
    lines = []
    for sym, fields in bins.items():
        folder = root / "features" / sym.lower()
        folder.mkdir(parents=True)
        for f, (start, values) in fields.items():
            np.asarray([start, *values], dtype="<f4").tofile(folder / f"{f}.day.bin")
        start = min(s for s, _ in fields.values())
        end = max(s + len(v) - 1 for s, v in fields.values())
        lines.append(f"{sym}\t{days[start]}\t{days[end]}\n")
    for sym in listed or []:
        lines.append(f"{sym}\t{days[0]}\t{days[-1]}\n")
    write(root / "instruments" / "all.txt", "".join(lines))
    return root


@pytest.fixture
def small(tmp_path) -> Path:
    nan = float("nan")
    return provider(tmp_path / "qlib", {
        "SH600000": {"close": (0, [10.5, nan, 10.75, 11.0, 11.25]), "volume": (0, [100, 0, 120, 130, 140])},
        "SZ000001": {"close": (2, [5.5, 5.25]), "volume": (2, [7, 8]), "factor": (2, [1.0, 1.5])},
    })


def test_values_spans_and_case(small, tmp_path):
    rep = ingest([small], tmp_path / "st")
    st = ks.open_store(tmp_path / "st")
    assert st.symbols == ["SH600000", "SZ000001"]            # as all.txt spells them; folders are lower case
    assert st.fields == ["close", "volume", "factor"]        # Qlib's factor stays itself (no factor policy)
    assert [str(d) for d in st.dates] == DAYS
    close = st.array("close")
    np.testing.assert_array_equal(close[0], np.float32([10.5, np.nan, 10.75, 11.0, 11.25]))
    np.testing.assert_array_equal(close[1], np.float32([np.nan, np.nan, 5.5, 5.25, np.nan]))
    np.testing.assert_array_equal(st.array("factor")[1, 2:4], np.float32([1.0, 1.5]))
    assert st.first_bar.tolist() == [0, 2] and st.last_bar.tolist() == [4, 3]
    assert rep.n_bars == 7 and rep.n_files == 5                # day 1 of SH600000 has a volume: a bar


def test_export_writes_the_format(small, tmp_path):
    ingest([small], tmp_path / "st")
    assert export(tmp_path / "st", tmp_path / "back", fmt="qlib") == 2
    back = tmp_path / "back"
    assert (back / "calendars" / "day.txt").read_text() == "".join(f"{d}\n" for d in DAYS)
    assert (back / "instruments" / "all.txt").read_text() == ("SH600000\t2024-01-02\t2024-01-08\n"
                                                              "SZ000001\t2024-01-04\t2024-01-05\n")
    raw = np.fromfile(back / "features" / "sz000001" / "close.day.bin", "<f4")
    np.testing.assert_array_equal(raw, np.float32([2, 5.5, 5.25]))   # start index, then the span only
    for f in ("close", "volume", "factor"):                            # SZ000001 lacks nothing Qlib had
        assert (back / "features" / "sz000001" / f"{f}.day.bin").read_bytes() == \
               (small / "features" / "sz000001" / f"{f}.day.bin").read_bytes()
    raw = np.fromfile(back / "features" / "sh600000" / "factor.day.bin", "<f4")
    assert raw[0] == 0 and np.isnan(raw[1:]).all() and len(raw) == 6  # a field it never had: NaN in its span


def test_instruments_select_symbols(small, tmp_path):
    write(small / "instruments" / "mine.txt", "SZ000001\t2024-01-04\t2024-01-05\n")
    ingest([small], tmp_path / "a", instruments="mine")
    assert ks.open_store(tmp_path / "a").symbols == ["SZ000001"]
    own = write(tmp_path / "list.txt", "sh600000\t2024-01-02\t2024-01-08\n")   # any case: folders are lower
    ingest([small], tmp_path / "b", instruments=str(own))
    assert ks.open_store(tmp_path / "b").symbols == ["sh600000"]
    with pytest.raises(InputError, match="--instruments 'csi300': no .*markets in .*: all, mine"):
        ingest([small], tmp_path / "c", instruments="csi300")


def test_listed_without_features_is_reported(tmp_path):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}}, listed=["BBB", "CCC"])
    rep = ingest([root], tmp_path / "st")
    assert ks.open_store(tmp_path / "st").symbols == ["AAA"]
    assert any("no_features: 2 instrument(s) listed in all.txt without a features folder, left out "
               "(first: BBB; CCC)" in line for line in rep.lines())


@pytest.mark.parametrize("damage,message", [
    (lambda r: (r / "features" / "aaa" / "close.day.bin").write_bytes(b"\0\0\0\0\0\0"),
     "aaa/close.day.bin: 6 bytes is not a whole number of float32 values"),
    (lambda r: np.float32([3, 1, 2, 3]).tofile(r / "features" / "aaa" / "close.day.bin"),
     "aaa/close.day.bin: 3 values from calendar index 3 run past the calendar's 5 days"),
    (lambda r: np.float32([1.5, 1]).tofile(r / "features" / "aaa" / "close.day.bin"),
     "aaa/close.day.bin: start index 1.5 is not a calendar index"),
    (lambda r: (r / "features" / "aaa" / "close.day.bin").write_bytes(b""),
     "aaa/close.day.bin: empty file"),
    (lambda r: [(r / "features" / "aaa" / "close.day.bin").unlink(),
                (r / "features" / "aaa" / "close.day.bin").mkdir()],
     "aaa/close.day.bin: not a file"),
    (lambda r: write(r / "calendars" / "day.txt", "2024-01-02\n2024-01-02\n"),
     "day.txt: line 2: 2024-01-02 does not come after 2024-01-02"),
    (lambda r: write(r / "calendars" / "day.txt", "2024-01-02\n2024-13-02\n"),
     "day.txt: line 2: '2024-13-02' is not a date"),
    (lambda r: write(r / "calendars" / "day.txt", "2024-01-02 09:31:00\n"),
     "day.txt: line 1: '2024-01-02 09:31:00' has a time of day; only day bars are read"),
    (lambda r: write(r / "instruments" / "all.txt", "AAA 2024-01-02 2024-01-08\n"),
     "all.txt: line 1: expected SYMBOL<TAB>first<TAB>last"),
    (lambda r: (r / "calendars" / "day.txt").rename(r / "calendars" / "1min.txt"),
     "without calendars/day.txt (found: 1min.txt); only day bars are read"),
])
def test_damage_is_one_line_naming_the_file(tmp_path, damage, message):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}})
    damage(root)
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "st"))
    assert r.returncode == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "st").exists()      # a failed first ingest leaves nothing behind


def test_options_that_do_not_apply(small, tmp_path):
    csv = write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n")
    for args, message in [
        ([str(csv), "--instruments", "all"], "--instruments applies to a Qlib provider directory"),
        ([str(small), str(csv)], "a Qlib provider directory is ingested alone (2 inputs given)"),
        ([str(small), "--calendar", str(csv)], "its calendar is calendars/day.txt"),
        ([str(small), "--map", "px=close"], "--map: "),
        ([str(small), "--freq", "5min"], "holds day bars; --freq/--sessions/--stamp do not apply"),
        ([str(small), "--sessions", "ashare"], "holds day bars; --freq/--sessions/--stamp do not apply"),
    ]:
        r = run_cli("ingest", *args, "-o", str(tmp_path / "st"))
        assert r.returncode == 1 and message in r.stderr, r.stderr
    r = run_cli("ingest", str(small.parent), "-o", str(tmp_path / "st"))   # the folder that holds one
    assert r.returncode == 1 and f"holds the Qlib provider directory {small}: ingest it alone" in r.stderr
    ks.ingest([csv], tmp_path / "st")
    r = run_cli("append", str(tmp_path / "st"), str(small))
    assert r.returncode == 1 and "a Qlib provider directory is read by `kline-store ingest" in r.stderr


def test_names_qlib_cannot_hold(tmp_path):
    with pytest.raises(InputError, match="'ab' and 'AB' differ only in case"):
        qlib_format.check_names(["ab", "AB"], ["close"])
    with pytest.raises(InputError, match="symbol 'a/b' cannot be a Qlib instrument"):
        qlib_format.check_names(["a/b"], ["close"])
    with pytest.raises(InputError, match="field 'px.last' cannot be a Qlib feature"):
        qlib_format.check_names(["a"], ["px.last"])
    assert qlib_format.folder_name("CON") == "_qlib_con" and qlib_format.folder_name("SH600000") == "sh600000"


def test_export_needs_a_new_directory(small, tmp_path):
    ingest([small], tmp_path / "st")
    write(tmp_path / "full" / "x.txt", "x")
    r = run_cli("export", str(tmp_path / "st"), "--format", "qlib", "-o", str(tmp_path / "full"))
    assert r.returncode == 1 and "exists and is not an empty folder" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run_cli("export", str(tmp_path / "st"), "--format", "qlib", "-o", str(tmp_path / "empty"))
    assert r.returncode == 0 and "wrote 2 symbols" in r.stdout, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no temporary left


# --- every file of a provider directory is untrusted (issue 19) ----------------------------------------------

@pytest.mark.parametrize("name", ["../../evil", "/abs/path", "..", "a\\..\\b"])
def test_instrument_names_that_leave_features_are_refused(tmp_path, name):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}})
    outside = tmp_path / "evil" / "close.day.bin"      # what ../../evil would read from q/features/
    outside.parent.mkdir()
    np.float32([0, 9, 9, 9, 9, 9]).tofile(outside)
    write(root / "instruments" / "all.txt", f"AAA\t{DAYS[0]}\t{DAYS[-1]}\n{name}\t{DAYS[0]}\t{DAYS[-1]}\n")
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "st"))
    assert r.returncode == 1 and "all.txt: line 2: instrument" in r.stderr and "not a plain name" in r.stderr
    assert not (tmp_path / "st").exists()


def test_a_sparse_6_gib_bin_is_refused_from_its_size_within_seconds(tmp_path):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}})
    with open(root / "features" / "aaa" / "close.day.bin", "r+b") as fh:
        fh.truncate(6 << 30)                      # sparse: no disk used, 6 GiB to a reader
    t0 = time.perf_counter()
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "st"))
    assert time.perf_counter() - t0 < 20
    assert r.returncode == 1 and "more than the calendar's 5 days" in r.stderr, r.stderr
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("calendar,message", [
    ("1500-01-02\n2024-01-03\n2024-01-04\n2024-01-05\n2024-01-08\n",
     "day.txt: line 1: 1500-01-02 is outside 1800-01-01..2200-12-31"),
    ("2024-01-02\n" * 500_000, "more than a Qlib list of days"),
])
def test_a_bad_calendar_is_refused_before_anything_is_written(tmp_path, calendar, message):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}})
    write(root / "calendars" / "day.txt", calendar)
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "st"))
    assert r.returncode == 1 and message in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "st").exists()


def test_a_calendar_fifo_or_link_is_not_a_calendar(tmp_path):
    root = provider(tmp_path / "q", {"AAA": {"close": (0, [1, 2, 3, 4, 5])}})
    (root / "calendars" / "day.txt").unlink()
    os.mkfifo(root / "calendars" / "day.txt")
    r = run_cli("ingest", str(root), "-o", str(tmp_path / "st"), timeout=30)
    assert r.returncode == 1 and "day.txt: not a regular file" in r.stderr, r.stderr


def test_names_a_provider_cannot_hold_are_said_plainly():
    with pytest.raises(InputError, match="'CON' and '_qlib_CON' name the same folder"):
        qlib_format.check_names(["CON", "_qlib_CON"], ["close"])
    with pytest.raises(InputError, match=r"symbol 'XXXXXXXX.*\(300 characters\) .*longer than a file system allows"):
        qlib_format.check_names(["X" * 300], ["close"])


def test_a_killed_exports_temporary_folder_is_removed_by_the_next(small, tmp_path):
    ingest([small], tmp_path / "st")
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".out.tmp-{dead.pid}"
    (left / "features").mkdir(parents=True)
    assert run_cli("export", str(tmp_path / "st"), "--format", "qlib", "-o", str(tmp_path / "out")).returncode == 0
    assert not left.exists()
