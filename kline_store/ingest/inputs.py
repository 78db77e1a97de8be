"""Where input comes from: files, folders and globs; the symbol in a file name; "line N of file".

Every message that points into an input file gets its position from :func:`location`, the one place that
knows a CSV's header is line 1 and a Parquet file has rows.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import os
import re
from pathlib import Path

from ..errors import InputError
from .packed import JSON_SUFFIXES, SUFFIXES as PACKED_SUFFIXES
from .qlib_format import is_provider

CSV_SUFFIXES = (".csv", ".txt", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")


class FixedSymbol(str):
    """``--symbol NAME`` (``symbol=``): the symbol of a single input without a symbol column, whatever its name."""


def fixed_symbol(symbol: object, files: list[Path], pattern: str | None) -> FixedSymbol:
    """``symbol=`` / ``--symbol NAME``: the symbol of one input file, instead of its name."""
    if not isinstance(symbol, str) or not symbol.strip():
        raise InputError(f"symbol: expected a non-empty name, got {type(symbol).__name__}")
    if pattern:
        raise InputError("--symbol and --symbol-pattern: give one of them")
    if len(files) != 1:
        raise InputError(f"--symbol {symbol}: names the symbol of one input; {len(files)} files given "
                         f"(use --symbol-pattern, or a symbol column)")
    return FixedSymbol(symbol.strip())


def shown(p: Path | str) -> str:
    """A file as messages and the manifest name it: a DataFrame's temporary file (ingest/from_frames.py) is
    "DataFrame"."""
    p = Path(p)
    return "DataFrame" if p.name == "DataFrame.parquet" and p.parent.name.startswith("kline-frame-") else str(p)


def is_parquet(p: Path) -> bool:
    return p.name.lower().endswith(PARQUET_SUFFIXES)


# Lines a CSV's text has before its header beyond one (skipped lines), less one for a headerless file: set by
# sources.inspect_source for files read with a preamble (preamble.py), so that messages name the file's own lines.
_SHIFT: dict[str, int] = {}


def shift_lines(path: Path, shift: int) -> None:
    """Record how the lines polars reads of ``path`` are offset from the file's own (0: not at all)."""
    if shift:
        _SHIFT[str(path)] = int(shift)
    else:
        _SHIFT.pop(str(path), None)


def line_shift(path: Path) -> int:
    return _SHIFT.get(str(path), 0)


def location(path: Path, row: int) -> str:
    """Where 0-based data row ``row`` is, in the file's own terms: "line N" of a CSV (its header is line 1,
    unless lines before it were skipped or it has none), "row N" of a Parquet file, "record N" of a JSON array."""
    name = path.name.lower()
    if name.endswith(JSON_SUFFIXES):   # JSON records: the record's number (NDJSON: its line)
        return f"{'record' if name.endswith('.json') else 'line'} {int(row) + 1}"
    return f"row {int(row) + 1}" if is_parquet(path) else f"line {int(row) + 2 + _SHIFT.get(str(path), 0)}"


def _is_data_file(p: Path) -> bool:
    name = p.name.lower()
    return not name.startswith(".") and name.endswith(CSV_SUFFIXES + PARQUET_SUFFIXES + PACKED_SUFFIXES +
                                                      JSON_SUFFIXES)


def _walk(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and _is_data_file(f))


# polars (Rust) aborts the process, with a backtrace and no cleanup, when an allocation fails: under an
# address-space limit below this, reading files is refused up front instead.
MIN_ADDRESS_SPACE = 2 << 30


def check_address_space() -> None:
    """InputError when ``ulimit -v`` leaves less address space than polars needs to read files safely."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < MIN_ADDRESS_SPACE:
        raise InputError(f"the address-space limit (ulimit -v) is {soft >> 20} MiB; reading files needs at least "
                         f"{MIN_ADDRESS_SPACE >> 20} MiB (polars aborts below it): raise the limit")


def as_input_list(inputs: object) -> list[str | os.PathLike]:
    """``inputs`` as a list of paths: one path given alone is a list of one (not its characters); refused up
    front under an address-space limit too small to read them (:func:`check_address_space`)."""
    check_address_space()
    if isinstance(inputs, (str, os.PathLike)):
        return [inputs]
    try:
        items = list(inputs)   # type: ignore[call-overload]
    except TypeError:
        raise InputError(f"inputs={inputs!r}: expected a path or a list of paths") from None
    if not items:
        raise InputError("no input given")
    for x in items:
        if not isinstance(x, (str, os.PathLike)):
            raise InputError(f"input {x!r}: expected a path")
    return items


def excluded(p: Path, patterns: tuple[str, ...] | list[str] | None) -> bool:
    """``--exclude GLOB``: the file's name or its path matches one of the patterns (``*tick*``, ``raw/*``)."""
    return any(fnmatch.fnmatch(p.name, g) or fnmatch.fnmatch(str(p), g) or fnmatch.fnmatch(str(p), f"*/{g}")
               for g in patterns or ())


def expand_inputs(inputs: list[str | os.PathLike], exclude: tuple[str, ...] | list[str] | None = None
                  ) -> list[Path]:
    """Files, folders (their CSV/Parquet files, recursively) and glob patterns -> sorted unique files, less those
    ``exclude`` (glob patterns) names."""
    inputs = as_input_list(inputs)
    files: list[Path] = []
    for item in inputs:
        s = str(item)
        p = Path(s)
        if p.is_dir():
            if is_provider(p):    # its calendar and instrument lists are .txt files, not bars
                raise InputError(f"{p}: a Qlib provider directory is read by `kline-store ingest {p} -o STORE`, "
                                 f"alone; append and mixed inputs take CSV or Parquet files")
            found = _walk(p)
            nested = next((f.parents[1] for f in found if f.parent.name in ("calendars", "instruments")
                           and is_provider(f.parents[1])), None)
            if nested is not None:
                raise InputError(f"{p}: holds the Qlib provider directory {nested}: ingest it alone "
                                 f"(`kline-store ingest {nested} -o STORE`)")
            if not found:
                raise InputError(f"{p}: folder holds no .csv or .parquet file")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        elif any(ch in s for ch in "*?["):
            found = []
            for m in sorted(_glob.glob(s, recursive=True)):
                mp = Path(m)
                if mp.is_dir():
                    found.extend(_walk(mp))
                elif mp.is_file():
                    found.append(mp)
            if not found:
                raise InputError(f"{s}: pattern matches no file")
            files.extend(found)
        else:
            raise InputError(f"{s}: no such file or folder")
    seen: set[Path] = set()
    out = []
    if exclude:
        kept = [f for f in files if not excluded(f, exclude)]
        if not kept:
            raise InputError(f"--exclude {' '.join(exclude)}: excludes every input file ({len(files)})")
        files = kept
    for f in files:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            out.append(f)
    return out


def symbol_from_name(p: Path, pattern: str | None = None) -> str:
    """The symbol of a one-file-per-symbol input: its name without the data suffix (`000001.SZ.csv`), or
    what ``pattern`` (a regular expression; its first group if it has one) finds in that name."""
    if isinstance(pattern, FixedSymbol):
        return str(pattern)
    name = p.name
    for suffix in PACKED_SUFFIXES + JSON_SUFFIXES + CSV_SUFFIXES + PARQUET_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    if pattern:
        m = re.search(compile_pattern(pattern), name)
        if m is None:
            raise InputError(f"{p}: --symbol-pattern {pattern!r} does not match the file name {name!r}")
        name = m.group(1) if m.groups() else m.group(0)
        if not name:
            raise InputError(f"{p}: --symbol-pattern {pattern!r} finds an empty symbol in the file name")
    if not name:
        raise InputError(f"{p}: no symbol in the file name (nothing before its suffix); rename the file or add a "
                         f"symbol column")
    return name


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``--symbol-pattern`` as a regular expression; InputError naming the option when it is not one."""
    try:
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise InputError(f"--symbol-pattern {pattern!r}: not a regular expression ({exc})") from None
