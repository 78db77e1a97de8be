"""prefetch.py: results in input order whatever the thread timing, bounded work ahead, errors at their position,
and torch thread counts: one per gather thread, the trainer's own count untouched."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from kline_store.errors import InputError
from kline_store.feed.prefetch import OrderedPrefetcher, SingleThreaded


@pytest.mark.parametrize("n_threads", [0, 1, 2, 4])
def test_prefetch_keeps_order(n_threads):
    rng = np.random.default_rng(n_threads)
    delays = rng.uniform(0, 0.002, 60)

    def work(i: int) -> int:
        time.sleep(delays[i])  # uneven work: threads finish out of order
        return i * i

    pf = OrderedPrefetcher(range(60), work, n_threads=n_threads, depth=3)
    assert list(pf) == [i * i for i in range(60)]


def test_prefetch_depth_bounds_work_ahead():
    started: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        return i

    pf = OrderedPrefetcher(range(100), work, n_threads=2, depth=4)
    first = next(pf)
    time.sleep(0.05)  # give the threads every chance to run ahead
    with lock:
        ahead = len(started)
    assert first == 0 and ahead <= 1 + 4  # the consumed item plus at most `depth` in flight
    assert list(pf) == list(range(1, 100))


def test_prefetch_raises_in_order_and_stops():
    def work(i: int) -> int:
        if i == 5:
            raise ValueError("bad item 5")
        return i

    pf = OrderedPrefetcher(range(20), work, n_threads=2, depth=2)
    got = []
    with pytest.raises(ValueError, match="bad item 5"):
        for x in pf:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]

    def items():
        yield 1
        raise RuntimeError("index source failed")

    pf = OrderedPrefetcher(items(), lambda i: i, n_threads=1, depth=2)
    assert next(pf) == 1
    with pytest.raises(RuntimeError, match="index source"):
        next(pf)


def test_prefetch_close_stops_threads():
    pf = OrderedPrefetcher(iter(range(10**9)), lambda i: i, n_threads=2, depth=2)
    assert next(pf) == 0
    pf.close()
    assert all(not th.is_alive() for th in pf._threads)
    with pytest.raises(StopIteration):
        next(pf)
    with pytest.raises(InputError):
        OrderedPrefetcher([], lambda i: i, n_threads=-1)


def test_gather_threads_leave_the_trainers_torch_threads_alone():
    # A fresh process whose main thread has not run a parallel op yet: the worst case.
    code = (
        "import torch\n"
        "from kline_store.feed.prefetch import KeepTorchThreads, OrderedPrefetcher, single_threaded_torch\n"
        "before = torch.get_num_threads()\n"
        "seen = []\n"
        "with KeepTorchThreads():\n"
        "    pf = OrderedPrefetcher(range(4), lambda i: seen.append(torch.get_num_threads()) or i,\n"
        "                           n_threads=2, depth=2, thread_init=single_threaded_torch)\n"
        "assert list(pf) == [0, 1, 2, 3]\n"
        "print(before, torch.get_num_threads(), set(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after, seen = out.stdout.split(maxsplit=2)
    assert after == before and seen.strip() == "{1}"


def test_single_threaded_helper_runs_calls_in_order_off_the_trainers_threads():
    before = torch.get_num_threads()
    helper = SingleThreaded()
    try:
        assert [helper.call(lambda i: (i, torch.get_num_threads()), i) for i in range(3)] == [(0, 1), (1, 1), (2, 1)]
        with pytest.raises(ZeroDivisionError):
            helper.call(lambda: 1 / 0)
    finally:
        helper.close()
    assert torch.get_num_threads() == before
