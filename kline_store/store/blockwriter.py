"""Blocks of a new generation written by a thread while the caller builds the next one.

The caller takes a block buffer (NaN-filled), fills it and hands it back with its first row; a thread writes it
(pwrite and row checksums, writer.NewGeneration.write), asks the kernel to start writing those pages to disk
(so the final fsync has little left to wait for; they stay cached for an append that follows) and returns the
buffer for reuse. A few buffers take turns:
the memory is bounded by them, and no block is allocated afresh.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from . import safefs
from .generation import NewGeneration

BUFFERS = 2


class BlockWriter:
    """Write blocks of whole rows of ``gen`` in a thread; use as a context manager (or call :meth:`close`).

    Args:
        gen: the generation being written.
        block_rows: rows per block (the buffers' size).
    """

    def __init__(self, gen: NewGeneration, block_rows: int, buffers: int = BUFFERS) -> None:
        self.gen = gen
        shape = (max(1, min(block_rows, gen.rows)), gen.n_dates, gen.n_fields)
        self._free: queue.Queue = queue.Queue()
        for _ in range(buffers):
            self._free.put(np.empty(shape, dtype=np.float32))
        self._todo: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def block(self, rows: int) -> np.ndarray:
        """A buffer for ``rows`` rows, every cell NaN (waits while the thread holds them all)."""
        buf = self._free.get()
        self._raise()
        view = buf[:rows]
        view.fill(np.nan)
        return view

    def put(self, lo: int, block: np.ndarray) -> None:
        """Write ``block`` (from :meth:`block`) as rows ``lo ..``; it is not to be touched afterwards."""
        self._raise()
        self._todo.put((lo, block))

    def _run(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            lo, block = item
            try:
                if self._error is None:
                    self.gen.write(lo, block)
                    _start_writeback(self.gen, lo, len(block))
            except BaseException as exc:   # handed to the caller at its next call
                self._error = exc
            finally:
                self._free.put(block.base if block.base is not None else block)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for every block to be written; raise what the thread met."""
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()
        self._raise()

    def __enter__(self) -> "BlockWriter":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.close()
            return
        self._todo.put(None)       # on the caller's error: stop, then let its exception through
        self._thread.join()


def _start_writeback(gen: NewGeneration, lo: int, rows: int) -> None:
    """Start writing rows ``lo ..`` to disk now: the fsync at the end then waits for little."""
    if gen.fd is not None:
        safefs.start_writeback(gen.fd, lo * gen.stride, rows * gen.stride)
