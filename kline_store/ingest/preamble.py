"""The lines before a CSV's header, and headerless files: what is skipped, and what the columns are called.

Vendors put a line above the header (a crypto data vendor's ``Timestamps are UTC timezone,https://...``, a
charting library's ``# Data source: ...``): a first line that names no date and close column, followed within
a few lines by one that does, is skipped and reported; ``--skip-rows N`` skips exactly N lines. A headerless
file (``--no-header --columns date,open,...``) gets its column names from the user.

Only such a file changes how it is read: its text, less the skipped lines (with the given header in front for
a headerless file), is held in memory and parsed by the same polars read as any CSV (as compressed and GBK files
already are); its line numbers in messages stay the file's own (inputs.shift_lines).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .columns import resolve_columns
from ..errors import InputError

LOOK_AHEAD = 6          # a header this many lines down at most is found without --skip-rows
SNIFF_BYTES = 1 << 16   # the first bytes looked at for it


@dataclass
class Preamble:
    """How a CSV's text begins: lines skipped before the header, and a header given by the user."""

    skip: int = 0                              # lines before the header (or before the first data line)
    header: list[str] | None = None            # --columns of a headerless file
    skipped: list[str] = field(default_factory=list)   # the skipped lines, for the report

    @property
    def changes(self) -> bool:
        return bool(self.skip) or self.header is not None

    @property
    def shift(self) -> int:
        """Real line of data row r, less (r + 2): the lines skipped, one fewer without a header line."""
        return self.skip - (1 if self.header is not None else 0)

    def note(self, path: Path) -> str | None:
        if not self.skipped:
            return None
        first = self.skipped[0].strip()
        shown = first if len(first) <= 60 else first[:57] + "..."
        more = f" and {len(self.skipped) - 1} more line(s)" if len(self.skipped) > 1 else ""
        return f"{path}: skipped line 1 {shown!r}{more} before the header (not a header)"


def sniff_separator(line: str) -> str:
    """The separator of a header (or data) line: the most frequent of , tab ; | (comma when none)."""
    counts = {sep: line.count(sep) for sep in (",", "\t", ";", "|")}
    return max(counts, key=counts.get) if max(counts.values()) else ","


def header_names(line: str, sep: str) -> list[str]:
    """Column names exactly as polars will name them (quotes removed, spaces kept)."""
    try:
        return pl.read_csv(io.BytesIO(line.encode() + b"\n"), separator=sep, n_rows=0,
                           infer_schema_length=0).columns
    except pl.exceptions.PolarsError:
        return [c.strip('"') for c in line.split(sep)]


def _is_header(line: str, user_map: dict[str, str] | None) -> bool:
    """The line names a date and a close column (a plain split first: polars' header parse only when needed)."""
    sep = sniff_separator(line)
    for names in ([c.strip().strip('"') for c in line.split(sep)], None):
        found = set(resolve_columns(names if names is not None else header_names(line, sep), user_map).values())
        if "date" in found and "close" in found:
            return True
    return False


def find(path: Path, lines: list[str], user_map: dict[str, str] | None, skip_rows: int | None, no_header: bool,
         columns: tuple[str, ...]) -> Preamble:
    """The preamble of a CSV from its first lines (decoded): what to skip, and the header of a headerless file."""
    if columns and not no_header:
        raise InputError(f"{path}: --columns names the columns of a headerless file (with --no-header); a file "
                         f"with a header takes --map SRC=FIELD")
    if no_header and not columns:
        raise InputError(f"{path}: --no-header needs --columns naming every column, e.g. --columns "
                         f"date,open,high,low,close,volume")
    if skip_rows is not None and skip_rows < 0:
        raise InputError(f"--skip-rows {skip_rows}: a number of lines, 0 or more")
    if skip_rows is not None:
        skip = skip_rows
    elif no_header:   # comment lines only: any other line is data
        skip = next((i for i, s in enumerate(lines) if not s.lstrip().startswith("#")), len(lines))
    else:
        skip = 0
        if lines and not _is_header(lines[0], user_map):
            skip = next((i for i in range(1, min(LOOK_AHEAD, len(lines))) if _is_header(lines[i], user_map)), 0)
    if skip >= len(lines) and lines:
        raise InputError(f"{path}: --skip-rows {skip} leaves no line to read (the file's first "
                         f"{SNIFF_BYTES >> 10} KiB hold {len(lines)})")
    return Preamble(skip, list(columns) if no_header else None, [s for s in lines[:skip]])


def first_lines(data: bytes) -> list[str]:
    """The first lines of the text (its BOM left out), for :func:`find`; a last cut line is left out."""
    head = data[:SNIFF_BYTES]
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.splitlines()
    if len(head) == SNIFF_BYTES and not text.endswith("\n") and len(lines) > 1:
        lines = lines[:-1]
    return lines


def rewrite(data: bytes, pre: Preamble, sep: str) -> bytes:
    """The text as polars reads it: the skipped lines left out, the given header in front (one copy)."""
    body = data[3:] if data[:3] == b"\xef\xbb\xbf" else data
    cut = 0
    for _ in range(pre.skip):
        nl = body.find(b"\n", cut)
        if nl < 0:
            cut = len(body)
            break
        cut = nl + 1
    head = (sep.join(pre.header) + "\n").encode() if pre.header is not None else b""
    return head + body[cut:]
