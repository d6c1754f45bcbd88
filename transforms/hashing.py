"""Seeded hashes of a document's place or content: every choice the job makes about a document
(which ones the tokenizer guard re-checks, its split, its place in the shuffle, its shard, a
mixture's extra copies) is one of these pure functions, so it is the same on any runner.
The central one is where each document goes: a seeded, uniform, reproducible permutation.

A document's position in the output is decided by a 64-bit hash of its *place* in the
input (its file's path relative to the common root of all input files, and the byte offset
of its line in the uncompressed file, or its row in a Parquet file) salted with the seed:
the same files give the same places however they were named on the command line. Sorting
by that hash is a uniformly random permutation that depends on nothing else: not on the
runner, the worker count, bundle sizes, or how files were split for reading. Identical
texts at different places get independent hashes, so duplicates are scattered.

Shards are contiguous *ranges* of the hash space, so sorting each shard and concatenating
shards in index order gives the same global order whatever the number of shards.
"""
import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)

# Purposes keep the order hash, the split hash and the sample hash independent of each other.
ORDER = "order"
SPLIT = "split"
SAMPLE = "sample"  # a mixture's extra copy of a document (transforms.read.mixture)


def file_salt(seed: int, purpose: str, place: str) -> np.uint64:
    """A 64-bit salt for one input file, from the seed, a purpose and the file's place name
    (transforms.read.inputs.place_name: its path relative to the inputs' common root)."""
    digest = hashlib.blake2b(f"{seed}\0{purpose}\0{place}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser: a bijection on uint64 whose outputs look independent."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MUL1
        z = (z ^ (z >> np.uint64(27))) * _MUL2
        return z ^ (z >> np.uint64(31))


def place_hashes(salt: np.uint64, offsets: np.ndarray) -> np.ndarray:
    """Hashes of the documents at byte `offsets` of one file: distinct offsets, distinct hashes."""
    return splitmix64(splitmix64(offsets) ^ salt)


def content_salt(seed: int, purpose: str) -> np.uint64:
    """A 64-bit salt for hashes of content digests (with --dedup exact), from the seed and a purpose."""
    digest = hashlib.blake2b(f"{seed}\0{purpose}\0content".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def content_hashes(salt: np.uint64, digests: np.ndarray) -> np.ndarray:
    """Hashes of documents identified by their 128-bit content digests ((n, 2) uint64): the
    same text gets the same hash wherever it was read, so all its copies meet."""
    return splitmix64(splitmix64(digests[:, 0] ^ salt) ^ digests[:, 1])


_COPY = np.uint64(0xD6E8FEB86659FD93)


def content_shards(digests: np.ndarray, seed: int, num_shards: int) -> np.ndarray:
    """The dedup shard of each text (its (n, 2) content digests): where all its copies meet."""
    return shard_of(content_hashes(content_salt(seed, ORDER), digests), num_shards)


def copy_hashes(first: np.ndarray, copy_index: np.ndarray) -> np.ndarray:
    """The order hash of copy k of a document whose first copy hashes to `first`: copy 0
    keeps it, every other copy gets an independent one (a mixture repeats documents)."""
    first = np.asarray(first, dtype=np.uint64)
    copy_index = np.asarray(copy_index, dtype=np.uint64)
    return np.where(copy_index == 0, first, splitmix64(first ^ splitmix64(copy_index ^ _COPY)))


def below_fraction(hashes: np.ndarray, fraction: float) -> np.ndarray:
    """True where a hash lies below `fraction` of the hash range (e.g. documents for validation)."""
    if fraction <= 0:
        return np.zeros(hashes.shape, bool)
    if fraction >= 1:
        return np.ones(hashes.shape, bool)
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return hashes < threshold


def shard_of(order_hashes: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard of each hash: shard i holds hashes in [i, i+1) * 2**64 / num_shards (about).

    Monotone in the hash, so shards are hash ranges and their concatenation is sorted."""
    if not 1 <= num_shards < 2**32:
        raise ValueError(f"num_shards must be in [1, 2**32), got {num_shards}")
    high = np.asarray(order_hashes, dtype=np.uint64) >> np.uint64(32)
    return ((high * np.uint64(num_shards)) >> np.uint64(32)).astype(np.int64)


def shuffled_order(order_hashes: np.ndarray, salts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Indices that sort documents by (hash, file salt, offset): a total, stable order.

    With --dedup exact the two tie-breakers are the halves of the content digest, distinct
    for distinct texts. Only the copies a mixture makes of one document tie, and they hold
    the same tokens, so their relative order cannot change a byte."""
    return np.lexsort((offsets, salts, order_hashes))


def rows_of(digests: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of the content digests `wanted` ((n, 2) uint64), its row in `digests` (distinct
    ones), or -1. Sorted by their first 64 bits unless already in digest order (a node
    table's are), then looked up by binary search; texts whose digests share those bits (a
    chance of about n**2 / 2**64) are told apart by the second. (Sorting the 128-bit rows as
    one structured value took 4x as long.)"""
    row = np.full(wanted.shape[0], -1, dtype=np.int64)
    if not digests.shape[0] or not wanted.shape[0]:
        return row
    first, second = digests[:, 0], digests[:, 1]
    order = None
    if not np.all((first[1:] > first[:-1]) | ((first[1:] == first[:-1]) & (second[1:] > second[:-1]))):
        order = np.lexsort((second, first))
        first, second = first[order], second[order]
    at = np.searchsorted(first, wanted[:, 0], side="left")
    end = np.searchsorted(first, wanted[:, 0], side="right")
    for step in range(int((end - at).max())):  # one step, but where first halves collide
        i = at + step
        open_ = (i < end) & (row < 0)
        open_[open_] = second[i[open_]] == wanted[open_, 1]
        row[open_] = i[open_]
    return row if order is None else np.where(row >= 0, order[np.maximum(row, 0)], -1)
