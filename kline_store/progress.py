"""A minimal progress bar on stderr: only on a terminal, never with --quiet, never in logs."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total, self.label, self.done = max(total, 1), label, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def step(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and self.done < self.total):
            return
        self._last = now
        width = 30
        fill = int(width * self.done / self.total)
        count = (f"{self.done / 2**20:,.0f}/{self.total / 2**20:,.0f} MiB" if self.total >= 1 << 20
                 else f"{self.done}/{self.total}")
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {count} {note[:40]:<40}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()
