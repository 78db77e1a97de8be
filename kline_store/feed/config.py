"""Loader configuration: what gathers batches (threads or worker processes), how many, how far ahead, pinned or not.

A configuration is a plain dict::

    {"backend": "threads" | "processes",   # gather threads in the training process, or worker processes
     "num_workers": int,                   # gather threads / worker processes (0: in the training thread)
     "prefetch": int,                      # chunks in flight per worker
     "pin_memory": bool}                   # pinned staging buffers (only meaningful with CUDA)

The defaults gather in as many threads as this process has cores (divided among the ranks of a node); ``tune.py``
measures the alternatives and saves the winner per (window, batch size, device kind, core count) where
``config="auto"`` finds it. Pure functions and small JSON files; no torch.

A tuning file is untrusted, like every file we read: it is opened through ``safefs`` (a regular file, no link,
no FIFO, at most 1 MiB), parsed without ``Infinity``/``NaN`` and without deep nesting, and its values must fit
this rank (workers at most the cores it has, prefetch at most what the memory budget allows). A damaged or
out-of-bounds tuning file gives one warning and the defaults.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError, KlineStoreError
from ..store import safefs
from ..system.cores import local_world_size, usable_cores
from ..system.ranks import first_rank_decides  # noqa: F401  (its old home)
from .placement import host_available_bytes

TUNE_FILE = "tune.json"
DEFAULT_PREFETCH = 2
MAX_DEFAULT_WORKERS = 8
KEYS = ("backend", "num_workers", "prefetch", "pin_memory")
BACKENDS = ("threads", "processes")
MAX_TUNE_BYTES = 1 << 20          # a tuning file holds a few entries of a few numbers each
MAX_DEPTH = 8                     # of nested objects in it
PREFETCH_BUDGET = 8               # prefetched chunks (about 8 MiB each) may take up to 1/8 of available memory
CHUNK_ESTIMATE = 8 << 20


def default_workers() -> int:
    """Gather threads by default: this process's share of the cores (at least 1, at most 8)."""
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores() // local_world_size()))


def device_kind(device: Any) -> str:
    """"cuda" for any CUDA device ("cuda:1" shares a tuned config with "cuda": a machine's GPUs are alike)."""
    text = str(device) if device is not None else "cpu"
    return text.split(":", 1)[0]


def normalize_config(config: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """Validate a loader configuration and fill in the defaults.

    Args:
        config: a partial or full configuration dict (keys as in the module docstring).
        device: where batches go; pinning defaults to on for CUDA only.

    Returns:
        A new dict with exactly the keys backend, num_workers, prefetch, pin_memory (backend "threads" when
        there are no workers: both backends then gather in the training thread).

    Raises:
        InputError: unknown key, unknown backend, or a negative/zero count.
    """
    unknown = set(config) - set(KEYS) - {"stage", "placement"}
    if unknown:
        raise InputError(f"loader config: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
    out = {"backend": "threads", "num_workers": default_workers(), "prefetch": DEFAULT_PREFETCH,
           "pin_memory": device_kind(device) == "cuda"}
    out.update({k: config[k] for k in KEYS if k in config and config[k] is not None})
    if out["backend"] not in BACKENDS:
        raise InputError(f"loader config: backend must be 'threads' or 'processes', got {out['backend']!r}")
    try:
        out["num_workers"], out["prefetch"] = int(out["num_workers"]), int(out["prefetch"])
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"loader config: num_workers and prefetch must be integers (got {out['num_workers']!r}, "
                         f"{out['prefetch']!r})") from None
    if out["num_workers"] < 0 or out["prefetch"] < 1:
        raise InputError(f"loader config: num_workers must be >= 0 and prefetch >= 1 (got {out['num_workers']}, "
                         f"{out['prefetch']})")
    out["pin_memory"] = bool(out["pin_memory"])
    if out["num_workers"] == 0:
        out["backend"] = "threads"  # no workers: batches are gathered in the training thread, whatever the backend
    return out


def config_key(window: int, batch_size: int, device: Any, cpus: int | None = None) -> str:
    """The key a tuned configuration is stored under: ``window=64,batch_size=256,device=cpu,cpus=2``."""
    cpus = usable_cores() if cpus is None else cpus
    return f"window={int(window)},batch_size={int(batch_size)},device={device_kind(device)},cpus={int(cpus)}"


def _cache_file(store_path: Path) -> Path:
    digest = hashlib.sha1(str(store_path.resolve()).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "kline-store" / f"tune-{digest}.json"


def _candidate_files(store_path: str | os.PathLike) -> list[Path]:
    p = Path(store_path)
    return [p / TUNE_FILE, _cache_file(p)]


def _cache_ok(path: Path) -> bool:
    """The per-user cache folder (and its parents under the home folder) are real folders, not links."""
    folder = path.parent
    try:
        return all(not p.is_symlink() for p in (folder, folder.parent)) and (not folder.exists() or folder.is_dir())
    except OSError:
        return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a tuning file holds")


def _depth(obj: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(obj, dict):
        return max([_depth(v, level + 1) for v in obj.values()], default=level + 1)
    if isinstance(obj, list):
        return max([_depth(v, level + 1) for v in obj], default=level + 1)
    return level


def read_tune_file(path: Path) -> dict[str, Any]:
    """A tuning file's object; ``{}`` when it does not exist. Raises InputError naming what is wrong with it."""
    try:
        raw = safefs.read_small(path, MAX_TUNE_BYTES)
    except FileNotFoundError:
        return {}
    except KlineStoreError as exc:   # safefs names the file
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a JSON tuning file ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(data, dict) or _depth(data) > MAX_DEPTH:
        raise InputError(f"{path}: not a tuning file (an object of a few levels)")
    return data


def _read_json(path: Path) -> dict[str, Any]:
    """A tuning file found by ``config="auto"``: missing is ``{}``; damaged is ``{}`` and one warning."""
    if path.name != TUNE_FILE and not _cache_ok(path):
        warnings.warn(f"kline-store: ignoring the tuning cache {path.parent} (a link, not a folder); using the "
                      f"defaults", RuntimeWarning, stacklevel=3)
        return {}
    try:
        return read_tune_file(path)
    except InputError as exc:
        warnings.warn(f"kline-store: ignoring {exc}; using the default loader configuration", RuntimeWarning,
                      stacklevel=3)
        return {}


def bounded(config: dict[str, Any], source: Path) -> dict[str, Any] | None:
    """A tuned configuration if it fits this rank (workers at most its cores, prefetch within the memory budget),
    else None and one warning."""
    cores = max(1, usable_cores() // local_world_size())
    budget = host_available_bytes() // PREFETCH_BUDGET
    most = max(1, budget // (CHUNK_ESTIMATE * max(1, config["num_workers"])))
    if config["num_workers"] <= cores and config["prefetch"] <= most:
        return config
    warnings.warn(f"kline-store: ignoring the tuned loader configuration in {source} (num_workers="
                  f"{config['num_workers']}, prefetch={config['prefetch']}; this rank has {cores} core(s) and "
                  f"memory for a prefetch of {most}); using the defaults", RuntimeWarning, stacklevel=3)
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""


def save_config(store_path: str | os.PathLike, window: int, batch_size: int, device: Any, config: dict[str, Any],
                table: Sequence[dict[str, Any]] = ()) -> Path:
    """Save a tuned configuration in ``<store>/tune.json``, or ``~/.cache/kline-store/`` if the store is read-only.

    Entries for other keys (window, batch size, device, cpu count) are kept.

    Returns:
        The file written.
    """
    entry = {"config": normalize_config(config, device), "measured": list(table),
             "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": os.uname().nodename, "user": _user()}
    key = config_key(window, batch_size, device)
    last_error: OSError | None = None
    for path in _candidate_files(store_path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # a damaged file is replaced: nothing to warn about
            data = _read_json(path)
        data[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.name != TUNE_FILE and not _cache_ok(path):
                raise OSError(f"{path.parent} is a link, not a folder")
            safefs.write_atomic(path, json.dumps(data, indent=1, sort_keys=True).encode(), durable=False)
            return path
        except (OSError, KlineStoreError) as exc:  # read-only store: fall through to the per-user cache
            last_error = exc  # type: ignore[assignment]
    raise InputError(f"cannot save tuned config for {store_path}: {last_error}")


def load_config(store_path: str | os.PathLike, window: int, batch_size: int, device: Any) -> dict[str, Any] | None:
    """The configuration ``tune`` saved for this store, window, batch size, device kind and cpu count, or None."""
    key = config_key(window, batch_size, device)
    for path in _candidate_files(store_path):
        entry = _read_json(path).get(key)
        if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
            try:
                config = normalize_config(entry["config"], device)
            except InputError:
                warnings.warn(f"kline-store: ignoring the tuned loader configuration in {path} (invalid values); "
                              f"using the defaults", RuntimeWarning, stacklevel=2)
                return None
            return bounded(config, path)
    return None


def resolve_config(config: str | os.PathLike | dict[str, Any] | None, store_path: str | os.PathLike, window: int,
                   batch_size: int, device: Any) -> tuple[dict[str, Any], str]:
    """Turn the loader's ``config=`` argument into a configuration dict.

    Args:
        config: None (defaults), "auto" (the tuned config for this key, the defaults when there is none), a path
            to a JSON file (a tune file keyed like ``tune.json``, or a plain config dict), or a dict.
        store_path, window, batch_size, device: the key for "auto" and for keyed tune files.

    Returns:
        ``(config, source)``: the normalised configuration and where it came from ("default", "tuned", "given").

    Raises:
        InputError: the path does not exist or holds no usable config; invalid keys or values.
    """
    if config is None:
        return normalize_config({}, device), "default"
    if isinstance(config, dict):
        return normalize_config(config, device), "given"
    if str(config) == "auto":
        tuned = load_config(store_path, window, batch_size, device)
        return (tuned, "tuned") if tuned is not None else (normalize_config({}, device), "default")
    path = Path(config)
    if not path.exists() and not path.is_symlink():
        raise InputError(f"loader config: {path} does not exist; pass 'auto', a dict, or a JSON file from `tune`")
    data = read_tune_file(path)
    key = config_key(window, batch_size, device)
    if isinstance(data.get(key), dict) and "config" in data[key]:
        return normalize_config(data[key]["config"], device), "given"
    if data and set(data) <= set(KEYS) | {"stage", "placement"}:
        return normalize_config(data, device), "given"
    raise InputError(f"loader config: {path} has no entry for {key}; run `kline-store tune` with these settings")
