"""The command-line flags shared by `ingest` and `append`: the read options (kline_store/ingest/options.py).

``@read_options`` declares them once and hands the command one dict, ``read``, of ``ingest``/``append``
keywords, passed on whole (``run(..., **read)``): a flag added here reaches both commands and both paths.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

# (flag, keyword of ingest()/append(), click settings), in the order --help shows them
READ_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--map", "map", dict(multiple=True, metavar="SRC=FIELD", help="Map a column name, e.g. 'Px Last=close'.")),
    ("--strict", "strict", dict(is_flag=True, help="Treat data-quality warnings as errors.")),
    ("--symbol-pattern", "symbol_pattern",
     dict(metavar="REGEX", help="Symbol from file names, e.g. 'yahoofinance-(\\w+)-'.")),
    ("--symbol", "symbol", dict(metavar="NAME", help="The symbol of a single input file without a symbol column.")),
    ("--na", "na", dict(multiple=True, metavar="VALUE",
                        help="A cell value that means missing (repeatable), e.g. '.' or '#N/A'.")),
    ("--skip-bad", "skip_bad", dict(is_flag=True, help="Leave out files that are not bars (ticks, quotes, ...) and list them.")),
    ("--exclude", "exclude", dict(multiple=True, metavar="GLOB",
                                  help="Leave out files whose name or path matches (repeatable).")),
    ("--round-stamps", "round_stamps", dict(is_flag=True, help="Round stamps with seconds or fractions "
                                            "(09:31:00.5) to the nearest minute instead of refusing them.")),
    ("--date-format", "date_format", dict(metavar="FMT", help="How dates are written, as polars' strftime: "
                                          "'%d.%m.%Y %H:%M:%S%.f', '%d-%b-%y', '%b %d %Y', '%Y-%m-%d %I-%p'.")),
    ("--skip-rows", "skip_rows", dict(type=click.IntRange(min=0), metavar="N",
                                      help="Lines before the header (default: a first line that is no header is "
                                           "skipped and reported).")),
    ("--no-header", "no_header", dict(is_flag=True, help="The files have no header line; name the columns with --columns.")),
    ("--columns", "columns", dict(metavar="A,B,...", help="Column names of headerless files, e.g. date,open,high,low,close,volume.")),
)


def read_options(command: Callable) -> Callable:
    """Add the read flags to a command; it receives them as one keyword, ``read`` (a dict of keywords)."""
    names = [name for _, name, _ in READ_FLAGS]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        read = {name: kwargs.pop(name) for name in names}
        return command(read=read, **kwargs)

    for flag, name, settings in reversed(READ_FLAGS):
        wrapper = click.option(flag, name, **settings)(wrapper)
    return wrapper
