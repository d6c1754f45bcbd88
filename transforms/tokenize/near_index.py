"""The near part of the dedup index (--dedup near), and --dedup_against's near-copies: what a
dataset keeps of each text's MinHash signature so that a later build can find its own
near-copies of that text, and the matching of a new build's texts against it.

    a new build's node tables (near_dedup.py: each distinct signed text and its signature)
    -> each text's near keys (band keys and sketch): the index's near file of its dedup
    shard (dedup_index.WriteIndexShard), and, with --dedup_against, one entry per band key,
    keyed by the key's band shard
    + the earlier datasets' near files (one element per file), their entries keyed alike
    -> in each band shard, the new texts that share a band key with an earlier text, whose
    sketches agree enough: (dedup shard, HeldNear), joined where the new text's copies are
    grouped (dedup.drop_duplicates) and into its near-duplicate cluster (near_dedup.py)

Memory: a band shard's group holds the entries of its keys only (an earlier dataset's texts
times NEAR_BANDS, over the shard count), as the exact join holds one dedup shard's digests.

Near keys (index_files.NEAR_BYTES_PER_DOCUMENT = 47 bytes a text, with the exact file's 17 the
64 bytes a document that issue 41 set as the target; the signature itself is 512):
- NEAR_BANDS = 8 band keys of ROWS = 4 bins each (bins 0-31 of the densified signature,
  minhash.hash_bands), 32 bits of each band's hash (0 is kept for "no signature": a text
  with fewer words than the shingle size, matched exactly only). Two texts of Jaccard
  similarity J share a band with probability J**4, so at least one of the 8 with
  1 - (1 - J**4)**8: 0.985 at J = 0.8, 0.9997 at J = 0.9 (the dataset's own 32 bands of 8
  bins, at 4 bytes a band, would be 128 bytes). Two unrelated texts share one of 8 keys of
  32 bits with probability 2e-9: such false candidates are dropped by the sketch.
- A sketch: the lowest bit of each of the next SKETCH_BITS = 120 bins (bins 32-151; with
  --near_hashes 64, the 32 bins 32-63): one-bit minwise hashing (Li and König, WWW 2010).
  Two texts agree on a bin's bit with probability p = J + (1 - J) / 2, so 2 p^ - 1 estimates
  J, standard deviation 2 sqrt(p (1 - p) / m) for m bits: 0.055 at J = 0.8, m = 120 (the full
  signature's estimate inside a build: 0.025).

Verification (as close to near_dedup.verify_pairs as the index allows): a new text and an
earlier text sharing a band key are a near-copy when their sketches agree on at least
needed_bits(threshold, m) of the m bits: the estimate at least the threshold less z standard
deviations of it at the threshold (z = near_dedup.VERIFY_Z, 2, as inside a build). With
threshold 0.8 and 120 bits that is 102 of 120 agreeing bits. With the band keys' chance of
making the pair a candidate, the binomial law gives: a near-copy of J = 0.80 is found with
probability 0.96, of J = 0.85 0.996, of J >= 0.9 more than 0.999; a text of J = 0.7 is removed
with probability 0.50, of J = 0.6 0.07.
The sketch is coarser than the signature, and its margin is spent on recall: a near-copy
kept breaks the guarantee across datasets, a text of J 0.7 removed is a near-copy by a
looser measure.
A new text's band key shared by more than HUB_PAIRS earlier texts is compared with the
HUB_PAIRS first of them (by dataset, then digest): the pairs grow linearly with a band's
members, as inside a build (near_dedup.HUBS).
"""
import math
from dataclasses import dataclass, fields

import apache_beam as beam
import numpy as np

from transforms import hashing
from flat_tokens.format.checksums import object_entry
from transforms.records import RecordCoder
from transforms.segments import groups_of
from transforms.tokenize import minhash
from flat_tokens.format.index_files import (NEAR_BANDS, SKETCH_BYTES, MissingIndex, decode_index, decode_near,
                                             digest_order, read_listed)

ROWS = 4  # bins a band key covers
BAND_BINS = NEAR_BANDS * ROWS  # the bins the band keys cover; the sketch's follow
SKETCH_BITS = 8 * SKETCH_BYTES
HUB_PAIRS = 64
NEAR_AGAINST = "dedup_against_near"  # count key prefix: of dedup_against:i, the near-copies ("dedup_against_near:i")
_ROW_BITS = 32  # a node id is dedup shard << 32 | row (near_dedup.py)
KEYS, BANDS = "near_keys", "near_bands"  # near_dedup.key_by_band's tagged outputs


def sketch_bits(hashes: int) -> int:
    """The sketch's bits for signatures of `hashes` bins (--near_hashes)."""
    return min(SKETCH_BITS, hashes - BAND_BINS)


def near_keys(signatures: np.ndarray, dense: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """((n, NEAR_BANDS) uint32 band keys, (n, SKETCH_BYTES) uint8 sketches) of signatures (n, K)
    (`dense`: them densified, when the caller has it); a row without a signature has keys 0
    and an empty sketch."""
    n, k = signatures.shape
    signed = minhash.signed(signatures)
    dense = minhash.densified(signatures) if dense is None else dense
    keys = (minhash.hash_bands(dense, NEAR_BANDS, ROWS) >> np.uint64(32)).astype(np.uint32)
    keys[keys == 0] = 1
    keys[~signed] = 0
    bits = np.zeros((n, SKETCH_BITS), dtype=np.uint8)
    m = sketch_bits(k)
    bits[:, :m] = dense[:, BAND_BINS:BAND_BINS + m] & 1
    bits[~signed] = 0
    return keys, np.packbits(bits, axis=1)


def needed_bits(threshold: float, hashes: int, z: float) -> int:
    """The agreeing sketch bits a near-copy needs (of SKETCH_BITS; the m = sketch_bits(hashes)
    compared, and the unused ones, 0 in every sketch): its estimate 2 same / m - 1 at least the
    threshold less z standard deviations of the estimate at the threshold (rounded to 6
    decimals first: an integer test, the same on every machine)."""
    m = sketch_bits(hashes)
    p = (1 + threshold) / 2
    margin = round(z * 2 * math.sqrt(p * (1 - p) / m), 6)
    return math.ceil(round(m * (1 + threshold - margin) / 2, 6)) + SKETCH_BITS - m


@dataclass
class NearKeys:
    """The near keys of the signed distinct texts of one dedup shard (its node table's)."""

    digests: np.ndarray  # (n, 2) uint64
    keys: np.ndarray  # (n, NEAR_BANDS) uint32
    sketches: np.ndarray  # (n, SKETCH_BYTES) uint8

    def of(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, sketches) of texts (their digests), in that order; zeros for a text not here
        (no signature)."""
        keys = np.zeros((digests.shape[0], NEAR_BANDS), dtype=np.uint32)
        sketches = np.zeros((digests.shape[0], SKETCH_BYTES), dtype=np.uint8)
        row = hashing.rows_of(self.digests, digests)
        found = row >= 0
        keys[found] = self.keys[row[found]]
        sketches[found] = self.sketches[row[found]]
        return keys, sketches

    @staticmethod
    def none() -> "NearKeys":
        return NearKeys(np.empty((0, 2), np.uint64), np.empty((0, NEAR_BANDS), np.uint32),
                        np.empty((0, SKETCH_BYTES), np.uint8))

    @staticmethod
    def concatenate(parts: list["NearKeys"]) -> "NearKeys":
        return NearKeys(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(NearKeys)))


@dataclass
class BandEntries:
    """Band keys of one band shard, one entry per (text, band): a new build's texts (dataset -1,
    their node ids) or an earlier dataset's (its number; ids 0)."""

    keys: np.ndarray  # uint32
    ids: np.ndarray  # uint64
    digests: np.ndarray  # (m, 2) uint64
    sketches: np.ndarray  # (m, SKETCH_BYTES) uint8
    datasets: np.ndarray  # int32

    def take(self, index) -> "BandEntries":
        return BandEntries(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concatenate(parts: list["BandEntries"]) -> "BandEntries":
        return BandEntries(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(BandEntries)))


@dataclass
class HeldNear:
    """New texts of one dedup shard that are near-copies of texts earlier datasets hold."""

    ids: np.ndarray  # uint64 node ids
    digests: np.ndarray  # (n, 2) uint64
    datasets: np.ndarray  # int32: the earlier dataset's number among --dedup_against's
    earlier: np.ndarray  # (n, 2) uint64: the digest of the earlier text
    similarity: np.ndarray  # float32: the sketches' estimate

    def take(self, index) -> "HeldNear":
        return HeldNear(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concatenate(parts: list["HeldNear"]) -> "HeldNear":
        return HeldNear(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(HeldNear)))


for _record in (NearKeys, BandEntries, HeldNear):
    beam.coders.registry.register_coder(_record, RecordCoder)


def band_entries(keys, ids, digests, sketches, datasets, num_shards: int):
    """(band shard, BandEntries) for every non-zero band key of the texts."""
    flat = keys.ravel()
    entry_of = np.repeat(np.arange(keys.shape[0]), keys.shape[1])
    chosen = flat != 0
    flat, entry_of = flat[chosen], entry_of[chosen]
    for shard, members in groups_of(hashing.shard_of(flat.astype(np.uint64) << np.uint64(32), num_shards)):
        at = entry_of[members]
        yield int(shard), BandEntries(flat[members], ids[at], digests[at], sketches[at], datasets[at])


def table_keys(shard: int, table, dense: np.ndarray, num_shards: int, against: bool):
    """A dedup shard's node table (near_dedup.Nodes) and its densified signatures -> (KEYS,
    (dedup shard, NearKeys)) for the index; with --dedup_against, (BANDS, (band shard,
    BandEntries)) of the new texts."""
    keys, sketches = near_keys(table.signatures, dense)
    yield KEYS, (shard, NearKeys(table.digests, keys, sketches))
    if against:
        for keyed in band_entries(keys, table.ids, table.digests, sketches,
                                  np.full(keys.shape[0], -1, dtype=np.int32), num_shards):
            yield BANDS, keyed


def read_earlier_near(item: tuple, num_shards: int, storage_options: dict | None = None):
    """(dataset number, exact file URL, its manifest entry, near file URL, its manifest entry)
    -> (band shard, BandEntries) of its texts. A file that is not the one its dataset's
    manifest lists fails the build, naming it."""
    dataset, exact_url, exact_entry, near_url, near_entry = item
    data = {}
    for url, expected in ((exact_url, exact_entry), (near_url, near_entry)):
        data[url] = read_listed(url, expected, storage_options)
        if expected is not None and object_entry(data[url]) != tuple(expected):
            raise MissingIndex(f"--dedup_against: {url} is not the file its dataset's manifest lists there (moved, "
                               f"copied from another dataset, or damaged); rebuild that dataset with --overwrite")
    digests, _ = decode_index(data[exact_url], exact_url)
    keys, sketches = decode_near(data[near_url], near_url)
    if keys.shape[0] != digests.shape[0]:
        raise MissingIndex(f"--dedup_against: {near_url} lists {keys.shape[0]} texts, {exact_url} "
                           f"{digests.shape[0]}: damaged; rebuild that dataset with --overwrite")
    digests = digests[digest_order(digests)]  # as written: the near file's rows are in this order
    yield from band_entries(keys, np.zeros(keys.shape[0], dtype=np.uint64), digests, sketches,
                            np.full(keys.shape[0], dataset, dtype=np.int32), num_shards)


def match_earlier(keyed, needed: int, m: int):
    """(band shard, {new, earlier}: BandEntries) -> (dedup shard, HeldNear) for the new texts
    whose sketch agrees on `needed` bits or more with an earlier text's that shares one of
    their band keys (each pair once per band key it shares; first_held picks one), with
    the estimate 2 same / m - 1 of their similarity (m: the sketch's bits compared)."""
    _, grouped = keyed
    new, old = list(grouped["new"]), list(grouped["earlier"])
    if not new or not old:
        return
    new, old = BandEntries.concatenate(new), BandEntries.concatenate(old)
    old_digests = old.digests.astype(np.uint64)
    old = old.take(np.lexsort((old_digests[:, 1], old_digests[:, 0], old.datasets, old.keys)))
    lo = np.searchsorted(old.keys, new.keys, side="left")
    count = np.minimum(np.searchsorted(old.keys, new.keys, side="right") - lo, HUB_PAIRS)
    if not count.any():
        return
    first = np.cumsum(count) - count
    mine = np.repeat(np.arange(new.keys.size), count)
    theirs = np.repeat(lo, count) + np.arange(int(count.sum())) - np.repeat(first, count)
    same = SKETCH_BITS - np.unpackbits(new.sketches[mine] ^ old.sketches[theirs], axis=1).sum(axis=1, dtype=np.int64)
    near = same >= needed
    mine, theirs, same = mine[near], theirs[near], same[near]
    if not mine.size:
        return
    ids = new.ids[mine]
    # The unused (padding) bits of short sketches are 0 in both: they agree, and are not counted.
    similarity = np.clip(2 * (same - (SKETCH_BITS - m)) / m - 1, 0, 1).astype(np.float32)
    held = HeldNear(ids, new.digests[mine], old.datasets[theirs], old.digests[theirs], similarity)
    for shard, members in groups_of((ids >> np.uint64(_ROW_BITS)).astype(np.int64)):
        yield int(shard), held.take(members)


def first_held(parts: list[HeldNear]) -> HeldNear:
    """One match per new text, sorted by digest: the earliest dataset's, then the most
    similar, then the smallest earlier digest (a choice that does not depend on the runner)."""
    held = HeldNear.concatenate(parts)
    d, e = held.digests.astype(np.uint64), held.earlier.astype(np.uint64)
    order = np.lexsort((e[:, 1], e[:, 0], -held.similarity, held.datasets, d[:, 1], d[:, 0]))
    held = held.take(order)
    first = np.ones(order.size, dtype=bool)
    first[1:] = np.any(held.digests[1:] != held.digests[:-1], axis=1)
    return held.take(first)
