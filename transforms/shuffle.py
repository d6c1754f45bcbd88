"""ShuffleGlobally: tokenized batches -> shards of documents in their final, shuffled order.

Three steps, as in TFDS's Beam writer: key every document by a salted hash of its place
in the input (transforms.shuffle_keys), group documents by the hash range (shard) they
fall into, and sort each shard by hash. The shard sizes are known before the group-by,
so offsets can be laid out while the shuffle runs (see transforms.write_zarr).
"""
import apache_beam as beam
import numpy as np

from transforms import shuffle_keys as keys
from transforms import spill
from transforms.records import ShardPart, ShardSize, SortedShard, TokenizedBatch, encode_start_bits

SPLITS = ("train", "validation")
_SLICE_WHEN_AVERAGE_LENGTH = 64
_GATHER_BLOCK_TOKENS = 1 << 22


def gather_segments(tokens: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The documents of a flat token array, concatenated in `order`."""
    starts = np.cumsum(lengths) - lengths
    picked = lengths[order]
    total = int(picked.sum())
    if total == 0:
        return tokens[:0]
    if total >= _SLICE_WHEN_AVERAGE_LENGTH * order.size:
        # Long documents: one slice copy each beats building a per-token index.
        return np.concatenate([tokens[a:a + n] for a, n in zip(starts[order].tolist(), picked.tolist())])
    # Many short documents: a vectorised gather, in blocks of documents so that the int64
    # index (8 bytes per token, three times over) stays bounded. Output position j reads
    # tokens[start of its document + j - output start of its document].
    out = np.empty(total, dtype=tokens.dtype)
    out_starts = np.cumsum(picked) - picked
    step = max(1, _GATHER_BLOCK_TOKENS * order.size // total)
    for lo in range(0, order.size, step):
        hi = min(lo + step, order.size)
        n = picked[lo:hi]
        a, b = int(out_starts[lo]), int(out_starts[hi - 1] + n[-1])
        shift = np.repeat(starts[order[lo:hi]] - out_starts[lo:hi], n)
        out[a:b] = tokens[np.arange(a, b, dtype=np.int64) + shift]
    return out


def split_and_shard(batch: TokenizedBatch, seed: int, validation_fraction: float,
                    num_shards: dict[str, int]):
    """Yields ((split, shard), ShardPart) for each (split, shard) that the batch's documents hit."""
    order_salt = keys.file_salt(seed, keys.ORDER, batch.file_key)
    order_hashes = keys.place_hashes(order_salt, batch.offsets)
    if batch.split == "auto":
        split_hashes = keys.place_hashes(keys.file_salt(seed, keys.SPLIT, batch.file_key), batch.offsets)
        split_index = keys.below_fraction(split_hashes, validation_fraction).astype(np.int64)
    else:
        split_index = np.full(batch.offsets.shape, SPLITS.index(batch.split), dtype=np.int64)
    shards = np.where(split_index == 0,
                      keys.shard_of(order_hashes, num_shards["train"]),
                      keys.shard_of(order_hashes, num_shards["validation"]))
    group = (split_index << 32) | shards
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    for members in np.split(order, bounds):
        if members.size == 0:
            continue
        g = int(group[members[0]])
        yield (SPLITS[g >> 32], g & 0xFFFFFFFF), ShardPart.of(
            order_hashes=order_hashes[members],
            salts=np.full(members.size, order_salt, dtype=np.uint64),
            offsets=batch.offsets[members],
            lengths=batch.lengths[members],
            ids=gather_segments(batch.ids, batch.lengths, members),
        )


def size_of(keyed_part) -> ShardSize:
    (split, shard), part = keyed_part
    return ShardSize(split, shard, int(part.lengths.sum()), int(part.lengths.size), part.max_token_id)


def sort_shard(keyed_parts) -> SortedShard:
    """Sorts a shard's documents by (hash, salt, offset), gathering their ids from the parts,
    and encodes them with start bits."""
    (split, shard), parts = keyed_parts
    parts = list(parts)
    hashes = np.concatenate([p.order_hashes for p in parts])
    salts = np.concatenate([p.salts for p in parts])
    offsets = np.concatenate([p.offsets for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    order = keys.shuffled_order(hashes, salts, offsets)
    sorted_lengths = lengths[order]
    part_ids = [p.ids() for p in parts]
    if len(parts) == 1 or int(lengths.sum()) < _SLICE_WHEN_AVERAGE_LENGTH * lengths.size:
        ids = part_ids[0] if len(parts) == 1 else np.concatenate(part_ids)
        del part_ids
        ids = gather_segments(ids, lengths, order)
    else:
        # Long documents: slice them out of the parts directly (concatenating the parts first
        # would copy every id once more).
        part_of = np.repeat(np.arange(len(parts)), [p.lengths.size for p in parts])
        start_in_part = np.concatenate([np.cumsum(p.lengths) - p.lengths for p in parts])
        ids = np.concatenate([part_ids[i][a:a + n] for i, a, n in
                              zip(part_of[order].tolist(), start_in_part[order].tolist(), sorted_lengths.tolist())])
    return SortedShard(split, shard, sorted_lengths, encode_start_bits(ids, sorted_lengths))


class KeyByShard(beam.DoFn):
    """TokenizedBatch -> ((split, shard), ShardPart) for each shard its documents hit. With a
    spill directory (local runners) the parts' ids go to disk and only references to them
    travel on (transforms/spill.py)."""

    def __init__(self, seed: int, validation_fraction: float, num_shards: dict[str, int],
                 spill_dir: str | None = None):
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards
        self._spill_dir = spill_dir

    def process(self, batch: TokenizedBatch):
        parts = list(split_and_shard(batch, self._seed, self._validation_fraction, self._num_shards))
        if self._spill_dir and parts:
            parts = spill.spill_parts(self._spill_dir, batch.file_key, int(batch.offsets[0]), parts)
        yield from parts


class ShuffleGlobally(beam.PTransform):
    """TokenizedBatches -> (SortedShards, ShardSizes). Each split's shards, concatenated in
    shard order, are that split's documents in a seeded uniformly random order."""

    def __init__(self, seed: int, validation_fraction: float, num_shards: dict[str, int],
                 spill_dir: str | None = None):
        super().__init__()
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards
        self._spill_dir = spill_dir

    def expand(self, batches):
        parts = batches | "KeyByShard" >> beam.ParDo(KeyByShard(
            self._seed, self._validation_fraction, self._num_shards, self._spill_dir,
        )).with_output_types(tuple[tuple[str, int], ShardPart])
        sizes = parts | "MeasureParts" >> beam.Map(size_of)
        shards = (
            parts
            | "GroupByShard" >> beam.GroupByKey()
            | "SortShard" >> beam.Map(sort_shard).with_output_types(SortedShard)
        )
        return shards, sizes
