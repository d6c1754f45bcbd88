"""Per-code-point tables filled as code points are met: what a pure function of one character
(its case, its folded form) gives, looked up for a whole batch's code points with one numpy
gather instead of a Python call per character.

A table covers all 0x110000 code points but computes a code point's entry (in Python, with
the same str and unicodedata calls the slow path makes) only the first time a batch holds
it: a corpus meets a few thousand distinct characters, so after its first batches a lookup is
a gather. Building a whole table up front would cost seconds of every process's start
(unicodedata over a million code points).
"""
import threading

import numpy as np

CODE_POINTS = 0x110000


class LazyCodePointTable:
    """values(points) -> the entries of `points` (uint32 code points); `compute(new)` gives the
    entries of the code points not seen yet (a sorted array of distinct ones), as an array of
    the table's dtype. The same on any thread: an entry is a pure function of its code point."""

    def __init__(self, dtype, compute):
        self._compute = compute
        self._known = np.zeros(CODE_POINTS, dtype=bool)
        self._values = np.zeros(CODE_POINTS, dtype=dtype)
        self._lock = threading.Lock()

    def values(self, points: np.ndarray) -> np.ndarray:
        self.fill(points)
        return self._values[points]

    def fill(self, points: np.ndarray) -> None:
        """Computes the entries of the code points of `points` not seen yet."""
        new = points[~self._known[points]]
        if new.size:
            with self._lock:
                new = np.unique(new)
                new = new[~self._known[new]]
                if new.size:
                    self._values[new] = self._compute(new)
                    self._known[new] = True  # after the values: a reader that sees it known sees them
