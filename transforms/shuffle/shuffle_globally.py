"""ShuffleGlobally: tokenized batches -> shards of documents in their final, shuffled order.

Three steps, as in TFDS's Beam writer: key every document by a salted hash of its place
in the input (transforms.hashing), group documents by the hash range (shard) they
fall into, and sort each shard by hash. The shard sizes are known before the group-by,
so offsets can be laid out while the shuffle runs (see transforms.write.chunk_writers).
"""
from collections.abc import Callable
from dataclasses import dataclass

import apache_beam as beam
import numpy as np

from transforms import hashing
from transforms.read import mixture
from transforms.local_files import LocalFile
from transforms.read.inputs import input_index, place_name
from transforms.records import SPLITS, DistinctBatch, EncodedTokens, ShardPart, ShardSize, SortedShard, TokenizedBatch
from transforms.segments import SLICE_WHEN_AVERAGE_LENGTH, gather_segments, groups_of, take_documents
from transforms.shuffle import spill
from transforms.shuffle.sources import document_sources
from transforms.write_behind import WritesBehindWithSpillDir

# Shards whose documents are at least this long on average are not gathered into one array
# here: the writer copies each chunk's documents straight from the parts as it encodes the
# chunk (records.EncodedTokens.gathered). That takes a Python step per document of a chunk,
# cheap only when a chunk holds few documents (256 of these in a 256Ki-token chunk).
GATHER_WHILE_WRITING_AVERAGE_LENGTH = 1024


@dataclass
class DocumentKeys:
    """Where the documents of one batch go, before any copies are made."""

    split: np.ndarray  # int64: 0 train, 1 validation
    order: np.ndarray  # uint64 order hash (of the first copy)
    ties: tuple[np.ndarray, np.ndarray]  # uint64 tie-breakers of the order (ShardPart.salts, .offsets)
    sources: np.ndarray  # int64 mixture source (0 without a mixture)
    sample: Callable[[], np.ndarray]  # () -> uint64 sample hashes (a mixture's extra copies)


def document_keys(batch: TokenizedBatch | DistinctBatch, seed: int, validation_fraction: float,
                  source_of_input: list[int] | None = None) -> DocumentKeys:
    """A TokenizedBatch's documents are keyed by their place; a DistinctBatch's (--dedup
    exact) by their content, their split decided already."""
    if isinstance(batch, DistinctBatch):
        return DocumentKeys(
            split=batch.splits.astype(np.int64),
            order=hashing.content_hashes(hashing.content_salt(seed, hashing.ORDER), batch.digests),
            ties=(batch.digests[:, 0], batch.digests[:, 1]),
            sources=batch.sources,
            sample=lambda: hashing.content_hashes(hashing.content_salt(seed, hashing.SAMPLE), batch.digests))
    place = place_name(batch.file_key)
    order_salt = hashing.file_salt(seed, hashing.ORDER, place)
    if batch.split == "auto":
        split_hashes = hashing.place_hashes(hashing.file_salt(seed, hashing.SPLIT, place), batch.offsets)
        split_index = hashing.below_fraction(split_hashes, validation_fraction).astype(np.int64)
    else:
        split_index = np.full(batch.offsets.shape, SPLITS.index(batch.split), dtype=np.int64)
    source = source_of_input[input_index(batch.file_key)] if source_of_input else 0
    return DocumentKeys(
        split=split_index,
        order=hashing.place_hashes(order_salt, batch.offsets),
        ties=(np.full(batch.offsets.shape, order_salt, dtype=np.uint64), batch.offsets),
        sources=np.full(batch.offsets.shape, source, dtype=np.int64),
        sample=lambda: hashing.place_hashes(hashing.file_salt(seed, hashing.SAMPLE, place), batch.offsets))


def copies_of(doc: DocumentKeys, sampling) -> np.ndarray:
    """How many times each document is written: validation documents once; a train
    document of source s `whole` times, plus once when its sample hash is below `threshold`."""
    if sampling is None:
        return np.ones(doc.split.shape, dtype=np.int64)
    whole = np.array([s.whole for s in sampling], dtype=np.int64)[doc.sources]
    threshold = np.array([s.threshold for s in sampling], dtype=np.uint64)[doc.sources]
    extra = doc.sample() < threshold
    return np.where(doc.split == 0, whole + extra, 1)


def split_and_shard(batch: TokenizedBatch | DistinctBatch, seed: int, validation_fraction: float,
                    num_shards: dict[str, int], sampling=None, source_of_input: list[int] | None = None,
                    spilled_to: LocalFile | None = None, record_sources: list[int] | None = None,
                    finished: frozenset = frozenset()):
    """Yields ((split, shard), ShardPart) for each (split, shard) that the batch's documents
    (and with a mixture's `sampling`, their copies: each with its own place) hit, except the
    `finished` ones (written by an earlier attempt of the same job: transforms/staging.py).

    Each part carries its documents' ids, or with `spilled_to` (the file holding the batch's
    ids: transforms.shuffle.spill) where each of its documents starts in that file; with
    `record_sources` (the recorded source of each input index), each document's source."""
    doc = document_keys(batch, seed, validation_fraction, source_of_input)
    recorded = None if record_sources is None else document_sources(batch, record_sources)
    starts = np.cumsum(batch.lengths) - batch.lengths
    if spilled_to is not None and batch.lengths.size:
        # Where documents start in the file travels with every part through the runner's
        # group-by (which holds it several times over): 4 bytes per document, not 8.
        starts = starts.astype(np.uint32 if batch.ids.size < 1 << 32 else np.int64)
        # Every document has a token (empty ones were dropped), so each reduces over its own.
        document_max = np.maximum.reduceat(batch.ids, starts)
    if sampling is None:
        of_copy, order_hashes = None, doc.order
    else:
        counts = copies_of(doc, sampling)
        of_copy = np.repeat(np.arange(counts.size), counts)
        copy_index = np.arange(of_copy.size) - np.repeat(np.cumsum(counts) - counts, counts)
        order_hashes = hashing.copy_hashes(doc.order[of_copy], copy_index)
    split_index = doc.split if of_copy is None else doc.split[of_copy]
    shards = np.where(split_index == 0,
                      hashing.shard_of(order_hashes, num_shards["train"]),
                      hashing.shard_of(order_hashes, num_shards["validation"]))
    for g, members in groups_of((split_index << 32) | shards):
        g = int(g)
        if (SPLITS[g >> 32], g & 0xFFFFFFFF) in finished:
            continue
        docs = members if of_copy is None else of_copy[members]
        placed = dict(order_hashes=order_hashes[members], salts=doc.ties[0][docs], offsets=doc.ties[1][docs],
                      lengths=batch.lengths[docs], sources=None if recorded is None else recorded[docs])
        if spilled_to is None:
            part = ShardPart.of(**placed, ids=take_documents(batch.ids, starts[docs], batch.lengths[docs]))
        else:
            part = ShardPart(**placed, ids_dtype=batch.ids.dtype.name, max_token_id=int(document_max[docs].max()),
                             spilled=spill.SpilledDocuments(spilled_to, starts[docs]))
        yield (SPLITS[g >> 32], g & 0xFFFFFFFF), part


def count_available(batch, seed: int, validation_fraction: float, source_of_input: list[int]) -> dict:
    """Per source: the distinct train documents and their tokens (tokens_s of the multipliers)."""
    doc = document_keys(batch, seed, validation_fraction, source_of_input)
    train = doc.split == 0
    return _per_source(doc.sources[train], batch.lengths[train],
                       mixture.TRAIN_DOCUMENTS, mixture.TOKENS_AVAILABLE, source_of_input)


def count_copies(batch, seed: int, validation_fraction: float, source_of_input: list[int], sampling) -> dict:
    """Per source: the sequences and tokens each split receives, copies counted. Counted apart
    from the shuffle, so that the commit can check the two against each other."""
    doc = document_keys(batch, seed, validation_fraction, source_of_input)
    counts = copies_of(doc, sampling)
    out = {}
    for index, split in enumerate(SPLITS):
        mine = doc.split == index
        out.update(_per_source(np.repeat(doc.sources[mine], counts[mine]), np.repeat(batch.lengths[mine], counts[mine]),
                               f"{split}_sequences", f"{split}_tokens", source_of_input))
    return out


def _per_source(sources: np.ndarray, lengths: np.ndarray, n_name: str, tokens_name: str,
                source_of_input: list[int]) -> dict:
    size = max(source_of_input) + 1
    n = np.bincount(sources, minlength=size)
    tokens = np.zeros(size, dtype=np.int64)
    np.add.at(tokens, sources, lengths)
    out = {}
    for s in range(size):
        out[mixture.source_key(s, n_name)] = int(n[s])
        out[mixture.source_key(s, tokens_name)] = int(tokens[s])
    return out


def size_of(keyed_part) -> ShardSize:
    (split, shard), part = keyed_part
    return ShardSize(split, shard, int(part.lengths.sum()), int(part.lengths.size), part.max_token_id)


def sort_shard(keyed_parts) -> SortedShard:
    """Sorts a shard's documents by (hash, salt, offset), gathering their ids from the parts;
    the writer encodes them with start bits, chunk by chunk."""
    (split, shard), parts = keyed_parts
    parts = list(parts)
    hashes = np.concatenate([p.order_hashes for p in parts])
    salts = np.concatenate([p.salts for p in parts])
    offsets = np.concatenate([p.offsets for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    order = hashing.shuffled_order(hashes, salts, offsets)
    sorted_lengths = lengths[order]
    # Each part's ids are copied out of its spill file one part at a time, so that only one
    # file is mapped (and counted in the resident size) at once.
    part_ids = [p.ids() for p in parts]
    sources = None if parts[0].sources is None else np.concatenate([p.sources for p in parts])[order]
    average = int(lengths.sum()) / max(lengths.size, 1)
    if average < SLICE_WHEN_AVERAGE_LENGTH:
        ids = part_ids[0] if len(parts) == 1 else np.concatenate(part_ids)
        del part_ids
        return SortedShard(split, shard, sorted_lengths,
                           EncodedTokens.of(gather_segments(ids, lengths, order), sorted_lengths), sources)
    part_of = np.repeat(np.arange(len(parts)), [p.lengths.size for p in parts])
    start_in_part = np.concatenate([np.cumsum(p.lengths) - p.lengths for p in parts])
    if average >= GATHER_WHILE_WRITING_AVERAGE_LENGTH:
        # The writer copies each chunk's documents out of the parts as it encodes the chunk.
        return SortedShard(split, shard, sorted_lengths,
                           EncodedTokens.gathered(part_ids, part_of[order], start_in_part[order], sorted_lengths),
                           sources)
    # Longer documents: slice them out of the parts directly (concatenating the parts first
    # would copy every id once more).
    ids = np.concatenate([part_ids[i][a:a + n] for i, a, n in
                          zip(part_of[order].tolist(), start_in_part[order].tolist(), sorted_lengths.tolist())])
    return SortedShard(split, shard, sorted_lengths, EncodedTokens.of(ids, sorted_lengths), sources)


class KeyByShard(WritesBehindWithSpillDir, beam.DoFn):
    """TokenizedBatch (or DistinctBatch) -> ((split, shard), ShardPart) for each shard its
    documents (or, with a mixture's `sampling` side input, their copies) hit. With a spill
    directory (local runners) the parts' ids go to disk and only references to them travel
    on (transforms/shuffle/spill.py); a batch staged on local disk (`ids_file`) is referred to
    where it lies.

    A batch's ids are written on a thread while the next batch is read and tokenized
    (transforms/write_behind.py); its parts go on at once, naming the file."""

    WRITER_NAME = "flat-tokens-spill"

    def __init__(self, seed: int, validation_fraction: float, num_shards: dict[str, int],
                 spill_dir: str | None = None, record_sources: list[int] | None = None,
                 finished: frozenset = frozenset()):
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards
        self._spill_dir = spill_dir
        self._record_sources = record_sources
        self._finished = finished

    def process(self, batch, sampling=None, source_of_input=None):
        spilled_to = None
        if self._spill_dir and batch.lengths.size:
            spilled_to = getattr(batch, "ids_file", None)
            if spilled_to is None:
                spilled_to = spill.batch_file(self._spill_dir, *batch_identity(batch), batch.ids)
                self._writer.submit(spill.spill_ids, spilled_to, batch.ids)
        yield from split_and_shard(batch, self._seed, self._validation_fraction, self._num_shards,
                                   sampling, source_of_input, spilled_to, self._record_sources, self._finished)


def batch_identity(batch) -> tuple[str, int]:
    """What names a batch's spill file: its input and first document's offset, or for a
    DistinctBatch (whose texts are all different) its first content digest."""
    if isinstance(batch, DistinctBatch):
        return f"distinct-{int(batch.digests[0, 0]):016x}{int(batch.digests[0, 1]):016x}", 0
    return batch.file_key, int(batch.offsets[0])


class ShuffleGlobally(beam.PTransform):
    """TokenizedBatches (or DistinctBatches) -> (SortedShards, ShardSizes). Each split's
    shards, concatenated in shard order, are that split's documents in a seeded uniformly
    random order. With a mixture, `sampling` (a side input: transforms.read.mixture.sampling_plan)
    says how many copies of each train document to make. The `finished` shards (written by an
    earlier attempt of the same job, transforms/staging.py) get no parts: their sizes come
    from their records (transforms/write/finished.py)."""

    def __init__(self, seed: int, validation_fraction: float, num_shards: dict[str, int],
                 sampling=None, source_of_input: list[int] | None = None, spill_dir: str | None = None,
                 record_sources: list[int] | None = None, finished: frozenset = frozenset()):
        super().__init__()
        self._record_sources = record_sources
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards
        self._mixing = {} if sampling is None else {"sampling": sampling, "source_of_input": source_of_input}
        self._spill_dir = spill_dir
        self._finished = finished

    def expand(self, batches):
        parts = batches | "KeyByShard" >> beam.ParDo(KeyByShard(
            self._seed, self._validation_fraction, self._num_shards, self._spill_dir, self._record_sources,
            self._finished), **self._mixing,
        ).with_output_types(tuple[tuple[str, int], ShardPart])
        sizes = parts | "MeasureParts" >> beam.Map(size_of)
        shards = (
            parts
            | "GroupByShard" >> beam.GroupByKey()
            | "SortShard" >> beam.Map(sort_shard).with_output_types(SortedShard)
        )
        return shards, sizes
