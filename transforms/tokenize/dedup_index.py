"""The dedup index a dataset carries (--dedup exact or near), and --dedup_against: removing
from a new build every text that earlier datasets hold, reading only their indexes.

    in each dedup shard's group (dedup.drop_duplicates): the kept texts' digests and splits
    -> one index file per dedup shard, OUTPUT/dedup_index/exact-<shard>-of-<shards>.bin,
    written create-only once the output is this run's (the same bytes again, from a Beam
    retry or a resumed run, are found in place)

An index file is sealed as staged files are (flat_tokens/format/checksums.py: the payload, then
`FTc1` and its CRC-32C): the payload is `INDEX_MAGIC`, the document count n (uint64 LE),
the n 128-bit content digests sorted (16 bytes each, as dedup.content_digests) and the n
splits (1 byte each: 0 train, 1 validation). So 17 bytes per document, plus 20 per file.
The commit records the totals in stats["dedup_index"]; a reader of the index checks every
file's seal and that the documents add up.

With --dedup_against, each earlier dataset's index files are read (one element per file,
never all of them in one place), their digests keyed by *this* build's dedup shard (its seed
and shard count: the index does not depend on the earlier build's) and grouped with this
build's copies: memory per group grows with the texts of one shard, as the dedup shuffle's.

With --dedup near, a near file beside each exact file holds each text's near keys (band keys
and a sketch, 47 bytes: transforms/tokenize/near_index.py), and --dedup_against with --dedup
near also removes the new texts that are near-copies of earlier texts (near_index.py has
how they are found and verified), counted per earlier dataset as the exact copies are, and
also apart ("dedup_against_near"). An earlier dataset whose index has no near part (built
with --dedup exact), or whose signatures were made otherwise (shingles, their size, the bins),
is refused then: its near-copies could not be found (pipeline/earlier.py).

Which texts are indexed: every text the dedup step kept, before --min_tokens / --max_tokens
(a text dropped as too short is listed: a later build drops it too, as a copy of it).
"""
import posixpath
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
from fsspec.core import url_to_fs

from transforms import create_only, hashing
from flat_tokens.format.checksums import object_entry
from transforms.records import RecordCoder
from flat_tokens.format.index_files import (INDEX_DIRECTORY, INDEX_MAGIC, NEAR_BANDS, NEAR_MAGIC, MissingIndex,
                                             decode_index, digest_order, encode_index, encode_near, index_file_name,
                                             near_file_name, read_listed)
from transforms.tokenize.minhash import MinHashSettings
from transforms.tokenize.near_index import NEAR_AGAINST, ROWS, sketch_bits

INDEX_DOCUMENTS = "dedup_index_documents"  # count keys: documents indexed, bytes written, files written
INDEX_BYTES = "dedup_index_bytes"
INDEX_FILES = "dedup_index_files"
NEAR_BYTES = "dedup_index_near_bytes"  # --dedup near: the near files' bytes and count
NEAR_FILES = "dedup_index_near_files"
AGAINST = "dedup_against"  # count key prefix: texts removed as held by earlier dataset i ("dedup_against:i")


def index_stats(counts: dict) -> dict | None:
    """stats["dedup_index"]: what the commit found written (None when no index was written)."""
    if INDEX_FILES not in counts and INDEX_DOCUMENTS not in counts:
        return None
    documents = counts.get(INDEX_DOCUMENTS, 0)
    stats = {"format": INDEX_MAGIC.decode(), "directory": INDEX_DIRECTORY, "files": counts.get(INDEX_FILES, 0),
             "documents": documents, "bytes": counts.get(INDEX_BYTES, 0)}
    if NEAR_FILES in counts:
        stats["near"] = {"format": NEAR_MAGIC.decode(), "files": counts[NEAR_FILES], "bytes": counts.get(NEAR_BYTES, 0),
                         "band_keys": NEAR_BANDS, "rows_per_band": ROWS}
    return stats


def near_index_stats(index: dict, near_dedup: dict) -> None:
    """Records in stats["dedup_index"]["near"] what its keys depend on (the signatures' settings,
    from the provenance's near_dedup), which a later build checks against its own."""
    settings = MinHashSettings(near_dedup["shingle"], near_dedup["shingle_size"], near_dedup["hashes"])
    index["near"].update({"sketch_bits": sketch_bits(settings.hashes), "signature": settings.signature_key()})


def against_stats(counts: dict, datasets: list[str]) -> dict:
    """stats entries for --dedup_against: the texts removed, in total and per earlier dataset."""
    by_dataset = {url: counts.get(f"{AGAINST}:{i}", 0) for i, url in enumerate(datasets)}
    stats = {AGAINST: sum(by_dataset.values()), "dedup_against_by_dataset": by_dataset}
    if any(key.startswith(f"{NEAR_AGAINST}:") for key in counts) or NEAR_AGAINST in counts:  # --dedup near
        near = {url: counts.get(f"{NEAR_AGAINST}:{i}", 0) for i, url in enumerate(datasets)}
        stats.update({NEAR_AGAINST: sum(near.values()), "dedup_against_near_by_dataset": near})
    return stats


@dataclass
class IndexRows:
    """The texts one dedup shard kept, as its index files list them: digests and splits, and
    with --dedup near their near keys (near_index.near_keys; None without)."""

    digests: np.ndarray  # (n, 2) uint64
    splits: np.ndarray  # int8
    keys: np.ndarray | None = None  # (n, NEAR_BANDS) uint32
    sketches: np.ndarray | None = None  # (n, SKETCH_BYTES) uint8


@dataclass
class EarlierTexts:
    """Texts an earlier dataset holds that fall into one dedup shard of this build."""

    digests: np.ndarray  # (n, 2) uint64
    splits: np.ndarray  # int8
    dataset: int  # its place among --dedup_against's datasets


for _record in (EarlierTexts, IndexRows):
    beam.coders.registry.register_coder(_record, RecordCoder)


def read_earlier(item: tuple[int, str, tuple | None], seed: int, num_shards: int,
                 storage_options: dict | None = None):
    """(dataset number, index file URL, its manifest entry) -> (shard, EarlierTexts) for each
    of this build's dedup shards. A file that is not the one its dataset's manifest lists (moved
    to another shard's name, copied from another dataset) fails the build, naming it."""
    dataset, url, expected = item
    data = read_listed(url, expected, storage_options)
    if expected is not None and object_entry(data) != tuple(expected):
        raise MissingIndex(f"--dedup_against: {url} is not the file its dataset's manifest lists there (moved, "
                           f"copied from another dataset, or damaged); rebuild that dataset with --overwrite")
    digests, splits = decode_index(data, url)
    for shard in np.unique(shards := hashing.content_shards(digests, seed, num_shards)).tolist():
        chosen = shards == shard
        yield int(shard), EarlierTexts(digests[chosen], splits[chosen], dataset)


def held_earlier(digests: np.ndarray, earlier: list[EarlierTexts]) -> np.ndarray:
    """For texts (their digests): the first earlier dataset (its number) that holds each, or -1."""
    held = np.full(digests.shape[0], -1, dtype=np.int64)
    if not earlier or not digests.shape[0]:
        return held
    for texts in sorted(earlier, key=lambda t: t.dataset):
        found = (hashing.rows_of(texts.digests, digests) >= 0) & (held < 0)
        held[found] = texts.dataset
    return held


class WriteIndexShard(beam.DoFn):
    """IndexRows (one dedup shard's kept texts) -> its index file (and near file), created (or
    found: the same bytes) -> counts."""

    def __init__(self, url: str, seed: int, num_shards: int, storage_options: dict | None = None):
        self._url = url
        self._seed = seed
        self._shards = num_shards
        self._storage_options = storage_options

    def process(self, batch, created):
        if not batch.digests.shape[0]:
            return
        shard = int(hashing.content_shards(batch.digests[:1], self._seed, self._shards)[0])
        data = encode_index(batch.digests, batch.splits)
        fs, path = url_to_fs(self._url, **(self._storage_options or {}))
        directory = posixpath.join(path.rstrip("/"), INDEX_DIRECTORY)
        fs.makedirs(directory, exist_ok=True)
        counts = {INDEX_DOCUMENTS: int(batch.digests.shape[0]), INDEX_BYTES: len(data), INDEX_FILES: 1}
        if batch.keys is not None:  # in the exact file's order; written first: a commit needs both
            order = digest_order(batch.digests)
            near = encode_near(batch.keys[order], batch.sketches[order])
            create_only.put_new(fs, posixpath.join(directory, near_file_name(shard, self._shards)), near)
            counts.update({NEAR_BYTES: len(near), NEAR_FILES: 1})
        create_only.put_new(fs, posixpath.join(directory, index_file_name(shard, self._shards)), data)
        yield counts
