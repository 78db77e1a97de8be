"""Progress a user sees: plain lines in a log every few seconds, a bar on a terminal, nothing with -q."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from kline_store import progress

LINE = re.compile(r"^(reading|writing|checksums|exporting): +\d+% \S+/\S+ \w+ \[\d\d:\d\d elapsed, \S+ left\]")


def cli(*args: str, every: float, log) -> subprocess.CompletedProcess:
    """`kline-store ARGS` in a real process, stderr to a file (a log), progress lines every ``every`` s."""
    env = dict(os.environ, KLINE_STORE_PROGRESS_EVERY=str(every))
    return subprocess.run([sys.executable, "-m", "kline_store.cli", *args], stdout=subprocess.PIPE, stderr=log,
                          text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def many_files(real, tmp_path_factory):
    """The 154 A-share files under 3 names each: 462 files, 609k bars, an ingest of several seconds (copies:
    links to one file would be read once)."""
    src = sorted((real / "ashare_qfq_daily" / "data_20251009").glob("*.csv"))
    out = tmp_path_factory.mktemp("many")
    for k in range(3):
        for f in src:
            shutil.copyfile(f, out / f"{f.stem}_{k}.csv")
    return out


def test_a_multi_second_ingest_logs_plain_lines(many_files, tmp_path):
    log = tmp_path / "ingest.log"
    with open(log, "w") as fh:
        r = cli("ingest", str(many_files), "-o", str(tmp_path / "st"), every=0.25, log=fh)
    text = log.read_text()
    assert r.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text          # a log gets lines, not a redrawn bar
    lines = text.splitlines()
    reading = [ln for ln in lines if ln.startswith("reading:")]
    assert all(LINE.match(ln) for ln in lines), lines
    assert "from 462 file(s)" in r.stdout
    assert len(reading) >= 2, lines                          # a line every quarter second while reading
    percent = [int(ln.split("%")[0].split()[-1]) for ln in reading]
    assert percent == sorted(percent) and percent[-1] == 100
    assert re.search(r", \d{6}_\d\.csv(: [\d,]+ rows)?$", reading[0])   # the file being read


def test_quiet_silences_every_phase(real, tmp_path):
    files = str(real / "ashare_qfq_daily" / "data_20251009")
    for args, quiet in [(("ingest", files, "-o", str(tmp_path / "st")), False),
                        (("verify", str(tmp_path / "st")), False),
                        (("export", str(tmp_path / "st"), "--format", "qlib", "-o", str(tmp_path / "q1")), False),
                        (("ingest", files, "-o", str(tmp_path / "st2")), True),
                        (("verify", str(tmp_path / "st2")), True),
                        (("export", str(tmp_path / "st2"), "--format", "qlib", "-o", str(tmp_path / "q2")), True)]:
        log = tmp_path / "log"
        with open(log, "w") as fh:
            r = cli(*args, *(["-q"] if quiet else []), every=0.0001, log=fh)   # a line at every update
        assert r.returncode == 0, log.read_text()
        lines = log.read_text().splitlines()
        assert (lines == []) if quiet else (lines and all(LINE.match(ln) for ln in lines)), (args, lines)


def test_a_bar_on_a_terminal_and_gone_at_the_end():
    code = ("import time\nfrom kline_store.progress import Progress\n"
            "with Progress(20, 'reading', unit='files') as p:\n"
            "    for i in range(20):\n        time.sleep(0.1); p.step(note=f'f{i}.csv')\n"
            "with Progress(5, 'quick', unit='files') as p:\n    p.step(5)\n")
    out = _on_a_terminal([sys.executable, "-c", code])
    assert "\rreading:" in out and "|" in out and "f19.csv" in out   # redrawn in place after a second
    assert "quick" not in out                                         # a phase within a second shows nothing
    assert re.search(r"\r +\r$", out)                                 # the bar is cleared at the end


def _on_a_terminal(cmd: list[str]) -> str:
    import fcntl
    import struct
    import termios

    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, cwd=ROOT)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:      # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=60)
    os.close(parent)
    return out.decode("utf-8", "replace")


def test_log_lines_in_process(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY", 0.05)
    with progress.Progress(3 << 20, "reading", unit="B", scale=True) as bar:
        for i in range(3):
            time.sleep(0.06)
            bar.step(1 << 20, note=f"{i}.csv")
    for _ in progress.track(range(2), "checksums", unit="rows"):
        time.sleep(0.06)
    with progress.silenced():
        for _ in progress.track(range(2), "hidden", unit="rows"):
            time.sleep(0.06)
    with progress.Progress(None, "tune", unit="trials") as bar:       # total unknown: a count
        time.sleep(0.06)
        bar.step(note="workers")
    with progress.Progress(1, "one step", unit="rows") as bar:           # one long step still leaves its line
        time.sleep(0.06)
        bar.step()
    err = capsys.readouterr().err.splitlines()
    assert re.match(r"reading:  33% 1.00M/3.00M B \[\d\d:\d\d elapsed, .*\], 0.csv$", err[0])
    assert err[2].startswith("reading: 100% 3.00M/3.00M B") and len(set(err)) == len(err)   # no repeated line
    assert any(ln.startswith("checksums: 100% 2/2 rows") for ln in err)
    assert not any("hidden" in ln for ln in err)
    assert any(re.match(r"tune: 1 trials \[\d\d:\d\d elapsed\], workers$", ln) for ln in err)
    assert err[-1].startswith("one step: 100% 1/1 rows")


def test_say_keeps_lines_whole(capsys):
    progress.say("a row")
    progress.say("a table line", err=False)
    got = capsys.readouterr()
    assert got.err == "a row\n" and got.out == "a table line\n"


def test_a_bad_log_interval_falls_back_to_the_default(monkeypatch):
    """KLINE_STORE_PROGRESS_EVERY=abc once made every command (and the import) die with a traceback."""
    for value in ("abc", "-1", "0"):
        r = subprocess.run([sys.executable, "-m", "kline_store.cli", "--help"], capture_output=True, text=True,
                           env={**os.environ, "KLINE_STORE_PROGRESS_EVERY": value}, cwd=ROOT)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    monkeypatch.setenv("KLINE_STORE_PROGRESS_EVERY", "2.5")
    assert progress._log_every() == 2.5
    monkeypatch.setenv("KLINE_STORE_PROGRESS_EVERY", "abc")
    assert progress._log_every() == 5.0


def test_reading_moves_with_the_bytes_parsed(real, tmp_path, capsys, monkeypatch):
    """A CSV read in pieces reports its bytes piece by piece (not 0% until the file is done), the A-share minute
    file here cut into 64 KiB pieces as a big file is into 32 MiB ones; writing counts symbols."""
    from kline_store import ingest
    from kline_store.ingest import bars, readers

    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    monkeypatch.setattr(bars, "PIECES_FROM", 0)
    monkeypatch.setattr(bars, "PIECE_BYTES", 64 << 10)
    f = real / "intraday_ashare_1min" / "000001.XSHG_1MIN.csv"
    shares = []
    src = readers.inspect_source(f)
    assert sum(df.height for df in readers.iter_chunks(src, 64 << 10, done=shares.append, whole=0)) == 2640
    assert len(shares) >= 3 and shares == sorted(shares) and shares[-1] == 1.0 and shares[0] < 0.5
    ingest([f], tmp_path / "s", quiet=False)
    err = capsys.readouterr().err.splitlines()
    reading = [int(ln.split("%")[0].split()[-1]) for ln in err if ln.startswith("reading:")]
    assert len([p for p in reading if 0 < p < 100]) >= 2, err
    assert any(re.match(r"writing: +\d+% \d+/\d+ symbols", ln) for ln in err), err
