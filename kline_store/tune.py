"""Loader auto-tuning: the classic manual search (workers, prefetch depth, pinning, threads vs processes), automated.

The search *policy* is a pure function over the throughputs measured so far (``next_trial``, ``recommend``), so it
is tested without any timing; ``tune`` is the driver that measures each proposed configuration on a real store
and saves the winner where ``ds.loader(config="auto")`` finds it (``load_config``).

A configuration is a plain dict::

    {"backend": "threads" | "processes",   # who gathers batches: threads in this process, or worker processes
     "num_workers": int,                   # gather threads / DataLoader worker processes (0: in the consumer)
     "prefetch": int,                      # batches kept in flight ahead of the consumer
     "pin_memory": bool}                   # pinned staging buffers (only meaningful with CUDA)
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = [
    "DEFAULT_CONFIG",
    "Trial",
    "TuneResult",
    "config_key",
    "load_config",
    "measure_throughput",
    "next_trial",
    "normalize_config",
    "recommend",
    "resolve_config",
    "save_config",
    "tune",
    "worker_ladder",
]

TUNE_FILE = "tune.json"
PREFETCH_DEPTHS = (2, 4, 8)
DEFAULT_CONFIG: dict[str, Any] = {"backend": "threads", "num_workers": 1, "prefetch": 2, "pin_memory": True}
_BACKENDS = ("threads", "processes")


# --------------------------------------------------------------------------- configuration


def normalize_config(config: dict[str, Any]) -> dict[str, Any]:
    """Validate a loader configuration and fill in defaults.

    Args:
        config: a partial or full configuration dict (keys as in the module docstring).

    Returns:
        A new dict with exactly the keys backend, num_workers, prefetch, pin_memory (backend "threads" when
        there are no workers: both backends then gather in the consumer).

    Raises:
        InputError: unknown key, unknown backend, or a negative/zero count.
    """
    unknown = set(config) - set(DEFAULT_CONFIG) - {"stage", "placement"}
    if unknown:
        raise InputError(f"loader config: unknown key(s) {sorted(unknown)}; known: {sorted(DEFAULT_CONFIG)}")
    out = {**DEFAULT_CONFIG, **{k: config[k] for k in DEFAULT_CONFIG if k in config}}
    if out["backend"] not in _BACKENDS:
        raise InputError(f"loader config: backend must be 'threads' or 'processes', got {out['backend']!r}")
    if int(out["num_workers"]) < 0 or int(out["prefetch"]) < 1:
        raise InputError(
            f"loader config: num_workers must be >= 0 and prefetch >= 1 (got {out['num_workers']}, {out['prefetch']})"
        )
    out["num_workers"] = int(out["num_workers"])
    out["prefetch"] = int(out["prefetch"])
    out["pin_memory"] = bool(out["pin_memory"])
    if out["num_workers"] == 0:
        out["backend"] = "threads"  # no workers: batches are gathered in the consumer, whatever the backend
    return out


def _device_kind(device: Any) -> str:
    # "cuda:1" and "cuda" share a tuned config: the machine's GPUs are normally alike.
    text = str(device) if device is not None else "cpu"
    return text.split(":", 1)[0]


def config_key(window: int, batch_size: int, device: Any, cpus: int | None = None) -> str:
    """The key a tuned configuration is stored under: ``window=64,batch_size=256,device=cpu,cpus=2``."""
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    return f"window={int(window)},batch_size={int(batch_size)},device={_device_kind(device)},cpus={int(cpus)}"


def _cache_file(store_path: Path) -> Path:
    digest = hashlib.sha1(str(store_path.resolve()).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "kline-store" / f"tune-{digest}.json"


def _candidate_files(store_path: str | os.PathLike) -> list[Path]:
    p = Path(store_path)
    return [p / TUNE_FILE, _cache_file(p)]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # a damaged tuning file only costs a re-tune
    return data if isinstance(data, dict) else {}


def save_config(
    store_path: str | os.PathLike,
    window: int,
    batch_size: int,
    device: Any,
    config: dict[str, Any],
    table: Sequence[dict[str, Any]] = (),
) -> Path:
    """Save a tuned configuration in ``<store>/tune.json``, or ``~/.cache/kline-store/`` if the store is read-only.

    Entries for other keys (window, batch size, device, cpu count) are kept.

    Returns:
        The file written.
    """
    entry = {
        "config": normalize_config(config),
        "measured": list(table),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": os.uname().nodename,
        "user": _user(),
    }
    key = config_key(window, batch_size, device)
    last_error: OSError | None = None
    for path in _candidate_files(store_path):
        data = _read_json(path)
        data[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with open(tmp, "w") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
            return path
        except OSError as exc:  # read-only store: fall through to the per-user cache
            last_error = exc
    raise InputError(f"cannot save tuned config for {store_path}: {last_error}")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""


def load_config(store_path: str | os.PathLike, window: int, batch_size: int, device: Any) -> dict[str, Any] | None:
    """The configuration ``tune`` saved for this store, window, batch size, device kind and cpu count.

    Args:
        store_path: the store directory.
        window: window length the loader uses.
        batch_size: batch size the loader uses.
        device: "cpu", "cuda", "cuda:0", a torch.device or None (cpu).

    Returns:
        The normalised config dict, or None when nothing was tuned for this key.
    """
    key = config_key(window, batch_size, device)
    for path in _candidate_files(store_path):
        entry = _read_json(path).get(key)
        if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
            try:
                return normalize_config(entry["config"])
            except InputError:
                continue
    return None


def resolve_config(
    config: str | os.PathLike | dict[str, Any] | None,
    store_path: str | os.PathLike,
    window: int,
    batch_size: int,
    device: Any,
) -> dict[str, Any]:
    """Turn the loader's ``config=`` argument into a configuration dict.

    Args:
        config: None (defaults), "auto" (the tuned config for this key, defaults when there is none), a path to a
            JSON file (a tune file keyed like ``tune.json``, or a plain config dict), or a dict.
        store_path, window, batch_size, device: the key for "auto" and for keyed tune files.

    Returns:
        A normalised configuration.

    Raises:
        InputError: the path does not exist or holds no usable config; invalid keys or values.
    """
    # Pinned memory only speeds up copies to a GPU: the defaults ask for it on CUDA alone.
    defaults = {} if _device_kind(device) == "cuda" else {"pin_memory": False}
    if config is None:
        return normalize_config(defaults)
    if isinstance(config, dict):
        return normalize_config(config)
    if str(config) == "auto":
        return load_config(store_path, window, batch_size, device) or normalize_config(defaults)
    path = Path(config)
    if not path.is_file():
        raise InputError(f"loader config: {path} does not exist; pass 'auto', a dict, or a JSON file from `tune`")
    data = _read_json(path)
    key = config_key(window, batch_size, device)
    if isinstance(data.get(key), dict) and "config" in data[key]:
        return normalize_config(data[key]["config"])
    if set(data) <= set(DEFAULT_CONFIG) | {"stage", "placement"} and data:
        return normalize_config(data)
    raise InputError(f"loader config: {path} has no entry for {key}; run `kline-store tune` with these settings")


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


def measure_throughput(
    make_loader: Callable[[], Any],
    *,
    seconds: float = 1.0,
    warmup_batches: int = 3,
    max_batches: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Samples per second delivered by a fresh loader, after a short warm-up.

    Args:
        make_loader: builds the loader to measure (any iterable of batches; re-iterated if it ends early).
        seconds: how long to measure after warm-up.
        warmup_batches: batches consumed before the clock starts (worker start-up, first-touch page faults).
        max_batches: stop after this many measured batches even if ``seconds`` has not elapsed.
        clock: monotonic clock in seconds.

    Returns:
        Samples per second (0.0 when the loader yields nothing).
    """
    from .meter import batch_length

    loader = make_loader()
    samples = batches = 0
    start: float | None = None
    try:
        for _ in range(2 if warmup_batches else 1):  # a second pass when the warm-up ate a short epoch
            for batch in loader:
                if start is None:
                    batches += 1
                    if batches >= warmup_batches:  # the clock starts once the last warm-up batch is in
                        start, batches = clock(), 0
                    continue
                samples += batch_length(batch)
                batches += 1
                if clock() - start >= seconds or (max_batches is not None and batches >= max_batches):
                    return samples / max(clock() - start, 1e-9)
        if start is None or samples == 0:
            return 0.0
        return samples / max(clock() - start, 1e-9)
    finally:
        _shutdown(loader)


def _shutdown(loader: Any) -> None:
    # Persistent DataLoader workers would linger until GC; stop them between trials.
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


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
        cores: CPU cores to search up to (default: ``os.cpu_count()``).
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
    cores = cores or os.cpu_count() or 1
    cuda = _device_kind(device) == "cuda"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise InputError(f"tune: device {device!r} requested but CUDA is not available; use --device cpu")

    if measure is None:
        from .dataset import KlineDataset

        ds = KlineDataset(store, window=window, fields=list(fields) if fields else None)

        def measure(config: dict[str, Any]) -> float:
            return measure_throughput(
                lambda: ds.loader(batch_size=batch_size, shuffle=True, seed=0, device=device, config=config),
                seconds=seconds,
            )

    trials: list[Trial] = []
    while (proposal := next_trial(trials, cores=cores, cuda=cuda, threshold=threshold)) is not None:
        stage, config = proposal
        trial = Trial(stage, config, float(measure(config)))
        trials.append(trial)
        if progress is not None:
            progress(trial)
    best = recommend(trials, threshold)
    result = TuneResult(trials, best, config_key(window, batch_size, device), None)
    if save:
        result.saved_to = save_config(store, window, batch_size, device, best.config, result.table())
    return result
