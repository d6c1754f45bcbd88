"""DropDuplicates (--dedup exact, and near): tokenized batches -> each distinct text once, with its split.

    key every document by the shard of a hash of its content -> group by shard
    -> in each shard, sort by content and keep one copy of each text -> decide its split

A document's identity is a 128-bit blake2b digest of its UTF-8 text. A 64-bit hash would
not do as an identity: among 1e9 documents, two different texts share a 64-bit hash with
probability about n**2 / 2**65 = 2.7%; with 128 bits it is about 1.5e-21.

All copies of a text hash alike, so they meet in one shard whatever file, range or source
they were read from. The copy kept is the one at the smallest place (input index on the
command line or in the mixture, path, byte offset): deterministic on any runner, and it
only decides which source the text is credited to. The split does not depend on which copy
was kept: a text goes to validation when any of its copies was read from a validation
input or, for copies read from inputs split by --validation_fraction, when a seeded hash of
its *content* says so (the same answer for every copy). So no text is ever in both splits.
"""
import hashlib
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from transforms import hashing
from transforms.read import mixture
from transforms.read.inputs import input_index
from transforms.records import SPLITS, DedupPart, DistinctBatch, TokenizedBatch, narrowest_ids
from transforms.segments import gather_segments, groups_of
from transforms.tokenize import dedup_index, dedup_report, near_index
from transforms.tokenize.near_dedup import FindNearDuplicates

COUNTS = "counts"
REPORT = "report"  # --dedup_report: keyed ReportRows ...
KEPT_PLACES = "kept_places"  # ... and KeptPlaces
INDEX = "index"  # the dedup index's rows: dedup_index.IndexRows
NEAR_DUPLICATES = "near_duplicates"  # the count of texts removed as near-copies (--dedup near)
_AUTO = 2  # a vote that the content hash decides


def content_digests(texts: list[str]) -> np.ndarray:
    """(n, 2) uint64: the 128-bit blake2b digest of each text's UTF-8 bytes."""
    return digests_of([t.encode("utf-8") for t in texts])


def digests_of(encoded: list[bytes]) -> np.ndarray:
    """(n, 2) uint64: the 128-bit blake2b digest of each of `encoded`."""
    joined = b"".join(hashlib.blake2b(t, digest_size=16).digest() for t in encoded)
    return np.frombuffer(joined, dtype="<u8").astype(np.uint64).reshape(-1, 2)


def place_order(file_key: str) -> tuple[int, str]:
    return input_index(file_key), file_key.split(":", 1)[1]


def key_by_content(batch: TokenizedBatch, seed: int, num_shards: int):
    """Yields (shard, DedupPart) for each dedup shard that the batch's documents hit."""
    starts = None
    if batch.ids_file is not None:  # 4 bytes a document where they fit, as ShardPart's
        starts = (np.cumsum(batch.lengths) - batch.lengths).astype(np.uint32 if batch.ids.size < 1 << 32 else np.int64)
    for shard, members in groups_of(hashing.content_shards(batch.digests, seed, num_shards)):
        keys = (batch.file_key, batch.split, batch.offsets[members], batch.digests[members], batch.lengths[members])
        if starts is not None:  # a local staged batch: its parts name the file, not the ids
            yield int(shard), DedupPart.in_file(*keys, batch.ids_file, batch.ids, starts[members])
        else:
            yield int(shard), DedupPart.of(*keys, gather_segments(batch.ids, batch.lengths, members))


def drop_duplicates(keyed_parts, seed: int, validation_fraction: float, source_of_input: list[int] | None,
                    report_shards: int | None = None, shingles=None):
    """(shard, DedupParts) -> one DistinctBatch of the shard's distinct texts, and (tagged
    `counts`) the copies removed, in total and per source of the removed copy.

    With --dedup_against, (shard, {parts, earlier, ...}): a kept text that an earlier dataset
    holds (dedup_index.held_earlier) is removed too, counted per earlier dataset.

    With --dedup near, (shard, {parts, decisions, near_keys}): the texts that
    FindNearDuplicates found to be near-copies of another are removed too (counted per source
    of their kept copy), and each kept text of a cluster gets its cluster's split; with
    --dedup_against too, {.., held_near}: a kept text that is a near-copy of an earlier
    dataset's (near_index.HeldNear) is removed, counted per earlier dataset.

    Tagged `index`: the kept texts' dedup_index.IndexRows (with their near keys under near).

    With `report_shards` (--dedup_report: the dedup shard count), tagged `report`: the rows of
    the removed copies (dedup_report.removal_rows) and the places of the kept texts that near
    decisions may name, keyed by dedup shard; with `shingles` (shingle_sets.ExactShingles:
    --dedup_report with --dedup near) both carry their texts' shingle sets, for the exact
    similarity of each near-copy to its kept text."""
    _, grouped = keyed_parts
    decisions = earlier = near_keys = held_near = None
    if isinstance(grouped, dict):
        parts = list(grouped["parts"])
        decisions = list(grouped["decisions"]) if "decisions" in grouped else None
        earlier = list(grouped["earlier"]) if "earlier" in grouped else None
        near_keys = list(grouped["near_keys"]) if "near_keys" in grouped else None
        held_near = list(grouped["held_near"]) if "held_near" in grouped else None
    else:
        parts = list(grouped)
    if not parts:
        return
    sizes = [p.lengths.size for p in parts]
    digests = np.concatenate([p.digests for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    offsets = np.concatenate([p.offsets for p in parts])
    # A copy's place is (its file's rank among the shard's files, its offset): a total order
    # that does not depend on the order in which the parts arrive.
    rank = {key: i for i, key in enumerate(sorted({p.file_key for p in parts}, key=place_order))}
    file_rank = np.repeat(np.array([rank[p.file_key] for p in parts], dtype=np.int64), sizes)

    order = np.lexsort((offsets, file_rank, digests[:, 1], digests[:, 0]))
    sorted_digests = digests[order]
    first = np.ones(order.size, bool)
    first[1:] = np.any(sorted_digests[1:] != sorted_digests[:-1], axis=1)
    starts = np.flatnonzero(first)
    kept, removed = order[starts], order[~first]

    votes = np.repeat(np.array([_vote(p.split) for p in parts], dtype=np.int8), sizes)
    auto = votes == _AUTO
    if auto.any():
        split_hashes = hashing.content_hashes(hashing.content_salt(seed, hashing.SPLIT), digests[auto])
        votes[auto] = hashing.below_fraction(split_hashes, validation_fraction)
    splits = np.maximum.reduceat(votes[order], starts)  # validation when any copy says so

    if source_of_input is None:
        sources = np.zeros(order.size, dtype=np.int64)
    else:
        sources = np.repeat(np.array([source_of_input[input_index(p.file_key)] for p in parts], dtype=np.int64),
                            sizes)
    counts = {"duplicates": int(removed.size)}
    near = np.zeros(kept.size, dtype=bool)
    near_shingles = None
    if decisions is not None:
        near, cluster_split, kept_digests, similarity = _near_decided(digests[kept], decisions)
        if report_shards is not None:
            keys = np.repeat(np.array([p.file_key for p in parts], dtype=object), sizes)
            places = kept[(cluster_split >= 0) & ~near]
            place_shingles = None
            if shingles is not None:
                near_shingles = np.full(kept.size, None, dtype=object)
                near_shingles[near] = _shingle_sets(shingles, parts, sizes, lengths, digests, kept[near])
                place_shingles = _shingle_sets(shingles, parts, sizes, lengths, digests, places)
            for keyed in dedup_report.kept_places(keys, offsets, digests, places, seed, report_shards,
                                                  place_shingles):
                yield beam.pvalue.TaggedOutput(KEPT_PLACES, keyed)
        splits = np.where(cluster_split >= 0, cluster_split, splits)
        counts[NEAR_DUPLICATES] = int(np.count_nonzero(near))
        if source_of_input is not None:
            for source, n in enumerate(np.bincount(sources[kept[near]], minlength=max(source_of_input) + 1).tolist()):
                counts[mixture.source_key(source, mixture.NEAR_DUPLICATES)] = n
    held = held_kept = held_similarity = None
    if earlier is not None:  # --dedup_against: a text an earlier dataset holds is removed, whatever its split
        held = dedup_index.held_earlier(digests[kept], earlier)
        held[near] = -1  # removed already, as a near-copy
        held_kept, held_similarity = digests[kept], np.ones(kept.size, dtype=np.float32)
    if held_near:  # ... and, with --dedup near, a near-copy of a text it holds (an exact copy first)
        found = near_index.first_held(held_near)
        at = _locate_unsorted(digests[kept], found.digests)
        chosen = (held[at] < 0) & ~near[at]
        at, found = at[chosen], found.take(chosen)
        held[at] = found.datasets
        held_kept, held_similarity = held_kept.copy(), held_similarity.copy()
        held_kept[at], held_similarity[at] = found.earlier, found.similarity
        for dataset, n in zip(*np.unique(found.datasets, return_counts=True)):
            counts[f"{near_index.NEAR_AGAINST}:{int(dataset)}"] = int(n)
    if report_shards is not None:
        keys = np.repeat(np.array([p.file_key for p in parts], dtype=object), sizes)
        if decisions is None:
            kept_digests, similarity = digests[kept], np.ones(kept.size, dtype=np.float32)
        for keyed in dedup_report.removal_rows(keys, offsets, digests, order, starts, near, kept_digests, similarity,
                                               seed, report_shards, held, held_kept, held_similarity,
                                               near_shingles):
            yield beam.pvalue.TaggedOutput(REPORT, keyed)
    if held is not None:
        for dataset, n in zip(*np.unique(held[held >= 0], return_counts=True)):
            counts[f"{dedup_index.AGAINST}:{int(dataset)}"] = int(n)
        if source_of_input is not None:  # credited to the source of the text's kept copy, as near-copies are
            for source, n in enumerate(np.bincount(sources[kept[held >= 0]],
                                                   minlength=max(source_of_input) + 1).tolist()):
                counts[mixture.source_key(source, mixture.DEDUP_AGAINST)] = n
        near = near | (held >= 0)
    if decisions is not None or earlier is not None:
        kept, splits = kept[~near], splits[~near]
    yield DistinctBatch(digests=digests[kept], splits=splits.astype(np.int8), sources=sources[kept],
                        lengths=lengths[kept], ids=narrowest_ids(kept_documents(parts, sizes, lengths, kept)))
    near_rows = (None, None)
    if near_keys is not None:  # --dedup near: a shard without signed texts has no keys (zeros)
        near_rows = near_index.NearKeys.concatenate(near_keys or [near_index.NearKeys.none()]).of(digests[kept])
    yield beam.pvalue.TaggedOutput(INDEX, dedup_index.IndexRows(digests[kept], splits.astype(np.int8), *near_rows))
    if source_of_input is not None:
        for source, n in enumerate(np.bincount(sources[removed], minlength=max(source_of_input) + 1).tolist()):
            counts[mixture.source_key(source, mixture.DUPLICATES)] = n
    yield beam.pvalue.TaggedOutput(COUNTS, counts)


def _shingle_sets(shingles, parts, sizes: list[int], lengths: np.ndarray, digests: np.ndarray,
                  documents: np.ndarray) -> np.ndarray:
    """The shingle sets (object array) of `documents` (indices into the parts' documents)."""
    if documents.size == 0:
        return np.empty(0, dtype=object)
    return shingles.sets(kept_documents(parts, sizes, lengths, documents), lengths[documents], digests[documents])


def _near_decided(digests: np.ndarray, decisions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For distinct texts (their digests): (removed as a near-copy, the split of its cluster or -1
    for a text that has no near-copy, the digest of the text kept for it (its own when none),
    their estimated similarity)."""
    near = np.zeros(digests.shape[0], dtype=bool)
    split = np.full(digests.shape[0], -1, dtype=np.int8)
    kept = digests.copy()
    similarity = np.ones(digests.shape[0], dtype=np.float32)
    if not decisions:
        return near, split, kept, similarity
    decided = np.concatenate([d.digests for d in decisions])
    # Both sides sorted by digest: the decided texts are among the shard's distinct texts.
    mine = np.lexsort((digests[:, 1], digests[:, 0]))
    theirs = np.lexsort((decided[:, 1], decided[:, 0]))
    at = mine[_locate(digests[mine], decided[theirs])]
    near[at] = np.concatenate([d.removed for d in decisions])[theirs]
    split[at] = np.concatenate([d.splits for d in decisions])[theirs]
    kept[at] = np.concatenate([d.kept for d in decisions])[theirs]
    similarity[at] = np.concatenate([d.similarity for d in decisions])[theirs]
    return near, split, kept, similarity


def _locate_unsorted(haystack: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """Positions in `haystack` ((n, 2) uint64 rows, distinct) of each of `needles` (all in it)."""
    order = np.lexsort((haystack[:, 1], haystack[:, 0]))
    wanted = np.lexsort((needles[:, 1], needles[:, 0]))
    at = np.empty(needles.shape[0], dtype=np.int64)
    at[wanted] = order[_locate(haystack[order], np.ascontiguousarray(needles[wanted]))]
    return at


def _locate(haystack: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """Positions in `haystack` ((n, 2) uint64 rows, sorted) of each of `needles` (sorted, all in it)."""
    keys = haystack.view([("hi", "<u8"), ("lo", "<u8")]).ravel() if haystack.size else haystack
    wanted = needles.view([("hi", "<u8"), ("lo", "<u8")]).ravel()
    at = np.searchsorted(keys, wanted)
    if at.size and (at.max() >= haystack.shape[0] or not np.array_equal(haystack[at], needles)):
        raise RuntimeError("near-duplicate decisions name a text that its dedup shard does not hold")
    return at


def kept_documents(parts, sizes: list[int], lengths: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The ids of documents `kept` (indices into the parts' documents, end to end), in that
    order. Only the kept copies are copied out of each part (its file, or its packed ids)."""
    first = np.cumsum(sizes) - sizes
    part_of = np.searchsorted(first, kept, side="right") - 1
    pieces, grouped = [], []
    for part, chosen in groups_of(part_of):
        pieces.append(parts[part].documents(kept[chosen] - first[part]))
        grouped.append(chosen)
    if not pieces:
        return np.empty(0, dtype=np.uint16)
    grouped = np.concatenate(grouped)  # the output position of each document, as the pieces hold them
    back = np.empty_like(grouped)
    back[grouped] = np.arange(grouped.size)
    return gather_segments(np.concatenate(pieces), lengths[kept][grouped], back)


def _vote(split: str) -> int:
    return _AUTO if split == "auto" else SPLITS.index(split)


class Deduplicated(NamedTuple):
    batches: beam.PCollection  # DistinctBatches
    counts: beam.PCollection  # count dicts
    report: dict | None = None  # --dedup_report: {rows: keyed ReportRows, kept: keyed KeptPlaces}
    index: beam.PCollection | None = None  # the dedup index's rows: dedup_index.IndexRows


class DropDuplicates(beam.PTransform):
    """TokenizedBatches with content digests -> (DistinctBatches, count dicts: the removed copies).

    With `near` (--dedup near: (MinHashSettings, threshold)) and batches carrying signatures,
    FindNearDuplicates decides, before the copies are grouped, which texts are near-copies
    of another; they are dropped with the copies, in the same group (a decision is keyed by
    the dedup shard of its text), so the corpus's tokens cross the runner once, as with
    --dedup exact alone."""

    def __init__(self, seed: int, validation_fraction: float, num_shards: int,
                 source_of_input: list[int] | None = None, near: tuple | None = None, spill_dir: str | None = None,
                 report: bool = False, earlier=None, earlier_near=None, shingles=None):
        super().__init__()
        self._shingles = shingles  # with report and near: shingle_sets.ExactShingles
        self._earlier = earlier  # --dedup_against: (shard, EarlierTexts) (dedup_index.read_earlier)
        # ... and with --dedup near, (band shard, BandEntries) (near_index.read_earlier_near)
        self._earlier_near = earlier_near
        self._report = report
        self._spill_dir = spill_dir
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards
        self._source_of_input = source_of_input
        self._near = near

    def expand(self, batches):
        parts = batches | "KeyByContent" >> beam.FlatMap(key_by_content, self._seed, self._num_shards) \
            .with_output_types(tuple[int, DedupPart])
        counted = []
        joined = {"parts": parts}
        if self._near is not None:
            settings, threshold = self._near
            found = batches | "FindNearDuplicates" >> FindNearDuplicates(
                settings, threshold, self._seed, self._validation_fraction, self._num_shards, self._spill_dir,
                earlier=self._earlier_near)
            counted.append(found.counts)
            joined["decisions"] = found.decisions
            joined["near_keys"] = found.keys
            if found.held is not None:
                joined["held_near"] = found.held
        if self._earlier is not None:
            joined["earlier"] = self._earlier
        if len(joined) == 1:
            grouped = parts | "GroupByContent" >> beam.GroupByKey()
        else:
            grouped = joined | "GroupByContent" >> beam.CoGroupByKey()
        distinct = grouped | "KeepOneCopy" >> beam.FlatMap(
            drop_duplicates, self._seed, self._validation_fraction, self._source_of_input,
            self._num_shards if self._report else None, self._shingles if self._report else None) \
            .with_outputs(COUNTS, REPORT, KEPT_PLACES, INDEX, main="batches")
        counts = distinct[COUNTS]
        if counted:
            counts = (counts, *counted) | "DedupCounts" >> beam.Flatten()
        report = {"rows": distinct[REPORT], "kept": distinct[KEPT_PLACES]} if self._report else None
        return Deduplicated(distinct.batches, counts, report, distinct[INDEX])
