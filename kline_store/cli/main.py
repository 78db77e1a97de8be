"""The `kline-store` command: parses arguments, calls the library, prints. No logic lives here.

Every expected error becomes one line on stderr and exit status 1; torch is imported only by the commands
that need it (tune, bench).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import click

from ..errors import KlineStoreError
from ..progress import silenced
from .options import read_options


ASSUME = ("With an exchange calendar: days after the last one whose holidays exchange_calendars records are the "
          "exchange's weekdays (marked in the manifest).")
MAX_LINE = 600   # an error is one line a person reads: anything longer is cut (the cause is said first)


def _cap(msg: str) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= MAX_LINE else msg[: MAX_LINE - 5] + " ..."


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _fail(msg: str, code: int = 1) -> None:
    click.echo(f"kline-store: error: {_cap(msg)}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kline-store")
def cli() -> None:
    """K-line (OHLCV bar) files -> memory-mapped float32 store -> features -> fast, leakage-safe training batches.

    Daily, weekly, monthly or intraday bars; CSV (also .csv.gz, .csv.zst, .zip), Parquet or a Qlib directory."""


def _check_freq(ctx, param, value):
    """--freq checked before anything runs: a bad size is a usage error (exit 2)."""
    if value is None:
        return value
    from ..ingest.barsize import parse
    from ..store.timeaxis import parse_freq
    try:
        return parse(value) or parse_freq(value)
    except KlineStoreError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1] + "; or 1w, 1mo") from None


@cli.command(short_help="Build a store from CSV/Parquet files or a Qlib directory.")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--out", required=True, type=click.Path(), help="Store directory to create or replace.")
@click.option("--calendar", type=click.Path(),
              help="File of trading dates or an exchange code (XSHG, XNYS) (default: union of input dates).")
@read_options
@click.option("--replace", is_flag=True, help="Rebuild an existing store at OUT from these inputs alone.")
@click.option("--instruments", metavar="all|MARKET|FILE",
              help="Qlib directory input: symbols of instruments/MARKET.txt (default all) or of FILE.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds the store.")
@click.option("--freq", metavar="SIZE", callback=_check_freq,
              help="Bar size: 1min, 5min, ..., 60min, 1h, 1d, 1w, 1mo (default: detected).")
@click.option("--sessions", metavar="NAME|FILE",
              help="Intraday calendar: every bar of ashare, us, 24h or a CSV of open,close sessions on each date.")
@click.option("--stamp", type=click.Choice(["end", "start"]), help="Bars are stamped with their end or start (--sessions).")
@click.option("--timezone", metavar="ZONE", help="The exchange's zone (Asia/Shanghai): UTC offsets are converted to it.")
@click.option("--assume-weekdays", is_flag=True, help=ASSUME)
@click.option("-q", "--quiet", is_flag=True, help="No progress, no summary.")
def ingest(inputs, out, calendar, read, replace, instruments, wait, freq, sessions, stamp, timezone, assume_weekdays,
           quiet) -> None:
    """Read CSV/Parquet files, folders or globs, or a Qlib provider directory, into a new store at OUT
    (atomic)."""
    from ..ingest.ingestion import ingest as run
    rep = run(list(inputs), out, calendar=calendar, quiet=quiet, wait=wait, replace=replace, freq=freq,
              sessions=sessions, stamp=stamp, instruments=instruments, timezone=timezone,
              assume_weekdays=assume_weekdays, **read)
    if not quiet:
        click.echo("\n".join(rep.lines()))


@cli.command(short_help="Add new days, symbols and revised bars to STORE.")
@click.argument("store")
@click.argument("inputs", nargs=-1, required=True)
@read_options
@click.option("--dry-run", is_flag=True, help="Report what would change; write nothing.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds the store.")
@click.option("--calendar", type=click.Path(),
              help="File of trading dates listing the new dates, or an exchange code (XSHG) (daily stores).")
@click.option("--assume-weekdays", is_flag=True, help=ASSUME)
@click.option("-q", "--quiet", is_flag=True, help="No progress, no summary.")
def append(store, inputs, read, dry_run, wait, calendar, assume_weekdays, quiet) -> None:
    """Add new days and symbols (and revised bars) from INPUTS to STORE."""
    from ..ingest.update import append as run
    with silenced(quiet):
        rep = run(store, list(inputs), dry_run=dry_run, wait=wait, quiet=quiet, calendar=calendar,
                  assume_weekdays=assume_weekdays, **read)
    if not quiet:
        click.echo("\n".join(rep.lines()))


@cli.command(short_help="Shape, fields, symbols and dates of STORE.")
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--symbols", "per_symbol", is_flag=True, help="Each symbol's first and last bar and its number of bars.")
def info(store, as_json, per_symbol) -> None:
    """Shape, fields, symbols and date range of STORE."""
    from ..store.snapshot import open_store
    with open_store(store, verify=False) as st:
        d = st.info()
        rows = st.symbol_summary() if per_symbol else None
    if rows is not None and as_json:
        d["per_symbol"] = rows
    elif rows is not None:
        click.echo(f"{'symbol':<16} {'first':<19} {'last':<19} {'bars':>8}")
        for r in rows:
            click.echo(f"{r['symbol']:<16} {r['first'] or '-':<19} {r['last'] or '-':<19} {r['bars']:>8}")
        return
    if as_json:
        click.echo(json.dumps(d, ensure_ascii=False, indent=1))
        return
    syms = d["symbols"]
    shown = " ".join(syms[:10]) + (f" ... (+{len(syms) - 10})" if len(syms) > 10 else "")
    bars = "dates" if d["freq"] == "1d" else "times"
    sessions = f", sessions {d['sessions']['name']} (stamped at {d['sessions']['stamp']})" if d["sessions"] else ""
    universes = "".join(f"\nuniverse {name} ({_count(u['symbols'], 'symbol')}, {_count(u['members_last_day'], 'member')} "
                        f"on {d['end']}, {_count(u['spans'], 'span')})" for name, u in d["universes"].items())
    assumed = d.get("assumed_weekdays")
    calendar = (f"\ncalendar {d['exchange']} (exchange_calendars)" + (
        f", weekdays assumed {assumed['after']} < date <= {assumed['through']} (holidays unknown)" if assumed else "")
        if d.get("exchange") else "")
    click.echo(f"store    {d['path']} (version {d['version']}, {d['data_file']})\n"
               f"freq     {d.get('bar') or d['freq']} ({d['timezone']}{sessions})\n"
               f"shape    {d['n_symbols']} symbol{'' if d['n_symbols'] == 1 else 's'} x {d['n_dates']} {bars} x {len(d['fields'])} fields, float32, "
               f"{d['bytes'] / 2**20:.1f} MiB\n"
               f"{bars:<8} {d['start']} .. {d['end']}\n"
               f"fields   {' '.join(d['fields'])}\n"
               f"bars     {d['n_bars']}\n"
               f"symbols  {shown}{universes}{calendar}")


@cli.command(short_help="Write a coarser store from an intraday STORE.")
@click.argument("store")
@click.option("-o", "--out", required=True, type=click.Path(), help="The coarser store to write.")
@click.option("--freq", required=True, metavar="SIZE", callback=_check_freq,
              help="Bar size: 5min, 15min, 30min, 60min, ..., 1d; 1w or 1mo from a daily store.")
@click.option("--replace", is_flag=True, help="Rebuild an existing store at OUT.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds OUT.")
@click.option("--stamp", type=click.Choice(["start", "end"]), default=None,
              help="How STORE's bars are stamped, and so the new ones: by their start (16:00 holds 16:00-16:04 "
                   "in 5min) or their end; default the store's own (its sessions', else end).")
def resample(store, out, freq, replace, wait, stamp) -> None:
    """Write a coarser store (5min .. 60min, or 1d) from an intraday STORE: OHLCV aggregated exactly."""
    from ..ingest.resample import resample as run
    click.echo("\n".join(run(store, out, freq, replace=replace, wait=wait, stamp=stamp).lines()))


@cli.command(short_help="Check STORE's manifest, sizes and checksums.")
@click.argument("store")
@click.option("-q", "--quiet", is_flag=True, help="No progress.")
def verify(store, quiet) -> None:
    """Check the manifest, sizes and checksums of STORE; non-zero exit naming the damaged file."""
    from ..store.snapshot import verify as run
    with silenced(quiet):
        found = run(store)
    if found.problems:
        for p in found.problems[:20]:
            click.echo(f"kline-store: damaged: {_cap(p)}", err=True)
        if len(found.problems) > 20:
            click.echo(f"kline-store: ... and {len(found.problems) - 20} more", err=True)
        sys.exit(1)
    click.echo(f"{store}: ok" + "".join(f" ({n})" for n in found.notes))


@cli.command(short_help="Write STORE as Parquet, CSV or a Qlib directory.")
@click.argument("store")
@click.option("-o", "--out", required=True, type=click.Path(),
              help="Output .parquet or .csv file, or the directory to create with --format qlib.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "qlib"]),
              help="Default: from the suffix of OUT. qlib: a Qlib provider directory (day bars).")
@click.option("--symbols", metavar="A,B,...", help="Only these symbols (comma-separated).")
@click.option("--start", metavar="DATE", help="From the first bar of DATE (2012, 2012-03 or 2012-03-05).")
@click.option("--end", metavar="DATE", help="To the last bar of DATE (--end 2012: all of 2012).")
@click.option("--universe", metavar="NAME", help="Only the members of universe NAME, on their member days.")
@click.option("-q", "--quiet", is_flag=True, help="No progress.")
def export(store, out, fmt, symbols, start, end, universe, quiet) -> None:
    """Write STORE in long format (symbol, date, fields), one row per bar, each value on the row of the day it
    describes (a features store's label too); or, with --format qlib, as a Qlib provider directory that
    qlib.init(provider_uri=OUT) reads, every universe as instruments/NAME.txt."""
    from ..ingest.exporter import export as run
    picked = [s.strip() for s in symbols.split(",") if s.strip()] if symbols else None
    with silenced(quiet):
        n = run(store, out, fmt=fmt, symbols=picked, start=start, end=end, universe=universe)
    click.echo(f"wrote {n} rows to {out}" if fmt != "qlib" else
               f"wrote {n} symbols to the Qlib provider directory {out}: qlib.init(provider_uri={str(out)!r})")


@cli.command(short_help="Store a universe (symbols with membership dates) in STORE.")
@click.argument("store")
@click.argument("name")
@click.argument("source", required=False)
@click.option("--remove", is_flag=True, help="Remove universe NAME (no SOURCE).")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds the store.")
def universe(store, name, source, remove, wait) -> None:
    """Store universe NAME in STORE from SOURCE: a Qlib instruments file (SYMBOL<TAB>first<TAB>last) or a CSV or
    Parquet file of symbol, start, end (an empty end: still a member). A new store version; replaces a universe
    of that name. Datasets, exports and process take --universe NAME / universe=NAME."""
    from ..ingest.universes_in import set_universe
    if remove == (source is not None):
        raise click.UsageError("give SOURCE, or --remove (not both)")
    click.echo("\n".join(set_universe(store, name, None if remove else source, wait=wait).lines()))


@cli.command(short_help="Delete data files and versions no reader uses.")
@click.argument("store")
def gc(store) -> None:
    """Delete old data files and versions that no reader uses."""
    from ..store import gc as run
    removed = run(store)
    click.echo(f"removed {len(removed)} file(s)" + (": " + ", ".join(removed) if removed else ""))


def _register_torch_commands() -> None:
    """Commands whose modules need torch (imported when the command runs, not at start-up)."""
    try:
        from .features import features, process
        from .perf import bench, tune
    except ImportError:
        return
    cli.add_command(features)
    cli.add_command(process)
    cli.add_command(tune)
    cli.add_command(bench)


_register_torch_commands()


def _os_limit(exc: OSError) -> str:
    import errno
    import resource
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return f"too many open files (this process may open {soft}; raise it with `ulimit -n`)"
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _one_line_warnings() -> None:
    """The library's notes (warnings whose text starts "kline-store: ") on one line, as the CLI prints everything
    else; Python's format would add the file, line and source of the call."""
    default = warnings.formatwarning

    def fmt(message, category, filename, lineno, line=None):  # type: ignore[no-untyped-def]
        text = str(message)
        return text + "\n" if text.startswith("kline-store: ") else default(message, category, filename, lineno, line)

    warnings.formatwarning = fmt


def main() -> None:
    """Entry point: run the CLI; turn errors into one line and a non-zero exit."""
    _one_line_warnings()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message(), 2)
    except KlineStoreError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        sys.exit(1)
    except OSError as exc:   # the system's limits (open files, memory maps) say what they are
        if os.environ.get("KLINE_STORE_DEBUG"):
            raise
        _fail(_os_limit(exc))
    except Exception as exc:  # an unexpected failure still gets one line; the traceback on request
        if os.environ.get("KLINE_STORE_DEBUG"):
            raise
        _fail(f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())[:300]} "
              "(set KLINE_STORE_DEBUG=1 for a traceback)")

