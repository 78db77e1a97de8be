"""The options of a read and of a store's time axis, as two objects built once by ``ingest()`` and ``append()``.

Every path an input takes (files, folders, a DataFrame written to a temporary file) receives these objects
whole, so an option cannot be dropped on one path by a hand-forwarded keyword list: adding an option means a
field here and a keyword of ``ingest``/``append`` (tests/ingest/test_options.py checks that every keyword of
both reaches the DataFrame path and that every field is a keyword). The CLI's shared option decorator
(cli/options.py, ``READ_FLAGS``) declares the command-line flags of the read options for both commands.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from . import columns


@dataclass(frozen=True)
class ReadOptions:
    """How input files (and DataFrames) are read: shared by ingest and append."""

    user_map: Mapping[str, str] = field(default_factory=dict)   # source column -> field (--map and user_map=)
    strict: bool = False                 # data-quality warnings become errors
    symbol_pattern: str | None = None    # the symbol in one-file-per-symbol names (its first group)
    symbol: str | None = None            # the symbol of a single input without a symbol column
    na: tuple[str, ...] = ()             # cell values that mean "missing" besides the usual ones
    skip_bad: bool = False               # leave out files that are not bars and list them
    exclude: tuple[str, ...] = ()        # glob patterns of files to leave out of folders and globs
    round_stamps: bool = False           # stamps with seconds or fractions rounded to the nearest minute
    date_format: str | None = None       # strftime format of the date column, as polars takes it
    skip_rows: int | None = None         # lines before the header; None: a first line that is no header is found
    no_header: bool = False              # the file has no header line: ``columns`` names its columns
    columns: tuple[str, ...] = ()        # the column names of a headerless file

    @classmethod
    def of(cls, *, map: Sequence[str] | None = None, user_map: Mapping[str, str] | None = None,
           **keywords: Any) -> ReadOptions:
        """From ``ingest``/``append`` keywords: ``map`` (``["SRC=DST", ...]``) merged over ``user_map``."""
        merged = {**dict(user_map or {}), **columns.parse_mapping(map)}
        for name in ("na", "exclude", "columns"):
            if name in keywords:
                value = keywords[name] or ()
                if name == "columns" and isinstance(value, str):   # "date,open,..." as on the command line
                    value = [c.strip() for c in value.split(",")]
                keywords[name] = tuple(value)
        return cls(user_map=merged, **keywords)

    def replace(self, **changes: Any) -> ReadOptions:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class AxisOptions:
    """The time axis asked for: calendar, bar size, sessions, stamps and the exchange's zone."""

    calendar: str | os.PathLike | None = None   # a file of trading dates or an exchange code (XSHG)
    freq: str | None = None                     # the bar size; default detected
    sessions: str | None = None                 # intraday session template or exchange code
    stamp: str | None = None                    # "end" or "start" (with sessions)
    timezone: str | None = None                 # the exchange's IANA zone
    assume_weekdays: bool = False               # past exchange_calendars' last covered day: the weekdays

    def replace(self, **changes: Any) -> AxisOptions:
        return dataclasses.replace(self, **changes)


# The keywords of ingest()/append() that are not a field of the same name.
KEYWORD_FIELDS = {"map": "user_map"}


def fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
