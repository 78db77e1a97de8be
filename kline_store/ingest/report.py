"""What an ingest or append did: the summary the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .validate import Problem


def _unit(freq: str) -> str:
    """What a store's calendar entries are, for the summary: dates, weekly bar dates, 5min bar times."""
    return {"1d": "dates", "1w": "weekly bar dates", "1mo": "monthly bar dates"}.get(freq, f"{freq} bar times")


@dataclass
class IngestReport:
    """Counts, the problems found and, for an append, what it changed (``extra``)."""

    store: Path
    version: int
    n_files: int
    n_bars: int
    n_symbols: int
    n_dates: int
    start: str | None
    end: str | None
    fields: list[str]
    problems: list[Problem]
    skipped_empty: int
    dropped_columns: dict[str, list[str]]
    seconds: float
    extra: dict = field(default_factory=dict)
    freq: str = "1d"
    skipped_files: list[tuple[str, str]] = field(default_factory=list)   # --skip-bad: (file, why)
    notes: list[str] = field(default_factory=list)   # e.g. dates only a few symbols trade (calnote.py)

    def lines(self) -> list[str]:
        what = "read" if self.extra else "stored"   # an append reports the input it read, then the store
        out = [f"store {self.store} (version {self.version}): {what} {self.n_bars} bars from {self.n_files} file(s) "
               f"in {self.seconds:.2f}s; {self.n_symbols} symbol{'' if self.n_symbols == 1 else 's'}, {self.n_dates} "
               f"{_unit(self.freq)} {self.start}..{self.end}, "
               f"fields {' '.join(self.fields)}"]
        for k, v in self.extra.items():
            out.append(f"{k}: {v}")
        if self.skipped_empty:
            out.append(f"skipped {self.skipped_empty} row(s) whose prices are all missing (no bar)")
        for f, cols in list(self.dropped_columns.items())[:3]:
            out.append(f"ignored column(s) {', '.join(cols[:8])}{' ...' if len(cols) > 8 else ''} in {f} "
                       f"(text, another type, or a second column for a field)")
        out.extend(("note " + n) for n in self.notes)
        if self.skipped_files:
            out.append(f"skipped {len(self.skipped_files)} file(s) that are not bars (--skip-bad):")
            out.extend(f"  {f}: {why}" for f, why in self.skipped_files[:20])
            if len(self.skipped_files) > 20:
                out.append(f"  ... and {len(self.skipped_files) - 20} more")
        out.extend(("warning " + p.line()) for p in self.problems)
        if not self.problems:
            out.append("problems: none")
        return out
