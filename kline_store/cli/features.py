"""`kline-store features`: parse arguments, call kline_store.features.compute, print the summary."""

from __future__ import annotations

import click

from ..errors import InputError
from ..progress import silenced


@click.command(short_help="Compute Alpha158/Alpha360/expression features into a store.")
@click.argument("store")
@click.option("-o", "--out", type=click.Path(), help="The features store to write (not with --update).")
@click.option("--set", "sets", multiple=True, metavar="NAME",
              help="A named set: alpha158, alpha360, alpha101, alpha101:FIELD (with the industry alphas, FIELD "
                   "holding industry codes) (repeatable; default alpha158 unless --expr/--file).")
@click.option("--expr", "exprs", multiple=True, metavar="NAME=EXPR",
              help="A Qlib expression, e.g. 'MA5=Mean($close, 5)/$close' (repeatable).")
@click.option("--file", "files", multiple=True, type=click.Path(), help="A file of NAME=EXPR lines.")
@click.option("--label", default="default", metavar="EXPR|NAME=EXPR|none",
              help="The label (default: LABEL0 = Ref($close, -2)/Ref($close, -1) - 1); 'none' for no label.")
@click.option("--universe", metavar="NAME",
              help="Cross-sectional operators (CSRank, ...) over universe NAME's members of each day.")
@click.option("--update", is_flag=True, help="STORE is a features store: compute the bars its source gained.")
@click.option("--device", default="cpu", help="cpu, cuda or cuda:N: where the panel blocks are computed.")
@click.option("--replace", is_flag=True, help="Recompute an existing features store at OUT.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads, each on its own symbols (default: torch's thread count).")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds OUT.")
@click.option("-q", "--quiet", is_flag=True, help="No progress, no summary.")
def features(store, out, sets, exprs, files, label, universe, update, device, replace, threads, wait, quiet) -> None:
    """Compute features over STORE's panel into a new store at OUT, one field per feature plus the label:
    Qlib's expression language and its Alpha158/Alpha360 sets, equal to Qlib's values. With --update, STORE is
    a features store brought up to date with the bar store it was computed from."""
    from ..features.compute import compute_features, update_features
    if update:
        given = [n for n, v in (("-o", out), ("--set", sets), ("--expr", exprs), ("--file", files),
                                ("--replace", replace), ("--universe", universe)) if v] + \
            (["--label"] if label != "default" else [])
        if given:
            raise click.UsageError(f"--update recomputes what STORE's manifest records; {', '.join(given)} "
                                   "do not apply (compute a new store with -o instead)")
        with silenced(quiet):
            rep = update_features(store, device, wait=wait, quiet=quiet, threads=threads)
    else:
        if not out:
            raise click.UsageError("give -o OUT for the features store to write (or --update)")
        chosen = list(sets) if sets or exprs or files else ["alpha158"]
        lab = None if label.strip().lower() == "none" else label
        if not chosen and not exprs and not files and lab is None:
            raise InputError("features: nothing to compute")
        with silenced(quiet):
            rep = compute_features(store, out, chosen, list(exprs) or None, lab, list(files), device,
                                   replace=replace, wait=wait, quiet=quiet, universe=universe, threads=threads)
    if not quiet:
        click.echo("\n".join(rep.lines()))


@click.command(short_help="Normalise a features store with Qlib's processors.")
@click.argument("store")
@click.option("-o", "--out", required=True, type=click.Path(), help="The processed store to write.")
@click.option("--fit-start", metavar="DATE", help="First date the fitted statistics come from (default: the first).")
@click.option("--fit-end", metavar="DATE", help="Last date the fitted statistics come from (the train split's end).")
@click.option("--infer", "infer", multiple=True, metavar="NAME[:GROUP]",
              help="Infer processors in order (default RobustZScoreNorm, Fillna on the features).")
@click.option("--learn", "learn", multiple=True, metavar="NAME[:GROUP]",
              help="Learn processors in order (default DropnaLabel, CSRankNorm on the label).")
@click.option("--universe", metavar="NAME", help="Only the rows of universe NAME's members (Qlib's instruments=NAME).")
@click.option("--replace", is_flag=True, help="Rewrite an existing store at OUT.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait if another writer holds OUT.")
@click.option("-q", "--quiet", is_flag=True, help="No progress, no summary.")
def process(store, out, fit_start, fit_end, infer, learn, universe, replace, wait, quiet) -> None:
    """Run Qlib's processors over the features store STORE and write the result to OUT: by default Qlib's
    benchmark pipeline (features RobustZScoreNorm + Fillna, label DropnaLabel + CSRankNorm), every fitted
    statistic from --fit-start .. --fit-end only. GROUP is feature, label or all."""
    from ..features.process import QLIB_INFER, QLIB_LEARN, process_features
    with silenced(quiet):
        rep = process_features(store, out, list(infer) or QLIB_INFER, list(learn) or QLIB_LEARN,
                               fit_start=fit_start, fit_end=fit_end, universe=universe, replace=replace, wait=wait,
                               quiet=quiet)
    if not quiet:
        click.echo("\n".join(rep.lines()))
