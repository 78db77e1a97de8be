"""Ordered prefetch in threads: apply a function to a stream of items in background threads, results in order.

The gather releases the GIL for the bulk of its work (numpy and torch kernels), so threads in the training
process gather in parallel without a process boundary to cross. Each thread runs torch with one intra-op thread:
parallelism comes from the threads themselves, never from OpenMP teams that spin and stall when another process
holds a core (on a busy machine a 2-thread ``index_select`` ran 7x slower than a 1-thread one).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import torch

from ..system.background import stop_before_exit, track
from ..errors import InputError

T = TypeVar("T")
R = TypeVar("R")


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class OrderedPrefetcher(Generic[T, R]):
    """Apply ``work`` to the items of an iterator in background threads; yield results in input order.

    At most ``depth`` items are in progress or waiting for the consumer, so memory stays bounded and a slow
    consumer throttles the producers. With ``n_threads=0`` the work runs inline in the consumer (no prefetch).
    An exception in ``work`` is raised to the consumer at the position of the item that caused it.

    Args:
        items: the inputs, consumed under a lock (any iterator).
        work: item -> result; should release the GIL for the bulk of its time (torch/numpy kernels do).
        n_threads: background threads.
        depth: items in flight ahead of the consumer (>= 1).
        thread_init: called once at the start of each thread (e.g. to limit torch's intra-op threads); the
            constructor returns only after every thread has run it.
    """

    def __init__(
        self,
        items: Iterable[T],
        work: Callable[[T], R],
        *,
        n_threads: int = 1,
        depth: int = 2,
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        if n_threads < 0 or depth < 1:
            raise InputError(f"prefetch: n_threads must be >= 0 and depth >= 1 (got {n_threads}, {depth})")
        self._items = iter(items)
        self._work = work
        self._depth = depth
        self._cond = threading.Condition()
        self._taken = 0  # items handed to threads
        self._given = 0  # results handed to the consumer
        self._done: dict[int, Any] = {}
        self._end: int | None = None
        self._closed = False
        self._thread_init = thread_init
        self._initialised = threading.Semaphore(0)
        self._threads = [
            track(threading.Thread(target=self._run, name=f"kline-prefetch-{k}", daemon=True))
            for k in range(n_threads)
        ]
        for th in self._threads:
            th.start()
        for _ in self._threads:
            self._initialised.acquire()
        if self._threads:
            stop_before_exit(self)

    def _run(self) -> None:
        try:
            if self._thread_init is not None:
                self._thread_init()
        finally:
            self._initialised.release()
        while True:
            with self._cond:
                while not self._closed and self._end is None and self._taken - self._given >= self._depth:
                    self._cond.wait()
                if self._closed or self._end is not None:
                    return
                try:
                    item = next(self._items)
                except StopIteration:
                    self._end = self._taken
                    self._cond.notify_all()
                    return
                except BaseException as exc:  # a failing index source ends the stream with its error
                    self._end = self._taken + 1
                    self._done[self._taken] = _Failure(exc)
                    self._taken += 1
                    self._cond.notify_all()
                    return
                seq = self._taken
                self._taken += 1
            try:
                result: Any = self._work(item)
            except BaseException as exc:
                result = _Failure(exc)
            with self._cond:
                self._done[seq] = result
                self._cond.notify_all()

    def __iter__(self) -> OrderedPrefetcher[T, R]:
        return self

    def __next__(self) -> R:
        if not self._threads:
            return self._next_inline()
        with self._cond:
            while self._given not in self._done:
                if self._closed or (self._end is not None and self._given >= self._end):
                    raise StopIteration
                self._cond.wait()
            result = self._done.pop(self._given)
            self._given += 1
            self._cond.notify_all()
        if isinstance(result, _Failure):
            self.close()
            raise result.exc
        return result

    def _next_inline(self) -> R:
        if self._closed:
            raise StopIteration
        item = next(self._items)
        self._given += 1
        return self._work(item)

    def close(self, join: bool = True) -> None:
        """Stop the threads (items in progress finish, their results are dropped).

        Args:
            join: wait for the threads; False lets the caller first unblock a thread stuck in its work (a
                producer waiting for a ring slot) and then call :meth:`join`.
        """
        with self._cond:
            self._closed = True
            self._done.clear()
            self._cond.notify_all()
        if join:
            self.join()

    def join(self) -> None:
        for th in self._threads:
            if th is not threading.current_thread():
                th.join(timeout=10)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def single_threaded_torch() -> None:
    """Thread initialiser: this thread's torch ops run on one core.

    get_num_threads() first: it runs torch's per-thread lazy init, which would otherwise later reset this thread to
    the global count.
    """
    torch.get_num_threads()
    torch.set_num_threads(1)


class KeepTorchThreads:
    """Restore torch's global intra-op thread count after prefetch threads lowered their own.

    ``torch.set_num_threads`` in a worker also changes the process-wide default that threads initialise from
    later, including the main thread if it has not run a parallel op yet: the training loop would silently run
    on one core. Entering initialises the calling thread; leaving puts the default back.
    """

    def __enter__(self) -> None:
        self.count = torch.get_num_threads()

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.count)


class SingleThreaded:
    """One persistent thread whose torch ops run on one intra-op thread; ``call`` runs a function there and waits.

    For work that must happen on demand, in order, yet off OpenMP: switching the training thread's own torch
    thread count back and forth would rebuild its OpenMP team every time and slow the model that uses it.
    """

    def __init__(self) -> None:
        with KeepTorchThreads():
            self._pool = concurrent.futures.ThreadPoolExecutor(1, "kline-gather", initializer=single_threaded_torch)
            self._pool.submit(lambda: None).result()   # the initializer has run before this returns

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
