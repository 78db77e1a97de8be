"""One way to time a loader, for ``tune`` and ``bench``: samples per second after a warm-up, epoch after epoch.

Works on anything iterable that yields batches (our loader, a plain ``DataLoader``, a generator). A loader with
``close()`` is closed afterwards; for anything else the last reference is dropped, which is how a ``DataLoader``'s
worker processes are told to stop.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..feed.batches import batch_length
from ..errors import InputError


@dataclass(frozen=True)
class Timing:
    """Samples delivered in ``seconds`` after the warm-up (``batches`` of them)."""

    samples: int
    seconds: float
    batches: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def endless(source: Iterable[Any]) -> Iterator[Any]:
    """Batches of ``source``, pass after pass (an epoch per ``iter()``); a generator is consumed once."""
    while True:
        empty = True
        for batch in source:
            empty = False
            yield batch
        if empty or iter(source) is source:
            if empty:
                raise InputError("the loader yielded no batch; the store is too small for this window/batch")
            return


def time_batches(source: Iterable[Any], *, samples: int | None = None, seconds: float | None = None,
                 warmup_batches: int = 3, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``source`` until ``samples`` samples or ``seconds`` seconds, whichever comes first, after a warm-up.

    The clock starts once the last warm-up batch is in; the loop body is empty, so this is the rate at which the
    loader delivers, not how well it overlaps a model's compute (the starvation meter tells that).

    Raises:
        InputError: neither a sample count nor a duration, or a loader that delivers nothing.
    """
    if samples is None and seconds is None:
        raise InputError("time_batches: give samples= or seconds=")
    stream = endless(source)
    try:
        for _ in range(warmup_batches):
            next(stream)
        n = batches = 0
        start = clock()
        for batch in stream:
            n += batch_length(batch)
            batches += 1
            elapsed = clock() - start
            if (samples is not None and n >= samples) or (seconds is not None and elapsed >= seconds):
                return Timing(n, elapsed, batches)
        return Timing(n, clock() - start, batches)
    except StopIteration:
        raise InputError("the loader yielded fewer batches than its warm-up") from None
    finally:
        stream.close()


def shut_down(source: Any) -> None:
    """Stop a loader's workers: ``close()`` when it has one; a collection pass frees the rest."""
    close = getattr(source, "close", None)
    if callable(close):
        close()
    gc.collect()
