"""Loader auto-tuning: the classic manual search (workers, prefetch depth, pinning, threads vs processes), automated.

The search *policy* is a pure function over the throughputs measured so far (``next_trial``, ``recommend``), so it
is tested without any timing; ``tune`` is the driver that measures each proposed configuration on a real store
and saves the winner where ``ds.loader(config="auto")`` finds it (``config.load_config``). Configurations are the
plain dicts of ``config.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..feed.config import config_key, device_kind, normalize_config, save_config
from ..samples.dataset import KlineDataset
from ..errors import InputError
from ..system.cores import usable_cores
from ..progress import Progress
from .timing import shut_down, time_batches

__all__ = ["PREFETCH_DEPTHS", "Trial", "TuneResult", "measure_throughput", "next_trial", "recommend", "tune",
           "worker_ladder"]

PREFETCH_DEPTHS = (2, 4, 8)


# --------------------------------------------------------------------------- search policy (pure)


def worker_ladder(cores: int) -> list[int]:
    """Worker counts to try: 0, 1, 2, 4, ... up to ``cores`` (``cores`` itself included)."""
    ladder, n = [0], 1
    while n < cores:
        ladder.append(n)
        n *= 2
    if cores >= 1:
        ladder.append(cores)
    return ladder


@dataclasses.dataclass(frozen=True)
class Trial:
    """One measured configuration.

    Attributes:
        stage: the search stage that proposed it ("workers", "threads", "prefetch", "pinned").
        config: the normalised configuration.
        samples_per_s: measured throughput (samples of ``x`` delivered per second).
    """

    stage: str
    config: dict[str, Any]
    samples_per_s: float


def _cost(config: dict[str, Any]) -> tuple[int, int, int, int]:
    # Fewer workers, threads before processes, shallower prefetch, no pinning: cheaper at equal speed.
    return (
        config["num_workers"],
        config["backend"] == "processes",
        config["prefetch"],
        bool(config["pin_memory"]),
    )


def recommend(trials: Sequence[Trial], threshold: float = 0.05) -> Trial:
    """The cheapest configuration whose throughput is within ``threshold`` of the fastest one.

    Differences below the threshold are treated as noise, so the tuner does not recommend 4 workers for a 2 %
    gain over 1.

    Raises:
        InputError: no trials.
    """
    if not trials:
        raise InputError("tune: nothing was measured")
    top = max(t.samples_per_s for t in trials)
    near = [t for t in trials if t.samples_per_s >= top * (1.0 - threshold)]
    return min(near, key=lambda t: _cost(t.config))


def _ladder_done(stage_trials: Sequence[Trial], threshold: float) -> bool:
    """A ladder stops once the newest rung fails to beat every earlier rung by more than ``threshold``."""
    if len(stage_trials) < 2:
        return False
    best_before = max(t.samples_per_s for t in stage_trials[:-1])
    return stage_trials[-1].samples_per_s <= best_before * (1.0 + threshold)


def _seen(trials: Sequence[Trial], config: dict[str, Any]) -> bool:
    return any(t.config == config for t in trials)


def next_trial(
    trials: Sequence[Trial], *, cores: int, cuda: bool, threshold: float = 0.05
) -> tuple[str, dict[str, Any]] | None:
    """Propose the next configuration to measure, given everything measured so far.

    Stages, each starting from the best configuration so far (``recommend``):

    1. ``workers``: worker processes 0, 1, 2, 4, ... up to ``cores``, stopping as soon as a step improves
       throughput by no more than ``threshold``.
    2. ``threads``: the same ladder (from 1) with gather threads instead of processes.
    3. ``prefetch``: depths 2, 4, 8 on the best so far (when it has workers or threads to prefetch with).
    4. ``pinned``: pinned staging buffers on and off, only when CUDA exists.

    Args:
        trials: measured trials, in the order they were proposed.
        cores: CPU cores available to the loader.
        cuda: whether a CUDA device is used (pinning matters only then).
        threshold: relative gain that counts as an improvement.

    Returns:
        ``(stage, config)`` to measure next, or None when the search is finished.
    """
    by_stage: dict[str, list[Trial]] = {}
    for t in trials:
        by_stage.setdefault(t.stage, []).append(t)
    ladder = worker_ladder(max(1, cores))

    # 1. worker processes
    done = by_stage.get("workers", [])
    if not _ladder_done(done, threshold) and len(done) < len(ladder):
        return "workers", normalize_config(
            {"backend": "processes", "num_workers": ladder[len(done)], "prefetch": 2, "pin_memory": cuda}
        )

    # 2. gather threads in the consumer process
    thread_ladder = [n for n in ladder if n > 0]
    done = by_stage.get("threads", [])
    if not _ladder_done(done, threshold) and len(done) < len(thread_ladder):
        return "threads", normalize_config(
            {"backend": "threads", "num_workers": thread_ladder[len(done)], "prefetch": 2, "pin_memory": cuda}
        )

    # 3. prefetch depth around the best of the ladders (there is nothing to prefetch with 0 workers)
    ladders = [t for t in trials if t.stage in ("workers", "threads")]
    anchor = recommend(ladders, threshold).config
    if anchor["num_workers"] > 0:
        for depth in PREFETCH_DEPTHS:
            cand = {**anchor, "prefetch": depth}
            if not _seen(trials, cand):
                return "prefetch", cand
    # 4. pinned staging on/off around the best so far (CUDA only)
    if cuda and "pinned" not in by_stage:
        best = recommend(trials, threshold).config
        cand = {**best, "pin_memory": not best["pin_memory"]}
        if not _seen(trials, cand):
            return "pinned", cand
    return None


# --------------------------------------------------------------------------- measurement (driver)


@dataclasses.dataclass
class TuneResult:
    """What ``tune`` measured and chose.

    Attributes:
        trials: every measured trial in order.
        best: the recommended trial.
        key: the storage key.
        saved_to: the file the config was saved to (None when not saved).
    """

    trials: list[Trial]
    best: Trial
    key: str
    saved_to: Path | None

    def table(self) -> list[dict[str, Any]]:
        """One plain dict per trial (for JSON and printing)."""
        top = max(t.samples_per_s for t in self.trials)
        return [
            {
                "stage": t.stage,
                **t.config,
                "samples_per_s": round(t.samples_per_s, 1),
                "relative": round(t.samples_per_s / top, 3) if top > 0 else 0.0,
                "chosen": t is self.best,
            }
            for t in self.trials
        ]

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready types."""
        return {
            "key": self.key,
            "recommended": self.best.config,
            "samples_per_s": round(self.best.samples_per_s, 1),
            "saved_to": str(self.saved_to) if self.saved_to else None,
            "trials": self.table(),
        }


def measure_throughput(make_loader: Callable[[], Any], *, seconds: float = 1.0, warmup_batches: int = 3,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """Samples per second delivered by a fresh loader (any iterable of batches), after a short warm-up.

    Returns:
        Samples per second (0.0 when the loader yields nothing).
    """
    loader = make_loader()
    try:
        return time_batches(loader, seconds=seconds, warmup_batches=warmup_batches, clock=clock).samples_per_s
    except InputError:
        return 0.0
    finally:
        shut_down(loader)
        del loader


def tune(
    store: str | os.PathLike,
    window: int,
    batch_size: int,
    *,
    device: str = "cpu",
    fields: Sequence[str] | None = None,
    seconds: float = 1.0,
    threshold: float = 0.05,
    save: bool = True,
    cores: int | None = None,
    measure: Callable[[dict[str, Any]], float] | None = None,
    progress: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """Search loader configurations on a real store and save the best.

    Args:
        store: the store directory.
        window: window length.
        batch_size: batch size.
        device: "cpu" or a CUDA device; the loader delivers batches there.
        fields: fields to load (None: all).
        seconds: measuring time per configuration.
        threshold: relative gain that counts as an improvement (0.05 = 5 %).
        save: save the recommendation (``save_config``) so ``ds.loader(config="auto")`` uses it.
        cores: CPU cores to search up to (default: the cores this process may use).
        measure: ``config -> samples/s``; replaces real measurement (tests, custom loaders).
        progress: called with each trial as soon as it is measured (the CLI prints a row).

    Returns:
        A ``TuneResult``.

    Raises:
        InputError: bad arguments (window, batch size, device).
    """
    if window < 1 or batch_size < 1:
        raise InputError(f"tune: window and batch size must be >= 1 (got {window}, {batch_size})")
    if seconds <= 0:
        raise InputError(f"tune: seconds per trial must be > 0 (got {seconds})")
    cores = cores or usable_cores()
    cuda = device_kind(device) == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise InputError(f"tune: device {device!r} requested but CUDA is not available; use --device cpu")

    if measure is None:
        ds = KlineDataset(store, window=window, fields=list(fields) if fields else None)

        def measure(config: dict[str, Any]) -> float:
            return measure_throughput(
                lambda: ds.loader(batch_size=batch_size, shuffle=True, seed=0, device=device, config=config),
                seconds=seconds,
            )

    trials: list[Trial] = []
    bar = Progress(None, "tune", unit="trials")
    while (proposal := next_trial(trials, cores=cores, cuda=cuda, threshold=threshold)) is not None:
        stage, config = proposal
        trial = Trial(stage, config, float(measure(config)))
        trials.append(trial)
        bar.step(note=stage)
        if progress is not None:
            progress(trial)
    bar.close()
    best = recommend(trials, threshold)
    result = TuneResult(trials, best, config_key(window, batch_size, device), None)
    if save:
        result.saved_to = save_config(store, window, batch_size, device, best.config, result.table())
    return result
