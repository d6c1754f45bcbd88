"""Where each shard's data lands, and who writes each zarr chunk: pure planning functions,
and LayOutShards, the global combine that applies them to the shard sizes.

Shards are written in parallel into one array per split. Two writers touching the same
zarr chunk race on read-modify-write and silently lose data (measured: ~99% of trials with
zarr 3), so every chunk has exactly one owner:

* a chunk lying wholly inside one shard's region is written by that shard, directly;
* a chunk that several regions share (or that only the end marker of `seq_starts` touches)
  is assembled from *fragments* by one merge step, which writes it once.

With zarr v3 sharding the unit of ownership is the shard object, not the inner chunk, so
callers pass the write-block size (chunk, or shard when sharded) as `block`.
"""
from dataclasses import dataclass

import apache_beam as beam

from transforms.records import SPLITS, ShardSize


@dataclass(frozen=True)
class RegionPlan:
    """How one writer puts the region [start, stop) of an array of `length` elements."""

    direct: tuple[int, int] | None  # block-aligned span of whole blocks this writer owns
    fragments: tuple[tuple[int, int, int], ...]  # (block index, start, stop) pieces to merge


def plan_region(start: int, stop: int, block: int, length: int) -> RegionPlan:
    """Splits [start, stop) into whole blocks it owns and fragments of blocks it shares.

    A block is whole when the region covers all of it; the last block of the array ends at
    `length`, so it is whole when the region reaches the end of the array."""
    if not 0 <= start <= stop <= length:
        raise ValueError(f"region [{start}, {stop}) is not inside [0, {length})")
    if block < 1:
        raise ValueError(f"block size must be positive, got {block}")
    if start == stop:
        return RegionPlan(None, ())
    first_boundary = -(-start // block) * block
    last_boundary = length if stop == length else (stop // block) * block
    if first_boundary < last_boundary:
        direct = (first_boundary, last_boundary)
        pieces = [(start, first_boundary), (last_boundary, stop)]
    else:
        direct = None
        pieces = [(start, stop)]
    fragments = []
    for a, b in pieces:
        while a < b:  # a piece outside the direct span crosses at most one block boundary
            end = min(b, (a // block + 1) * block)
            fragments.append((a // block, a, end))
            a = end
    return RegionPlan(direct, tuple(fragments))


def block_span(index: int, block: int, length: int) -> tuple[int, int]:
    """The element range [start, stop) of block `index` in an array of `length` elements."""
    return index * block, min((index + 1) * block, length)


def block_count(length: int, block: int) -> int:
    """How many blocks an array of `length` elements has."""
    return -(-length // block)


def prefix_offsets(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Exclusive prefix sums of (tokens, sequences) per shard, in shard order."""
    offsets, tokens, sequences = [], 0, 0
    for n_tokens, n_sequences in sizes:
        offsets.append((tokens, sequences))
        tokens += n_tokens
        sequences += n_sequences
    return offsets


@dataclass(frozen=True)
class SplitLayout:
    """One split's totals and where each non-empty shard starts, in tokens and sequences."""

    tokens: int
    sequences: int
    max_token_id: int  # -1 for an empty split
    shards: dict  # shard index -> (token offset, sequence offset, tokens, sequences)


def lay_out(sizes: dict, splits: tuple[str, ...]) -> dict[str, SplitLayout]:
    """Lays shards out end to end, in shard order. `sizes` maps (split, shard) to
    (tokens, sequences, max token id)."""
    layout = {}
    for split in splits:
        shards = sorted(shard for s, shard in sizes if s == split)
        counts = [sizes[split, shard][:2] for shard in shards]
        offsets = prefix_offsets(counts)
        layout[split] = SplitLayout(
            tokens=sum(t for t, _ in counts),
            sequences=sum(n for _, n in counts),
            max_token_id=max((sizes[split, shard][2] for shard in shards), default=-1),
            shards={shard: (*offset, *count) for shard, offset, count in zip(shards, offsets, counts)},
        )
    return layout


class LayOutShards(beam.CombineFn):
    """ShardSizes -> {split: SplitLayout}: the global prefix sum of shard sizes."""

    @staticmethod
    def _add(acc, key, tokens: int, sequences: int, max_id: int):
        t, n, m = acc.get(key, (0, 0, -1))
        acc[key] = (t + tokens, n + sequences, max(m, max_id))

    @staticmethod
    def no_shards() -> dict[str, SplitLayout]:
        """The layout of an input without documents: empty splits."""
        return lay_out({}, SPLITS)

    def create_accumulator(self):
        return {}

    def add_input(self, acc, size: ShardSize):
        self._add(acc, (size.split, size.shard), size.tokens, size.sequences, size.max_token_id)
        return acc

    def merge_accumulators(self, accs):
        merged = {}
        for acc in accs:
            for key, value in acc.items():
                self._add(merged, key, *value)
        return merged

    def extract_output(self, acc):
        return lay_out(acc, SPLITS)
