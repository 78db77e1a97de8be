"""`kline-store tune` and `kline-store bench`: parse arguments, call kline_store.measure.tune / kline_store.measure.bench, print.

cli.py registers these with ``cli.add_command``. torch is imported only when a command runs.
"""

from __future__ import annotations

import json

import click

from ..errors import InputError
from ..progress import say, silenced

__all__ = ["bench", "tune"]


def _split_fields(fields: str | None) -> list[str] | None:
    return [f.strip() for f in fields.split(",") if f.strip()] if fields else None


@click.command(short_help="Find the fastest loader settings for STORE.")
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--window", "-w", type=int, required=True, help="Window length (dates per sample).")
@click.option("--batch-size", "-b", type=int, required=True, help="Batch size.")
@click.option("--device", default="cpu", show_default=True, help="Where batches go: cpu, cuda, cuda:1.")
@click.option("--fields", help="Comma-separated fields (default: all).")
@click.option("--seconds", type=float, default=1.0, show_default=True, help="Measuring time per configuration.")
@click.option("--no-save", is_flag=True, help="Do not save the recommendation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("-q", "--quiet", is_flag=True, help="No progress.")
def tune(store, window, batch_size, device, fields, seconds, no_save, as_json, quiet) -> None:
    """Search workers, prefetch depth, pinning and threads vs processes; save the best for config="auto"."""
    from ..measure.tune import tune as run

    rows: list[object] = []

    def row(t) -> None:
        if as_json:
            return
        if not rows:  # the header once the arguments have been accepted
            say(f"{'stage':<9}{'backend':<10}{'workers':>7}{'prefetch':>9}{'pinned':>7}{'samples/s':>14}", err=False)
        rows.append(t)
        c = t.config
        backend = c["backend"] if c["num_workers"] else "inline"
        say(f"{t.stage:<9}{backend:<10}{c['num_workers']:>7}{c['prefetch']:>9}"
            f"{str(c['pin_memory']):>7}{t.samples_per_s:>14,.0f}", err=False)

    with silenced(quiet):
        res = run(store, window, batch_size, device=device, fields=_split_fields(fields), seconds=seconds,
                  save=not no_save, progress=row)
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=1))
        return
    c = res.best.config
    click.echo(f"recommended: backend={c['backend'] if c['num_workers'] else 'inline'} "
               f"num_workers={c['num_workers']} prefetch={c['prefetch']} "
               f"pin_memory={c['pin_memory']} ({res.best.samples_per_s:,.0f} samples/s)")
    if res.saved_to:
        click.echo(f"saved to {res.saved_to} [{res.key}]; ds.loader(config=\"auto\") uses it")


@click.command(short_help="Time every way to load STORE's windows.")
@click.argument("store", type=click.Path(exists=True, file_okay=False))
@click.option("--window", "-w", type=int, default=64, show_default=True, help="Window length.")
@click.option("--fields", help="Comma-separated fields (default: open high low close volume amount).")
@click.option("--batch-size", "-b", type=int, default=256, show_default=True, help="Batch size of every variant.")
@click.option("--samples", type=int, default=1_000_000, show_default=True, help="Windows timed per fast row.")
@click.option("--classic-samples", type=int, default=20_000, show_default=True,
              help="Windows timed per per-sample row, extrapolated to --samples.")
@click.option("--rounds", type=int, default=3, show_default=True,
              help="Repetitions of the fast rows; the best is reported with the spread.")
@click.option("--only", multiple=True, help="Run only these variants (repeatable).")
@click.option("--min-cache-multiple", type=float, default=4.0, show_default=True,
              help="A store smaller than this many times the L3 cache is replaced by a synthetic one (0: never).")
@click.option("--scratch", type=click.Path(file_okay=False), help="Folder for the synthetic store (default: temp).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG bar chart (needs matplotlib).")
@click.option("-q", "--quiet", is_flag=True, help="No progress.")
def bench(store, window, fields, batch_size, samples, classic_samples, rounds, only, min_cache_multiple, scratch,
          as_json, plot, quiet) -> None:
    """Every way to load STORE's windows, against a bare gather, on a store bigger than the CPU cache."""
    from ..measure.bench import VARIANTS, format_table
    from ..measure.bench import bench as run
    from ..measure.bench import plot as draw

    if plot:  # fail before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("--plot needs matplotlib: pip install 'kline-store[plot]'") from None

    def row(r) -> None:
        if not as_json:
            text = "skipped" if r.skipped else f"{r.samples_per_s:>14,.0f} windows/s"
            say(f"  {r.name:<20}{text}")

    with silenced(quiet):
        res = run(store, window=window, fields=_split_fields(fields), batch_size=batch_size, samples=samples,
                  classic_samples=classic_samples, rounds=rounds, variants=list(only) or VARIANTS,
                  min_cache_multiple=min_cache_multiple, scratch=scratch, progress=row, say=say)
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=1))
    else:
        click.echo(format_table(res))
    if plot:
        out = draw(res, plot)
        if not as_json:
            click.echo(f"plot written to {out}")
