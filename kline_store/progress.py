"""Progress of long phases on stderr, drawn by tqdm: a bar on a terminal, a plain line every few seconds in a log.

Every phase that can pass a second reports here (reading and checking the inputs, writing a generation and its
checksums, verifying, bench, tune). A phase over within a second shows nothing on a terminal; in a log (stderr
not a terminal) a phase prints a line every ``LOG_EVERY`` seconds once it has run that long, and its final
count when it ends. :func:`silenced` turns all of it off: the CLI's ``-q`` and the library's ``quiet=True``.
Nothing here imports the rest of the package: any module may report progress.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterable, Iterator, TextIO, TypeVar

DELAY = 1.0    # seconds before a bar appears on a terminal


def _log_every(default: float = 5.0) -> float:
    """Seconds between lines in a log: KLINE_STORE_PROGRESS_EVERY, or the default when it is not a positive
    number (a typo in an environment variable must not stop every command)."""
    try:
        value = float(os.environ.get("KLINE_STORE_PROGRESS_EVERY", default))
    except ValueError:
        return default
    return value if value > 0 else default


LOG_EVERY = _log_every()
LOG_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed} elapsed, {remaining} left]{postfix}"
LOG_FORMAT_OPEN = "{desc}: {n_fmt} {unit} [{elapsed} elapsed]{postfix}"   # total unknown

T = TypeVar("T")
_silenced = 0


@contextlib.contextmanager
def silenced(yes: bool = True) -> Iterator[None]:
    """No progress at all inside the block (when ``yes``); blocks nest."""
    global _silenced
    _silenced += int(yes)
    try:
        yield
    finally:
        _silenced -= int(yes)


_BAR: Any = None


def _bar_class() -> Any:
    """tqdm, imported when a phase first shows (a quiet run does without its import)."""
    global _BAR
    if _BAR is None:
        from tqdm import tqdm

        class _Bar(tqdm):
            monitor_interval = 0   # no monitor thread: a bar is refreshed by its own updates only

        _BAR = _Bar
    return _BAR


class _Lines:
    """A log as tqdm's output: each refresh becomes one plain line (no carriage return, no padding)."""

    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self.last = ""

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text and text != self.last:     # a phase's last update and its close can show the same count
            self.last = text
            self.fh.write(text + "\n")

    def flush(self) -> None:
        self.fh.flush()


class Progress:
    """One phase's progress on stderr.

    Args:
        total: units of work in the phase (None: unknown, a count is shown).
        label: what the phase does ("reading", "writing", ...).
        enabled: None follows :func:`silenced`; False never shows anything.
        unit: name of a unit ("B" with ``scale`` shows bytes as K, M, G).
        scale: scale the counts (1024-based).
    """

    def __init__(self, total: int | None, label: str, enabled: bool | None = None, unit: str = "",
                 scale: bool = False) -> None:
        on = not _silenced if enabled is None else enabled
        err = sys.stderr
        self._bar: Any = None
        self._lines = None
        self._note = ""
        if not on or err is None:
            return                         # nothing to show: no bar at all
        tty = err.isatty()
        self._lines = None if tty else _Lines(err)
        style = ({"file": err, "delay": DELAY, "mininterval": 0.2, "leave": False, "dynamic_ncols": True} if tty
                 else {"file": self._lines, "delay": LOG_EVERY, "mininterval": LOG_EVERY, "leave": True,
                       "bar_format": LOG_FORMAT if total else LOG_FORMAT_OPEN})
        self._bar = _bar_class()(total=total or None, desc=label, unit=unit or "it", unit_scale=scale,
                                 unit_divisor=1024, miniters=0, **style)

    def step(self, n: int = 1, note: str = "") -> None:
        """``n`` more units done; ``note`` (the file being read, ...) shown after the count."""
        if self._bar is None:
            return
        if note and note != self._note:
            self._note = note
            self._bar.set_postfix_str(note[:60], refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        bar, lines = self._bar, self._lines
        if bar is None:
            return
        if lines is not None and not lines.last and bar.format_dict["elapsed"] >= LOG_EVERY:
            bar.refresh()     # a phase that ran long in one step still leaves its line in the log
        bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def say(text: str, err: bool = True) -> None:
    """Print a line (stderr, or stdout with ``err=False``) without tearing a bar that is on the terminal."""
    _bar_class().write(text, file=sys.stderr if err else sys.stdout)


def track(items: Iterable[T], label: str, total: int | None = None, unit: str = "") -> Iterator[T]:
    """``items`` one by one, counted as a phase (``total`` defaults to ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, label, unit=unit) as bar:
        for item in items:
            yield item
            bar.step()
