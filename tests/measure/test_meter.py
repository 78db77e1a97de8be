"""Starvation meter: attribution of wait vs body with an injected clock, on any iterable."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kline_store.errors import InputError
from kline_store.measure.meter import MeterReport, batch_length, watch


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


class SlowIterable:
    """Each batch 'takes' `fetch` seconds of the fake clock to arrive."""

    def __init__(self, clock: FakeClock, n: int, fetch: float, batch: int = 8) -> None:
        self.clock, self.n, self.fetch, self.batch = clock, n, fetch, batch

    def __iter__(self):
        for i in range(self.n):
            self.clock.advance(self.fetch)
            yield np.full((self.batch, 3), i)

    def __len__(self) -> int:
        return self.n


def test_attribution_with_fake_clock():
    clock = FakeClock()
    w = watch(SlowIterable(clock, 10, fetch=0.03), clock=clock)
    seen = []
    for batch in w:
        seen.append(int(batch[0, 0]))
        clock.advance(0.01)  # loop body
    assert seen == list(range(10))  # batches pass through unchanged, in order
    r = w.report()
    assert r.batches == 10 and r.samples == 80
    assert r.wait_s == pytest.approx(0.3) and r.body_s == pytest.approx(0.1)
    assert r.data_wait_pct == pytest.approx(75.0)
    assert r.batches_per_s == pytest.approx(25.0)
    assert r.samples_per_s == pytest.approx(200.0)
    assert r.max_wait_s == pytest.approx(0.03)
    assert r.device_util_pct is None
    assert "data-wait" in str(r) and "samples/s" in str(r)


def test_warmup_recent_and_reset():
    clock = FakeClock()

    class Uneven:
        def __iter__(self):
            for i in range(6):
                clock.advance(1.0 if i == 0 else 0.1)  # a slow first batch (worker start-up)
                yield [i, i]

    w = watch(Uneven(), clock=clock, warmup=1, recent=2)
    for _ in w:
        clock.advance(0.1)
    r = w.report()
    assert r.skipped == 1 and r.batches == 5 and r.samples == 10
    assert r.data_wait_pct == pytest.approx(50.0)
    assert r.max_wait_s == pytest.approx(0.1)
    assert w.report(recent=True).batches == 2
    # a second pass (epoch) accumulates, and skips its own warm-up batch
    for _ in w:
        clock.advance(0.3)
    assert w.report().batches == 10
    w.reset()
    assert w.report() == MeterReport(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, 0)


def test_early_break_counts_completed_bodies_only():
    clock = FakeClock()
    w = watch(SlowIterable(clock, 100, fetch=0.02), clock=clock)
    for i, _ in enumerate(w):
        clock.advance(0.02)
        if i == 4:
            break
    assert w.report().batches == 4  # the 5th body never handed control back


def test_real_slow_iterator_starved():
    # Deliberately slow iterator against an empty body: wait must dominate (generous bound, real clock).
    def slow():
        for _ in range(5):
            time.sleep(0.02)
            yield np.zeros((4, 2))

    w = watch(slow())
    assert sum(1 for _ in w) == 5
    r = w.report()
    assert r.samples == 20 and r.data_wait_pct > 50.0


def test_works_on_torch_dataloader_and_passthrough():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    dl = DataLoader(TensorDataset(torch.arange(50.0).reshape(25, 2), torch.arange(25)), batch_size=10)
    w = watch(dl)
    assert len(w) == 3 and w.batch_size == 10  # DataLoader attributes pass through
    sizes = [x.shape[0] for x, _ in w]
    assert sizes == [10, 10, 5] and w.report().samples == 25


def test_batch_length_shapes():
    assert batch_length(np.zeros((7, 3))) == 7
    assert batch_length((np.zeros((5, 2)), np.zeros(5))) == 5
    assert batch_length({"x": np.zeros((3, 1)), "y": np.zeros(3)}) == 3
    assert batch_length([1, 2, 3, 4]) == 4
    assert batch_length([[np.zeros(2), np.zeros(2)]]) == 2
    assert batch_length(np.float32(1.0)) == 1
    assert batch_length(object()) == 1
    assert batch_length({}) == 0


def test_explicit_batch_size_and_bad_args():
    clock = FakeClock()
    w = watch(SlowIterable(clock, 3, fetch=0.1), clock=clock, batch_size=100)
    for _ in w:
        clock.advance(0.1)
    assert w.report().samples == 300
    w = watch(SlowIterable(clock, 3, fetch=0.1), clock=clock, batch_size=lambda b: 2 * len(b))
    for _ in w:
        clock.advance(0.1)
    assert w.report().samples == 48
    with pytest.raises(InputError):
        watch([], warmup=-1)
