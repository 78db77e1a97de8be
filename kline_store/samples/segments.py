"""Which segment each sample position falls in, for the O(segments) indexes (blocks.py, day_blocks.py).

Sample positions are laid out segment after segment (``cum[g] .. cum[g + 1]``). ``np.searchsorted`` of a chunk of
random positions over ``cum`` (tens of thousands of segments and more) costs a cache miss per step of each binary
search: about 0.7 ms for the 5,461 windows of a loader chunk, a tenth of the gather itself. Here a table of the
segment at every ``2**shift``-th position (about one entry per non-empty segment) gives each position's segment or
one a few before it; a few vectorised steps forward finish it (4x faster), and the rare position still short after
them (runs of tiny segments) takes the binary search.
"""

from __future__ import annotations

import numpy as np

STEPS = 4   # steps forward from the table's guess before the binary search takes over


class SegmentLookup:
    """``lookup(pos) -> g`` with ``cum[g] <= pos < cum[g + 1]`` for ``0 <= pos < cum[-1]``.

    Args:
        cum: int64 ``[segments + 1]``, the first position of each segment and the total (non-decreasing: empty
            segments allowed; a position is never in one).
    """

    def __init__(self, cum: np.ndarray) -> None:
        cum = np.asarray(cum, dtype=np.int64)
        total = int(cum[-1]) if len(cum) else 0
        self.nz = np.flatnonzero(np.diff(cum)).astype(np.int64)      # non-empty segments
        self.start = np.r_[cum[self.nz], total].astype(np.int64)     # their first positions, then the total
        n = max(1, len(self.nz))
        self.shift = max(0, int(np.log2(max(1, total // n))))
        points = np.arange(0, total, 1 << self.shift, dtype=np.int64)
        self.table = (np.searchsorted(self.start, points, "right") - 1).astype(np.int32 if n < 2**31 else np.int64)

    @property
    def nbytes(self) -> int:
        return self.nz.nbytes + self.start.nbytes + self.table.nbytes

    def __call__(self, pos: np.ndarray) -> np.ndarray:
        pos = np.asarray(pos, dtype=np.int64)
        if pos.size == 0:
            return np.zeros(0, dtype=np.int64)
        i = self.table[pos >> self.shift].astype(np.int64)
        for _ in range(STEPS):
            ahead = self.start[i + 1] <= pos
            if not ahead.any():
                return self.nz[i]
            i += ahead
        late = np.flatnonzero(self.start[i + 1] <= pos)
        if len(late):
            i[late] = np.searchsorted(self.start, pos[late], "right") - 1
        return self.nz[i]


__all__ = ["SegmentLookup"]
