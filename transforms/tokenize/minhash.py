"""MinHash signatures (--dedup near): a document's shingles -> K small hashes, whose agreement
between two documents estimates the Jaccard similarity of their shingle sets. Computed where
the documents are tokenized, for a whole batch at once, and staged with the batch.

Shingles. `words` (the default): n consecutive words of the text, each as a 32-bit hash
(words.py says what a word is). `tokens`: n consecutive token ids, which depend on the
tokenizer (with `--tokenizer bytes` they are character n-grams). Documents with fewer
than n words (or tokens) have no shingle and no signature: only exact copies of them are
found (docs/design.md has the measurements that chose words and n = 5).

Signature. One-permutation hashing (Li, Owen and Zhang, NIPS 2012): each shingle gets one
32-bit hash; its high 16 bits pick one of K bins and each bin keeps the smallest low 16
bits among its shingles. So a document costs one hash per shingle, not K, and a batch is a
few passes of numpy over its shingles plus one scatter-minimum (`np.minimum.at`). Two
documents' similarity is estimated from the bins filled in either: the share of them that
hold the same value (standard deviation sqrt(J (1 - J) / m), m the bins filled in either,
at most K; for a document with fewer shingles than K this is its exact Jaccard similarity
up to hash collisions).

Bands. Locality-sensitive hashing: for banding, a bin that no shingle fell into (short
documents) borrows the value of the first filled bin in its own fixed pseudo-random order
of the bins (optimal densification, Shrivastava, ICML 2017), so that two documents agree on
any bin with probability J, independently; the bins are cut into `bands` bands of `rows`
bins, and each band is hashed to 64 bits with its index. Two documents share a band's hash with
probability J**rows, so they become a candidate pair with probability
1 - (1 - J**rows)**bands.

Every step is integer arithmetic on fixed constants: the same bytes on any machine, and
independent of --seed (so a run with a new seed reuses staged batches).
"""
import functools
from dataclasses import dataclass

import numpy as np

from transforms.tokenize.characters import BatchText
from transforms.tokenize.words import WORD_NORMALISATION, word_hashes

WORDS, TOKENS = "words", "tokens"
SHINGLES = (WORDS, TOKENS)
MAX_HASHES = 1 << 12  # bins are picked by 16 bits of the hash; signatures stay small
EMPTY = 0xFFFF  # a bin no shingle fell into (a bin whose smallest value is 0xFFFF keeps 0xFFFE)

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
_ROW_TRIES = 32  # densification's tries bin by bin, before the rest is found directly
_DENSIFY_ROWS = 4096  # signatures densified at once


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
        """What the signatures depend on (the bands only decide candidates); `words` names the
        word normalisation, so batches staged under another are not reused."""
        return {"shingle": self.shingle, "shingle_size": self.shingle_size, "hashes": self.hashes,
                "words": WORD_NORMALISATION}


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


def signatures(units: np.ndarray, per_doc: np.ndarray, n: int, k: int) -> np.ndarray:
    """(documents, k) uint16 one-permutation MinHash signatures of the n-grams of each
    document's units (word hashes or token ids, documents end to end, `per_doc` each); bins
    no n-gram fell into hold EMPTY (all of them, for a document with fewer than n units)."""
    docs = per_doc.size
    total = units.size - n + 1
    # Row `docs` of the bins takes the n-grams that cross from one document into the next.
    bins = np.full((docs + 1) * k, EMPTY, dtype=np.uint16)
    if total > 0:
        index_type = np.int32 if (docs + 1) * k < 1 << 31 else np.int64
        row = np.repeat(np.arange(0, docs * k, k, dtype=index_type), per_doc)[:total]
        ends = np.cumsum(per_doc)
        crossing = (ends - (n - 1))[:, None] + np.arange(n - 1)
        crossing = crossing[(crossing >= (ends - per_doc)[:, None]) & (crossing < total)]
        row[crossing] = docs * k
        x = np.empty(_BLOCK + n, dtype=np.uint32)
        h, step, index = np.empty(_BLOCK, np.uint32), np.empty(_BLOCK, np.uint32), np.empty(_BLOCK, index_type)
        value = np.empty(_BLOCK, np.uint16)
        for a in range(0, total, _BLOCK):
            m = min(_BLOCK, total - a)
            xs, hs, ss, ix, vs = x[:m + n - 1], h[:m], step[:m], index[:m], value[:m]
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
            np.copyto(vs, hs, casting="unsafe")
            np.minimum(vs, EMPTY - 1, out=vs)
            np.minimum.at(bins, ix, vs)
    return bins[:docs * k].reshape(docs, k)


def densified(signatures_: np.ndarray) -> np.ndarray:
    """Signatures whose empty bins take the value of a filled bin: empty bin i takes the first
    filled bin in its own fixed order of all bins (a pseudo-random permutation, the same for
    every document: optimal densification, Shrivastava, ICML 2017). Two documents then agree
    on any bin with probability J, independently of the other bins: what banding needs.
    (Borrowing from the next filled bin instead made a short text's bands depend on one
    shingle: on the benchmark corpus, 366,000 candidate pairs of median similarity 0.1 for
    49,000 texts.) Rows with no filled bin stay empty."""
    out = signatures_.copy()
    k = out.shape[1]
    order, rank = probe_order(k)
    # The first tries, empty bin by empty bin (most are filled after a few): each looks at the
    # next bin in its order and takes its value when that bin is filled. Only the bins still
    # empty are carried to the next try, so a try costs what is left, not whole rows (trying
    # whole rows at a time cost 0.69 s per 30,000 short documents, 5x this). Rows are taken
    # _DENSIFY_ROWS at a time: the positions of a block's empty bins fit 32 bits.
    # [try, bin]: from the bin to the one it looks at (a step added to its position)
    steps = np.ascontiguousarray(order.T[:_ROW_TRIES], dtype=np.int32) - np.arange(k, dtype=np.int32)
    power_of_two = k & (k - 1) == 0  # the bin of a position is then a mask of it, not a division
    left = []
    for lo in range(0, out.shape[0], _DENSIFY_ROWS):
        block, own = out[lo:lo + _DENSIFY_ROWS], signatures_[lo:lo + _DENSIFY_ROWS]
        empty = own == EMPTY
        empty &= ~empty.all(axis=1, keepdims=True)  # rows with no filled bin stay empty
        at = np.flatnonzero(empty).astype(np.int32)  # row * k + bin
        flat_own, flat_out = own.reshape(-1), block.reshape(-1)
        for attempt in range(steps.shape[0]):
            if at.size == 0:
                break
            # take, put and compress, not indexing: the positions are in range by construction,
            # and unchecked they cost two thirds (0.60 -> 0.40 s for 103k short documents).
            source = np.take(steps[attempt], at & np.int32(k - 1) if power_of_two else at % k, mode="clip")
            source += at
            donor = np.take(flat_own, source, mode="clip")
            np.put(flat_out, at, donor, mode="clip")  # an empty donor leaves the bin empty
            at = np.compress(donor == EMPTY, at)
        left.append(np.unique(at // k).astype(np.int64) + lo)
    rows = np.concatenate(left) if left else np.empty(0, dtype=np.int64)
    # Rows with alike numbers of filled bins together: each chunk's arrays are as wide as its
    # fullest row.
    rows = rows[np.argsort((signatures_[rows] != EMPTY).sum(axis=1), kind="stable")]
    for chunk in np.array_split(rows, max(1, rows.size // 256)):
        if chunk.size == 0:
            continue
        own = out[chunk]
        filled = signatures_[chunk] != EMPTY
        donors = np.argsort(~filled, axis=1, kind="stable")[:, :int(filled.sum(axis=1).max())]  # filled first
        missing = np.take_along_axis(~filled, donors, axis=1)
        at, empty_bin = np.nonzero(own == EMPTY)
        ranks = rank[empty_bin[:, None], donors[at]]  # where each filled bin is in the empty bin's order
        ranks[missing[at]] = rank.shape[1]
        own[at, empty_bin] = signatures_[chunk[at], donors[at, ranks.argmin(axis=1)]]
        out[chunk] = own
    return out


@functools.lru_cache(maxsize=8)
def probe_order(k: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, rank), each (k, k): order[i] is the order in which bin i looks at the bins (a
    fixed pseudo-random permutation), rank[i, j] the place of bin j in it."""
    x = np.arange(k, dtype=np.uint64)[:, None] * np.uint64(k) + np.arange(k, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(29)
    order = np.argsort(x, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(k)[None, :].repeat(k, axis=0), axis=1)
    return order, rank


def batch_signatures(settings: MinHashSettings, text: BatchText | None, ids: np.ndarray | None,
                     lengths: np.ndarray) -> np.ndarray:
    """The signatures of a batch's documents: from their texts (`text`, words) or their token
    ids (`ids`, documents end to end, `lengths` each). Row i is all EMPTY when document i has
    fewer than shingle_size units (see signed)."""
    if settings.shingle == WORDS:
        units, per_doc = word_hashes(text)
    else:
        units, per_doc = ids, lengths
    return signatures(units, per_doc, settings.shingle_size, settings.hashes)


def signed(signatures_: np.ndarray) -> np.ndarray:
    """Which documents have a signature: at least one shingle."""
    return (signatures_ != EMPTY).any(axis=1)


def band_hashes(signatures_: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) uint64: the hash of each band's `rows` consecutive bins of the
    densified signature, and its index."""
    return hash_bands(densified(signatures_), bands, rows)


def hash_bands(dense: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) uint64: the hash of each band's `rows` consecutive bins of already
    densified signatures (their first bands * rows bins), and its index."""
    n = dense.shape[0]
    values = dense[:, :bands * rows].reshape(n, bands, rows)
    # Row by row of the bands, over all documents' bands at once (a sum over the short last
    # axis of a (documents, bands, rows) array took 7x as long).
    h = np.zeros((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(rows):
            h += values[:, :, r] * _BAND[r]
        h += _BAND[MAX_HASHES + np.arange(bands)]
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return h


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bins where both rows hold the same value, bins filled in either row), per pair of
    rows: the one-permutation estimate of their Jaccard similarity is the ratio (Li, Owen
    and Zhang). A short document fills few bins, and then this is its exact Jaccard
    similarity, up to collisions of 24-bit hashes."""
    filled_a, filled_b = a != EMPTY, b != EMPTY
    return np.count_nonzero((a == b) & filled_a, axis=1), np.count_nonzero(filled_a | filled_b, axis=1)


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The one-permutation estimate of each pair of rows' Jaccard similarity."""
    same, filled = agreement(a, b)
    return same / np.maximum(filled, 1)


def jaccard(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """|a & b| / |a | b| of two exact shingle sets (transforms/tokenize/shingle_sets.py), NaN
    when either is unknown."""
    if a is None or b is None or a.size + b.size == 0:
        return float("nan")
    shared = np.intersect1d(a, b, assume_unique=True).size
    return shared / (a.size + b.size - shared)
