"""Train-time blending: packed batches drawn from several splits (of one or several
datasets) in chosen proportions, without writing a new dataset.

    from flat_tokens.blend import Blend
    from flat_tokens.reader import FlatTokensSplit

    blend = Blend([FlatTokensSplit("web.zarr"), FlatTokensSplit("code.zarr")], weights=[0.7, 0.3], seed=0)
    for inputs, targets in blend.packed_batches(2048, 32, start_step=step): ...

Row j of every batch is a lane (as in FlatTokensSplit.packed_batches). Lane j's t-th window
comes from the split Megatron-LM's BlendedDataset would choose at position t + j
(helpers.cpp, build_blending_indices): the split whose count lags its weight most,
``argmax_i(w_i * max(p, 1) - count_i)``, ties to the first, with the weights normalised to
sum to 1. So batch k's rows are the choices at positions [k, k + B): every lane's windows and
every batch's rows hold each split's share to within a few windows (the rule keeps every
prefix within two: measured at most one with two splits, 1.5 with three, 1.87 with eight).
The c-th window lane j takes from split i is lane j's window at step c of that split's own
order, exactly as its ``packed_batches`` orders it with batch_size B and the seed
`source_seed(seed, i)`: its windows shuffled, epoch after epoch, each split's lane restarting
its epoch on its own when it runs out.

Batch k is a pure function of the splits, weights, seed and arguments, not of the number of
hosts. ``start_step=k`` resumes there; it replays the choices (not the reads) of the k + B
positions before it: 0.4-0.7 s per million positions for 2-8 splits (measured on one core),
and no reads. A Blend pickles (its splits by URL), so a DataLoader worker or a restarted job
can rebuild it. With ``rank=r, world_size=w``, host r serves rows [r*B/w, (r+1)*B/w) of the
global batches: their lanes of every split, about 1/w of each.

The splits must share a tokenizer (the sha256 each dataset records in its provenance), else
ValueError, unless ``allow_mixed_tokenizers=True``.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from flat_tokens.batch_order import host_rows
from flat_tokens.reader import (BLOCK_TOKENS, BUFFER_BLOCKS, READ_THREADS, FlatTokensSplit, LaneStream, batch_of, checked_count,
                             window_length)

_BLEND = 3  # the purpose word of the per-split seeds (reader's permutations use 1 and 2)


def source_seed(seed: int, index: int) -> int:
    """The seed of split `index`'s own window order in a blend seeded `seed`: independent
    orders for the splits (SeedSequence's algorithm, which numpy keeps stable)."""
    return int(np.random.SeedSequence([_BLEND, index, seed]).generate_state(1, np.uint64)[0])


class _Choices:
    """Megatron's blending rule, position by position: which split each position takes."""

    def __init__(self, weights: list[float]):
        self.weights = weights
        self.counts = [0] * len(weights)
        self.position = 0

    def advance(self, positions: int) -> np.ndarray:
        """The split of each of the next `positions` positions (int64), counting them."""
        w, c, n = self.weights, self.counts, len(self.weights)
        out = np.empty(positions, np.int64)
        p = self.position
        for k in range(positions):
            s = max(p + k, 1)
            best, lag = 0, w[0] * s - c[0]
            for i in range(1, n):
                e = w[i] * s - c[i]
                if e > lag:
                    best, lag = i, e
            c[best] += 1
            out[k] = best
        self.position = p + positions
        return out


def tokenizer_of(split: FlatTokensSplit) -> dict | None:
    """The tokenizer a split's dataset records (its provenance: spec, sha256, vocab_size...), or
    None for a dataset that records none (not written by flat-tokens-beam)."""
    recorded = split.attrs.get("tokenizer")
    return recorded if isinstance(recorded, dict) and recorded.get("sha256") else None


def _check_one_tokenizer(splits: list[FlatTokensSplit]) -> None:
    """ValueError, naming two of them, unless every split records the same tokenizer (sha256 of
    its tokenizer.json). A split that records none cannot be shown to agree, so it is refused
    beside others too."""
    def described(split: FlatTokensSplit) -> str:
        t = tokenizer_of(split)
        if t is None:
            return f"{split.url}:{split.split} records no tokenizer"
        return f"{split.url}:{split.split} was tokenized with {t.get('spec')} (sha256 {t['sha256']})"

    first = splits[0]
    for other in splits[1:]:
        a, b = tokenizer_of(first), tokenizer_of(other)
        if a is None or b is None or a["sha256"] != b["sha256"]:
            raise ValueError(f"the blend's splits disagree on their tokenizer: {described(first)}, "
                             f"{described(other)}; the same ids would mean different tokens. Pass "
                             f"allow_mixed_tokenizers=True if that is what you want")


class Blend:
    """Several splits blended by weight at training time (see the module's doc)."""

    def __init__(self, splits: Sequence[FlatTokensSplit], weights: Sequence[float], seed: int = 0, *,
                 allow_mixed_tokenizers: bool = False):
        self.splits = list(splits)
        if not self.splits:
            raise ValueError("a blend needs at least one split")
        if not allow_mixed_tokenizers:
            _check_one_tokenizer(self.splits)
        if len(weights) != len(self.splits):
            raise ValueError(f"{len(weights)} weights for {len(self.splits)} splits")
        values = []
        for i, w in enumerate(weights):
            try:
                v = float(w)
            except (TypeError, ValueError):
                raise TypeError(f"weights[{i}] must be a number, got {w!r}") from None
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"weights[{i}] must be a finite number > 0, got {w!r}")
            values.append(v)
        total = sum(values)
        if not math.isfinite(total):  # huge weights: scale them down first, or each would be v / inf = 0
            top = max(values)
            values = [v / top for v in values]
            total = sum(values)
        self.weights = [v / total for v in values]  # as Megatron normalises them
        self.seed = checked_count(seed, "seed", 0)
        if self.seed >= 1 << 64:
            raise ValueError(f"seed must be < 2**64, got {seed}")

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.url}:{s.split} {w:.3f}" for s, w in zip(self.splits, self.weights))
        return f"Blend({parts}; seed {self.seed})"

    def counts(self, positions: int) -> list[int]:
        """How many of the rule's first `positions` choices go to each split (batch k's rows
        are positions [k, k + batch_size) of them)."""
        choices = _Choices(self.weights)
        choices.advance(operator.index(positions))
        return choices.counts

    def packed_batches(self, length: int, batch_size: int, *, start_step: int = 0, rank: int = 0,
                       world_size: int = 1, segments: bool = False, sources: bool = False,
                       block_tokens: int = BLOCK_TOKENS, buffer_blocks: int = BUFFER_BLOCKS) -> Iterator:
        """Batches of the blend, endless: (inputs, targets), int32 of shape
        (batch_size / world_size, length).

        rank and world_size, segments, block_tokens and buffer_blocks as in
        FlatTokensSplit.packed_batches: global batch k does not depend on the world size, and
        host `rank` serves its rows [rank*B/w, (rank+1)*B/w), reading about 1/world_size of
        each split. Row j (lane j) at step k takes its window from the split Megatron's rule
        chooses at position k + j of its sequence, and from that split's own lane j: so every
        lane's windows, and every batch's rows, hold each split's share (see the module's doc).
        ``sources=True`` makes each batch a Batch whose `sources` holds, for every token, the
        index of the split it came from (in `splits`)."""
        length = window_length(length)
        batch_size = checked_count(batch_size, "batch_size")
        start_step = checked_count(start_step, "start_step", 0)
        lanes = host_rows(batch_size, rank, world_size)
        orders = self._orders(length, batch_size, block_tokens, buffer_blocks)
        if len(self.splits) >= 1 << 16 and sources:
            raise ValueError("sources are uint16: at most 65,535 splits")
        return self._batches(orders, length, lanes, start_step, segments, sources)

    def _orders(self, length: int, batch_size: int, block_tokens, buffer_blocks) -> list:
        """Each split's BatchOrder, one lane per row (ValueError for a split with too few windows)."""
        return [split._batch_order(length, batch_size, source_seed(self.seed, i), block_tokens, buffer_blocks)
                for i, split in enumerate(self.splits)]

    def _batches(self, orders, length: int, lanes: range, start_step: int, with_segments: bool,
                 with_sources: bool, every: int = 1) -> Iterator:
        """This host's batches (rows `lanes`): steps start_step, start_step + every, ... (a
        DataLoader worker serves every `every`-th step; the choices of the others are made, not
        their reads). Lane j's t-th window is position t + j of the choices; the lane's count of
        split i is the virtual step of split i's lane j it takes next."""
        n, rows = len(self.splits), len(lanes)
        choices = _Choices(self.weights)
        made = choices.advance(start_step + lanes.stop)  # the choices up to this host's last row of start_step
        counts = np.empty((rows, n), np.int64)  # lane's windows taken from each split before start_step
        for i in range(n):
            before = np.concatenate([[0], np.cumsum(made == i)])
            counts[:, i] = before[start_step + lanes.start:start_step + lanes.stop] - before[lanes.start:lanes.stop]
        made, base = made[start_step:], start_step  # made[p - base]: the choice at position p
        at = np.arange(rows)
        pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="flat-tokens-blend")
        try:
            streams = [[LaneStream(split, order, j, length, pool) for j in lanes]
                       for split, order in zip(self.splits, orders)]
            step = start_step
            while True:
                if step + lanes.stop - base > made.size:  # choices for the next 1024 steps
                    made, base = np.concatenate([made[step - base:], choices.advance(1024)]), step
                chosen = made[step + lanes.start - base:step + lanes.stop - base]
                if (step - start_step) % every == 0:
                    windows = np.empty((rows, length), np.uint32)
                    for row in range(rows):
                        i = int(chosen[row])
                        windows[row] = streams[i][row].windows(counts[row, i:i + 1])[0][0]
                    token_sources = np.repeat(chosen.astype(np.uint16)[:, None], length, axis=1) if with_sources \
                        else None
                    yield batch_of(windows, token_sources, with_segments)
                counts[at, chosen] += 1
                step += 1
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
