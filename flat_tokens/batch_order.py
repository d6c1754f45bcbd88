"""The order in which packed_batches serves a split's windows: one that does not depend on how
many hosts (or DataLoader workers) serve it. Pure functions of the arguments; no reads.

Row lanes. Global batch k has B rows; row j of every batch is served by lane j, a stream of
its own. Each epoch's windows are cut into contiguous blocks, the blocks are permuted by
(seed, epoch), and lane j owns the slice [j*m, (j+1)*m) of that sequence of windows, m =
num_windows // B (the num_windows % B windows at its end sit out the epoch, a different few
each epoch). Lane j serves its slice piece by piece (a piece: the slice's part of a group of
`lane_blocks` consecutive blocks), one window per step, in an order drawn from (seed, epoch,
piece, lane). So:

- global batch k (row j = lane j's window at step k) is a pure function of (seed, k) and the
  arguments, whatever the world size; host r of w serves the rows [r*B/w, (r+1)*B/w), i.e.
  the lanes whose slices together are the contiguous share [r*B/w*m, (r+1)*B/w*m) of each
  epoch: it reads about 1/w of the split. Every w that divides B works, and the same stream
  continues on another w from any step.
- DataLoader workers: inside a piece, the steps are dealt to WORKER_PHASES sub-pieces by the
  step's phase (bit-reversed step % 8); sub-piece f takes a contiguous run of the piece's
  windows. A worker serving every K-th step (K = 1, 2, 4, 8) meets only the phases of one
  contiguous run of sub-pieces, so K workers read the host's share about once in all.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

WORKER_PHASES = 8  # a power of two: workers counts that divide it read disjoint parts of a piece
_PHASE_BITS = WORKER_PHASES.bit_length() - 1
# Purposes of the permutations (the first word of their keys); 3 is blend.py's per-split seed.
_BLOCK_ORDER, _WINDOW_ORDER = 1, 2


def permutation(n: int, key: tuple[int, ...]) -> np.ndarray:
    """A permutation of range(n) that is a pure function of `key` (non-negative ints).

    The order of PCG64's raw 64-bit output seeded with SeedSequence(key), ties broken by index.
    It relies on the SeedSequence and PCG64 algorithms only, not on a Generator method (which
    numpy may change between versions, NEP 19), so a run resumed under another numpy serves
    the same batches. Keys have 4+ words: SeedSequence pads shorter ones with zeros, which would
    make (a, b) and (a, b, 0) the same key."""
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw(n)
    return np.argsort(raw, kind="stable")


def phase(steps: np.ndarray) -> np.ndarray:
    """The worker phase of each step: step % WORKER_PHASES with its bits reversed, so that the
    steps one of K workers serves (one residue mod K, K a power of two <= WORKER_PHASES) have
    the contiguous phases [f*WORKER_PHASES/K, (f+1)*WORKER_PHASES/K)."""
    low = np.asarray(steps, dtype=np.int64) % WORKER_PHASES
    out = np.zeros_like(low)
    for bit in range(_PHASE_BITS):
        out |= ((low >> bit) & 1) << (_PHASE_BITS - 1 - bit)
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def host_rows(batch_size: int, rank, world_size) -> range:
    """The rows (lanes) of every global batch that host `rank` of `world_size` serves:
    [rank*B/w, (rank+1)*B/w). ValueError, naming the nearest world sizes that work, unless w
    divides B (every host must serve whole rows of the same batches)."""
    for value, what in ((world_size, "world_size"), (rank, "rank")):
        try:
            operator.index(value)
        except TypeError:
            raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None
    world_size, rank = operator.index(world_size), operator.index(rank)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) = [0, {world_size}), got {rank}")
    if batch_size % world_size:
        fits = divisors(batch_size)
        below = max(d for d in fits if d < world_size)
        above = [d for d in fits if d > world_size]
        nearest = f"{below} or {above[0]}" if above else f"{below}"
        raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world_size}: every host "
                         f"serves batch_size / world_size rows of the same global batches, so world_size must "
                         f"divide batch_size (nearest that do: {nearest})")
    rows = batch_size // world_size
    return range(rank * rows, (rank + 1) * rows)


class Piece(NamedTuple):
    """The part of one lane's stream that one read serves: steps [first, end) of the lane, its
    windows as runs of consecutive windows `(first window, count)` in row order, and for each
    step first + i the row it serves (`serving[i]`)."""

    first: int
    end: int
    runs: list
    serving: np.ndarray


class BatchOrder:
    """Which window each lane (row of the global batch) serves at each step (see the module's
    doc): a pure function of (num_windows, lanes, block_windows, lane_blocks, seed), never of
    the world size, the workers or the storage's chunking."""

    def __init__(self, num_windows: int, lanes: int, block_windows: int, lane_blocks: int, seed: int):
        if num_windows < lanes:
            raise ValueError(f"{num_windows} windows for {lanes} lanes")
        self.num_windows, self.lanes = num_windows, lanes
        self.block_windows, self.lane_blocks, self.seed = block_windows, lane_blocks, seed
        self.per_lane = num_windows // lanes  # steps per epoch: each lane's windows per epoch
        self.num_blocks = -(-num_windows // block_windows)
        self._plans: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # the last epochs used

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(the epoch's blocks in order, the starts of its groups of lane_blocks blocks, in windows)."""
        if epoch not in self._plans:
            if not 0 <= epoch < 1 << 32:
                raise OverflowError(f"epoch {epoch} out of range")
            blocks = permutation(self.num_blocks, (_BLOCK_ORDER, epoch, 0, self.seed))
            sizes = np.minimum(self.block_windows, self.num_windows - blocks * self.block_windows)
            ends = np.concatenate([[0], np.cumsum(sizes)])
            starts = ends[list(range(0, self.num_blocks, self.lane_blocks)) + [self.num_blocks]]
            if len(self._plans) >= 2:  # lanes of a blend may stand in two epochs at once
                self._plans.pop(next(iter(self._plans)))
            self._plans[epoch] = (blocks, starts)
        return self._plans[epoch]

    def piece_at(self, lane: int, step: int) -> Piece:
        """The piece of lane `lane` that serves its step `step` (step k: global batch k)."""
        epoch, q = divmod(step, self.per_lane)
        blocks, starts = self._plan(epoch)
        offset = lane * self.per_lane  # of the lane's slice in the epoch's sequence of windows
        g = int(np.searchsorted(starts, offset + q, "right")) - 1
        lo = max(int(starts[g]), offset) - int(starts[g])  # the slice's rows of group g: [lo, hi)
        hi = min(int(starts[g + 1]), offset + self.per_lane) - int(starts[g])
        runs, row = [], 0
        for k in blocks[g * self.lane_blocks:(g + 1) * self.lane_blocks].tolist():
            count = min(self.block_windows, self.num_windows - k * self.block_windows)
            a, z = max(row, lo), min(row + count, hi)
            if a < z:
                runs.append((k * self.block_windows + a - row, z - a))
            row += count
        first = epoch * self.per_lane + int(starts[g]) + lo - offset
        size = hi - lo
        phases = phase(np.arange(first, first + size))
        counts = np.bincount(phases, minlength=WORKER_PHASES)
        bases = np.concatenate([[0], np.cumsum(counts)])  # sub-piece f: rows [bases[f], bases[f+1])
        # One draw for the piece; each sub-piece's windows in the order of its part of it.
        raw = np.random.PCG64(np.random.SeedSequence([_WINDOW_ORDER, epoch, g, lane, self.seed])).random_raw(size)
        serving = np.empty(size, np.int64)
        for f in np.flatnonzero(counts).tolist():
            serving[phases == f] = bases[f] + np.argsort(raw[bases[f]:bases[f + 1]], kind="stable")
        return Piece(first, first + size, runs, serving)

    def window(self, lane: int, step: int) -> int:
        """The window lane `lane` serves at step `step` (for tests and tools: no read)."""
        piece = self.piece_at(lane, step)
        row = int(piece.serving[step - piece.first])
        for first, count in piece.runs:
            if row < count:
                return first + row
            row -= count
        raise AssertionError("a piece's rows are its runs'")
