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
    the table's dtype, never `unknown` (the entry of a code point not computed yet, so that a
    lookup is one gather). The same on any thread: an entry is a pure function of its code
    point."""

    def __init__(self, dtype, compute, unknown):
        self._compute = compute
        self._unknown = unknown
        self._values = np.full(CODE_POINTS, unknown, dtype=dtype)
        self._lock = threading.Lock()

    def values(self, points: np.ndarray) -> np.ndarray:
        """The entries of `points`, code points of a str (all below CODE_POINTS)."""
        # Unchecked (mode="clip": a str's code points are in range): a third faster than indexing.
        values = np.take(self._values, points, mode="clip")
        new = values == self._unknown
        if new.any():
            with self._lock:
                todo = np.unique(points[new])
                todo = todo[self._values[todo] == self._unknown]
                if todo.size:
                    computed = self._compute(todo)
                    if (computed == self._unknown).any():
                        raise ValueError("a code point's entry is the table's `unknown`")
                    self._values[todo] = computed
            values[new] = self._values[points[new]]
        return values
