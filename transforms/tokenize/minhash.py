"""MinHash signatures (--dedup near): a document's shingles -> K small hashes, whose agreement
between two documents estimates the Jaccard similarity of their shingle sets. Computed where
the documents are tokenized, for a whole batch at once, and staged with the batch.

Shingles. `words` (the default): n consecutive words, a word being a run of ASCII letters,
digits and `_` or of any non-ASCII bytes (letters of every other script), ASCII lowercased;
everything else (spaces, punctuation) separates words, so a changed line break, a changed
case or an added comma changes no shingle. `tokens`: n consecutive token ids, which depend
on the tokenizer (with `--tokenizer bytes` they are character n-grams). Documents with fewer
than n words (or tokens) have no shingle and no signature: only exact copies of them are
found (docs/design.md has the measurements that chose words and n = 5).

Signature. One-permutation hashing (Li, Owen and Zhang, NIPS 2012): each shingle gets one
32-bit hash; its high 16 bits pick one of K bins and each bin keeps the smallest low 16
bits among its shingles. So a document costs one hash per shingle, not K, and a batch is a
few passes of numpy over its shingles plus one scatter-minimum (`np.minimum.at`). A bin
that no shingle fell into (short documents) borrows the value of the next filled bin to its
right, circularly, mixed with the distance (densification by rotation, Shrivastava and Li,
ICML 2014): two documents then agree on any bin with probability J, so the fraction of
equal bins estimates J with a standard deviation of sqrt(J (1 - J) / K).

Bands. Locality-sensitive hashing: bin values are cut into `bands` runs of `rows` bins;
each run is hashed to 64 bits with its band's index. Two documents share a band's hash with
probability J**rows, so they become a candidate pair with probability
1 - (1 - J**rows)**bands.

Every step is integer arithmetic on fixed constants: the same bytes on any machine, and
independent of --seed (so a run with a new seed reuses staged batches).
"""
from dataclasses import dataclass

import numpy as np

WORDS, TOKENS = "words", "tokens"
SHINGLES = (WORDS, TOKENS)
MAX_HASHES = 1 << 12  # bins are picked by 16 bits of the hash; signatures stay small
_EMPTY = np.uint32(1 << 16)  # above every 16-bit bin value: a bin no shingle fell into

# murmur3's 32-bit finaliser: spreads a sum of products over all 32 bits
_F1, _F2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


def _odd_table(salt: int, n: int) -> np.ndarray:
    """n fixed, odd, well-mixed 32-bit constants (SplitMix64 of salt, salt + 1, ...)."""
    x = (np.arange(n, dtype=np.uint64) + np.uint64(salt)) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(32)).astype(np.uint32) | np.uint32(1)


_GRAM = _odd_table(3 << 20, 64)  # position in the n-gram -> its multiplier
_BAND = _odd_table(4 << 20, 2 * MAX_HASHES).astype(np.uint64) << np.uint64(32) | _odd_table(5 << 20, 2 * MAX_HASHES)
_ROTATE = np.uint32(0x9E3779B1)


@dataclass(frozen=True)
class MinHashSettings:
    """What a signature depends on (part of a staged unit's key), and the band layout."""

    shingle: str = WORDS  # WORDS or TOKENS
    shingle_size: int = 5
    hashes: int = 256  # K, the bins of a signature
    bands: int = 32  # rows = hashes // bands bins per band

    @property
    def rows(self) -> int:
        return self.hashes // self.bands

    def signature_key(self) -> dict:
        """What the signatures depend on (the bands only decide candidates)."""
        return {"shingle": self.shingle, "shingle_size": self.shingle_size, "hashes": self.hashes}


def _fmix32(h: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """murmur3's finaliser, in place (`scratch`: an array of h's size and type)."""
    np.right_shift(h, 16, out=scratch)
    h ^= scratch
    h *= _F1
    np.right_shift(h, 13, out=scratch)
    h ^= scratch
    h *= _F2
    np.right_shift(h, 16, out=scratch)
    h ^= scratch
    return h


_BLOCK = 1 << 16  # n-grams hashed and binned at once: a few arrays of this size stay in cache
_ALL_BYTES = np.uint64(0xFFFFFFFFFFFFFFFF)
_MIX64 = np.uint64(0x9E3779B97F4A7C15)



def _word_byte_table() -> bytes:
    """For bytes.translate: word bytes to themselves (ASCII letters lowercased), others to 0."""
    table = bytearray(256)
    for c in range(256):
        if c >= 0x80 or chr(c).isalnum() or c == ord("_"):
            table[c] = ord(chr(c).lower()) if c < 0x80 else c
    return bytes(table)


_WORD_BYTES = _word_byte_table()


def word_hashes(encoded: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(uint32 hash of every word of the documents, in order; int64 words per document).

    A word's hash covers its length and its first, middle and last 8 bytes: every byte of a
    word up to 24 bytes long (all but a few of a text's words); longer runs (URLs, hashes)
    that differ only elsewhere count as the same word."""
    if not encoded:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    # One buffer, documents separated by a byte that is not a word byte: no word spans two.
    joined = b"\n".join(encoded).translate(_WORD_BYTES) + bytes(8)
    size = len(joined) - 8
    word = np.zeros(size + 2, dtype=bool)
    np.not_equal(np.frombuffer(joined, dtype=np.uint8, count=size), 0, out=word[1:-1])
    edges = np.flatnonzero(word[1:] != word[:-1])
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
    # Every byte position as the start of an (unaligned, little-endian) 8-byte value.
    at = np.ndarray(shape=(size + 1,), dtype="<u8", buffer=joined, strides=(1,))
    short = np.minimum(lengths, 8).astype(np.uint64)
    h = at[starts] & (_ALL_BYTES >> ((np.uint64(8) - short) * np.uint64(8)))
    long = np.flatnonzero(lengths > 8)
    with np.errstate(over="ignore"):
        if long.size:  # the last 8 bytes (overlapping the first), and the middle 8 past 16
            h[long] = h[long] * _MIX64 + at[starts[long] + lengths[long] - 8]
            longer = long[lengths[long] > 16]
            h[longer] = h[longer] * _MIX64 + at[starts[longer] + (lengths[longer] - 8) // 2]
        h ^= lengths.astype(np.uint64) << np.uint64(56)
        h *= _MIX64
        h ^= h >> np.uint64(29)
        h *= _MIX64
    doc_ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 1) - 1
    per_doc = np.diff(np.searchsorted(starts, doc_ends), prepend=0)
    return (h >> np.uint64(32)).astype(np.uint32), per_doc


def signatures(units: np.ndarray, per_doc: np.ndarray, n: int, k: int) -> np.ndarray:
    """(documents, k) uint16 one-permutation MinHash signatures of the n-grams of each
    document's units (word hashes or token ids, documents end to end, `per_doc` each),
    empty bins densified by rotation. A document with fewer than n units gets a row of
    zeros (never compared: signed)."""
    docs = per_doc.size
    total = units.size - n + 1
    # Row `docs` of the bins takes the n-grams that cross from one document into the next.
    bins = np.full((docs + 1) * k, _EMPTY, dtype=np.uint32)
    if total > 0:
        index_type = np.int32 if (docs + 1) * k < 1 << 31 else np.int64
        row = np.repeat(np.arange(0, docs * k, k, dtype=index_type), per_doc)[:total]
        ends = np.cumsum(per_doc)
        crossing = (ends - (n - 1))[:, None] + np.arange(n - 1)
        crossing = crossing[(crossing >= (ends - per_doc)[:, None]) & (crossing < total)]
        row[crossing] = docs * k
        x = np.empty(_BLOCK + n, dtype=np.uint32)
        h, step, index = np.empty(_BLOCK, np.uint32), np.empty(_BLOCK, np.uint32), np.empty(_BLOCK, index_type)
        for a in range(0, total, _BLOCK):
            m = min(_BLOCK, total - a)
            xs, hs, ss, ix = x[:m + n - 1], h[:m], step[:m], index[:m]
            xs[:] = units[a:a + m + n - 1]
            np.multiply(xs[:m], _GRAM[0], out=hs)
            for j in range(1, n):
                np.multiply(xs[j:j + m], _GRAM[j % _GRAM.size], out=ss)
                hs += ss
            _fmix32(hs, ss)
            # The high 16 bits pick the bin, the low 16 bits are the value.
            np.right_shift(hs, 16, out=ss)
            ss *= np.uint32(k)
            ss >>= np.uint32(16)
            np.add(row[a:a + m], ss, out=ix, casting="unsafe")
            hs &= np.uint32(0xFFFF)
            np.minimum.at(bins, ix, hs)
    bins = bins[:docs * k].reshape(docs, k)
    empty = bins == _EMPTY
    if empty.any():
        bins = _densified(bins, empty, k)
    bins[per_doc < n] = 0
    return bins.astype(np.uint16)


def _densified(bins: np.ndarray, empty: np.ndarray, k: int) -> np.ndarray:
    """Each empty bin takes the value of the next filled bin to its right (circularly), mixed
    with the distance to it; rows with no filled bin stay as they are."""
    rows = np.flatnonzero(empty.any(axis=1) & ~empty.all(axis=1))
    sub, gaps = bins[rows], empty[rows]
    # The index of the next filled bin at or after each bin, over the row written twice.
    where = np.where(np.concatenate([gaps, gaps], axis=1), 3 * k, np.arange(2 * k))
    nearest = np.minimum.accumulate(where[:, ::-1], axis=1)[:, ::-1][:, :k]
    distance = (nearest - np.arange(k)).astype(np.uint32)
    donor = np.take_along_axis(sub, nearest % k, axis=1)
    mixed = (donor + distance * _ROTATE) * _F1
    mixed ^= mixed >> np.uint32(15)
    sub = np.where(gaps, mixed & np.uint32(0xFFFF), sub)
    bins[rows] = sub
    return bins


def batch_signatures(settings: MinHashSettings, encoded: list[bytes] | None, ids: np.ndarray | None,
                     lengths: np.ndarray) -> np.ndarray:
    """The signatures of a batch's documents: from their UTF-8 texts (`encoded`, words) or
    their token ids (`ids`, documents end to end, `lengths` each). Row i is all zeros when
    document i has fewer than shingle_size units (see signed)."""
    if settings.shingle == WORDS:
        units, per_doc = word_hashes(encoded)
    else:
        units, per_doc = ids, lengths
    return signatures(units, per_doc, settings.shingle_size, settings.hashes)


def signed(signatures_: np.ndarray) -> np.ndarray:
    """Which rows are real signatures: a document with no shingle has a row of zeros, which a
    real signature is with probability 2**-(16 K)."""
    return signatures_.any(axis=1)


def band_hashes(signatures_: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) uint64: the hash of each band's `rows` bin values and its index."""
    n = signatures_.shape[0]
    values = signatures_[:, :bands * rows].reshape(n, bands, rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (values * _BAND[:rows]).sum(axis=2, dtype=np.uint64)
        h += _BAND[MAX_HASHES + np.arange(bands)]
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return h


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The fraction of equal bins of each pair of rows."""
    return (a == b).mean(axis=1) if a.size else np.empty(a.shape[0])
