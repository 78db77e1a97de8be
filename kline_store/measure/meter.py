"""Starvation meter: how long does a training loop wait for its data?

``watch(loader)`` wraps any iterable of batches (a kline-store loader, a plain ``torch.utils.data.DataLoader``,
a generator).  Iterating through it splits wall time into two parts:

* *data wait*: from the moment the loop asks for the next batch until the batch arrives;
* *loop body*: from the moment a batch is handed out until the loop asks for the next one.

A data-wait share near 0 % means the loader keeps up; a large share means the model is starved.

This module imports torch only when a CUDA device is to be watched, so ``import kline_store`` stays light.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ..feed.batches import batch_length
from ..errors import InputError

T = TypeVar("T")

__all__ = ["MeterReport", "Watch", "batch_length", "watch"]


@dataclasses.dataclass(frozen=True)
class MeterReport:
    """Totals over the measured batches (or the most recent ones, see ``Watch.report``).

    Attributes:
        batches: batches measured.
        samples: samples in those batches.
        wait_s: seconds spent waiting for batches.
        body_s: seconds spent in the loop body.
        data_wait_pct: ``100 * wait_s / (wait_s + body_s)``.
        batches_per_s: batches per second of wall time (wait + body).
        samples_per_s: samples per second of wall time.
        max_wait_s: the longest single wait (a stall).
        device_util_pct: mean device utilisation sampled during the loop, or None when not measured
            (no CUDA, or ``pynvml`` missing).
        skipped: batches excluded as warm-up.
    """

    batches: int
    samples: int
    wait_s: float
    body_s: float
    data_wait_pct: float
    batches_per_s: float
    samples_per_s: float
    max_wait_s: float
    device_util_pct: float | None = None
    skipped: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The report as a plain dict (for JSON)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        text = (
            f"data-wait {self.data_wait_pct:5.1f}% | {self.batches_per_s:8.1f} batches/s | "
            f"{self.samples_per_s:11,.0f} samples/s"
        )
        if self.device_util_pct is not None:
            text += f" | device util {self.device_util_pct:5.1f}%"
        return text


class _DeviceUtil:
    """Samples GPU utilisation through ``torch.cuda.utilization`` (needs pynvml); silent when unavailable."""

    def __init__(self, device: Any, clock: Callable[[], float], interval_s: float) -> None:
        self._fn: Callable[[], float] | None = None
        self._clock = clock
        self._interval = interval_s
        self._next = -float("inf")
        self.samples: list[float] = []
        torch = sys.modules.get("torch")
        if torch is None and device is not None and "cuda" in str(device):
            import torch  # noqa: F811 - only when a CUDA device was named
        if torch is None or not torch.cuda.is_available():
            return
        if device is not None and "cuda" not in str(device):
            return
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        try:
            torch.cuda.utilization(dev)
        except Exception:  # pynvml missing or NVML refused: no utilisation figure
            return
        self._fn = lambda: float(torch.cuda.utilization(dev))

    def maybe_sample(self) -> None:
        if self._fn is None:
            return
        now = self._clock()
        if now >= self._next:  # NVML calls cost ~0.1 ms: sample sparsely
            self._next = now + self._interval
            try:
                self.samples.append(self._fn())
            except Exception:
                self._fn = None

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


class Watch(Generic[T]):
    """An iterable that measures data wait against loop body while passing batches through unchanged.

    Iterate it exactly like the wrapped loader.  It can be iterated several times (epochs); totals accumulate
    until ``reset()``.

    Args:
        iterable: any iterable of batches.
        batch_size: samples per batch: an int, a function ``batch -> int``, or None to infer with
            ``batch_length``.
        warmup: batches at the start of each iteration excluded from the totals (worker start-up, compilation).
        clock: a monotonic clock returning seconds; injectable for tests.
        device: the CUDA device to sample utilisation on; None picks the current CUDA device when torch is
            already imported and CUDA is present.
        sync: if True, call ``torch.cuda.synchronize()`` before each timing point, so the loop body includes
            queued GPU work (exact, but removes CPU/GPU overlap; for diagnosis only).
        recent: how many recent batches ``report(recent=True)`` covers.
        util_interval_s: minimum seconds between two device-utilisation samples.
    """

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        batch_size: int | Callable[[Any], int] | None = None,
        warmup: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        device: Any = None,
        sync: bool = False,
        recent: int = 100,
        util_interval_s: float = 0.2,
    ) -> None:
        if warmup < 0 or recent < 1:
            raise InputError(f"watch: warmup must be >= 0 and recent >= 1 (got warmup={warmup}, recent={recent})")
        self.iterable = iterable
        self._batch_size = batch_size
        self._warmup = warmup
        self._clock = clock
        self._sync = _cuda_sync if sync else None
        self._util = _DeviceUtil(device, clock, util_interval_s)
        self._recent: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=recent)
        self.reset()

    def reset(self) -> None:
        """Forget all measurements."""
        self._batches = 0
        self._samples = 0
        self._wait = 0.0
        self._body = 0.0
        self._max_wait = 0.0
        self._skipped = 0
        self._recent.clear()
        self._util.samples.clear()

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Pass through the loader's own API (state_dict, set_epoch, ...); only reached for unknown names.
        if name == "iterable":
            raise AttributeError(name)
        return getattr(self.iterable, name)

    def _count(self, batch: Any) -> int:
        if self._batch_size is None:
            return batch_length(batch)
        if callable(self._batch_size):
            return int(self._batch_size(batch))
        return int(self._batch_size)

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    def __iter__(self) -> Iterator[T]:
        it = iter(self.iterable)
        seen = 0
        wait = 0.0
        n = 0
        while True:
            asked = self._now()
            try:
                batch = next(it)
            except StopIteration:
                return
            got = self._now()
            wait = got - asked
            n = self._count(batch)
            seen += 1
            yield batch
            # The loop body ran between `yield` returning control and the consumer asking again.
            body = self._now() - got
            if seen <= self._warmup:
                self._skipped += 1
                continue
            self._batches += 1
            self._samples += n
            self._wait += wait
            self._body += body
            self._max_wait = max(self._max_wait, wait)
            self._recent.append((wait, body, n))
            self._util.maybe_sample()

    def report(self, recent: bool = False) -> MeterReport:
        """Summarise the batches measured so far.

        A batch is counted once its loop body has finished (when the loop asks for the next batch).

        Args:
            recent: if True, cover only the last ``recent`` batches (see the constructor), for periodic logs.

        Returns:
            A ``MeterReport``; all rates are 0 before the first batch completes.
        """
        if recent:
            rows = list(self._recent)
            wait = sum(r[0] for r in rows)
            body = sum(r[1] for r in rows)
            batches, samples = len(rows), sum(r[2] for r in rows)
            max_wait = max((r[0] for r in rows), default=0.0)
        else:
            wait, body = self._wait, self._body
            batches, samples, max_wait = self._batches, self._samples, self._max_wait
        total = wait + body
        return MeterReport(
            batches=batches,
            samples=samples,
            wait_s=wait,
            body_s=body,
            data_wait_pct=100.0 * wait / total if total > 0 else 0.0,
            batches_per_s=batches / total if total > 0 else 0.0,
            samples_per_s=samples / total if total > 0 else 0.0,
            max_wait_s=max_wait,
            device_util_pct=self._util.mean(),
            skipped=self._skipped,
        )


def _cuda_sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def watch(
    iterable: Iterable[T],
    *,
    batch_size: int | Callable[[Any], int] | None = None,
    warmup: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    device: Any = None,
    sync: bool = False,
    recent: int = 100,
) -> Watch[T]:
    """Wrap a loader to measure how long the loop waits for data.

    Example::

        loader = kline_store.watch(ds.loader(batch_size=256, device="cuda"), warmup=5)
        for x, y in loader:
            ...
        print(loader.report())   # data-wait 2.1% | 480.3 batches/s | 122,957 samples/s | device util 91.0%

    Args:
        iterable: any iterable of batches (kline-store loader, torch DataLoader, generator).
        batch_size: samples per batch (int or ``batch -> int``); None infers it from each batch.
        warmup: batches at the start of each pass excluded from the totals.
        clock: monotonic clock in seconds (inject a fake one in tests).
        device: CUDA device whose utilisation to sample; None: the current one if torch and CUDA are present.
        sync: synchronise CUDA at each timing point (exact attribution, slower; diagnosis only).
        recent: window of batches for ``report(recent=True)``.

    Returns:
        A ``Watch`` that yields the same batches; call ``.report()`` at any time.
    """
    return Watch(
        iterable, batch_size=batch_size, warmup=warmup, clock=clock, device=device, sync=sync, recent=recent
    )
