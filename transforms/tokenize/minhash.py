"""MinHash signatures (--dedup near): a document's shingles -> K small hashes, whose agreement
between two documents estimates the Jaccard similarity of their shingle sets. Computed where
the documents are tokenized, for a whole batch at once, and staged with the batch.

Shingles. `words` (the default): n consecutive words of the text normalised (normalised_words):
Unicode NFKC, then case folding (str.casefold: every script's case, ß -> ss), then NFKD with
the combining marks dropped (accents: é -> e, ё -> е, й -> и), and a word is a run of word
characters (letters, digits, `_`: Python's `\\w`); everything else (spaces, punctuation of any
script) separates words, so a changed line break, a changed case or accent or an added comma
changes no shingle. Numbers are not folded (a changed price or version is a change). ASCII
texts (most) take a fast path that gives the same words: ASCII lowercased, the rest split. `tokens`: n consecutive token ids, which depend
on the tokenizer (with `--tokenizer bytes` they are character n-grams). Documents with fewer
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
import unicodedata
from dataclasses import dataclass

import numpy as np

from transforms.tokenize.code_points import LazyCodePointTable

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
_MIX64 = np.uint64(0x9E3779B97F4A7C15)



def _word_byte_table() -> bytes:
    """For bytes.translate: word bytes to themselves (ASCII letters lowercased), others to 0."""
    table = bytearray(256)
    for c in range(256):
        if c >= 0x80 or chr(c).isalnum() or c == ord("_"):
            table[c] = ord(chr(c).lower()) if c < 0x80 else c
    return bytes(table)


_WORD_BYTES = _word_byte_table()
_FIRST_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


WORD_NORMALISATION = "nfkc-casefold-nfkd-nomarks"  # staged with signatures: what a word is


WORD, MARK, SEPARATOR = 0, 1, 2  # what a code point is to the words (kind_of)


def kind_of(c: int) -> int:
    """WORD (letters, digits, `_`: str.isalnum, Python's `\\w`), MARK (a combining mark,
    categories Mn, Mc, Me: dropped) or SEPARATOR (everything else) for code point c. Planes 0
    to 3 and 14 hold every character; planes 4 to 13 hold none yet and 15 to 16 are private
    use: separators."""
    if not (c < 0x40000 or 0xE0000 <= c < 0xE1000):
        return SEPARATOR
    ch = chr(c)
    if ch.isalnum() or ch == "_":
        return WORD
    return MARK if unicodedata.category(ch).startswith("M") else SEPARATOR


def _kinds(points: np.ndarray) -> np.ndarray:
    return np.fromiter(map(kind_of, points.tolist()), dtype=np.uint8, count=points.size)


KINDS = LazyCodePointTable(np.uint8, _kinds, unknown=255)  # kind_of each code point, as met


def folded(text: str) -> str:
    """NFKC, case folding, NFKD: a text's characters as words compare them."""
    return unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())


@functools.lru_cache(maxsize=1)
def _composes_backward() -> np.ndarray:
    """bool per code point: may compose with the character before it in NFKC (the second of a
    canonical decomposition's pair, or a Hangul vowel or trailing consonant jamo). Canonical
    pairs all lie below U+20000 (those above are single ideographs)."""
    table = np.zeros(0x110000, dtype=bool)
    for c in range(0x20000):
        parts = unicodedata.decomposition(chr(c)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            table[int(parts[1], 16)] = True
    table[0x1161:0x1176] = table[0x11A8:0x11C3] = True
    return table


_UNSAFE = -1  # a _FOLDED entry: a code point whose text is normalised as a whole


def _folded_entries(points: np.ndarray) -> np.ndarray:
    """_FOLDED's entries for `points`: _UNSAFE, or where the code point's words (folded, marks
    dropped, separators made spaces) lie in _FOLD_POOL: offset << 8 | length."""
    backward = _composes_backward()
    entries = np.empty(points.size, dtype=np.int64)
    for i, c in enumerate(points.tolist()):
        ch = chr(c)
        alone = unicodedata.normalize("NFKD", ch)
        out = folded(ch)
        # A text of such characters only is normalised as the concatenation of theirs: none
        # composes with the one before it (so NFKC composes within each one's NFKD only), and
        # each one's NFKD and folded form start with a starter (combining class 0), so no
        # canonical reordering crosses from one character's into the next's. Case folding is
        # code point by code point.
        if (unicodedata.combining(ch) or backward[c] or unicodedata.combining(alone[0]) or backward[ord(alone[0])]
                or unicodedata.combining(out[0])):
            entries[i] = _UNSAFE
            continue
        words = [32 if kind == SEPARATOR else p for p, kind in ((ord(x), kind_of(ord(x))) for x in out)
                 if kind != MARK]
        entries[i] = len(_FOLD_POOL) << 8 | len(words)
        _FOLD_POOL.extend(words)
    return entries


_FOLD_POOL: list[int] = []  # the code points of every _FOLDED entry's words, end to end
_FOLDED = LazyCodePointTable(np.int64, _folded_entries, unknown=-2)
_NOT_ONE = 0xFFFFFFFF  # a _FOLDED_ONE entry: not one word character or space for one code point


def _folded_one(points: np.ndarray) -> np.ndarray:
    entries = _FOLDED.values(points)
    pool = np.array(_FOLD_POOL, dtype=np.uint32)
    one = (entries != _UNSAFE) & (entries & 0xFF == 1)
    if not one.any():
        return np.full(points.size, _NOT_ONE, dtype=np.uint32)
    return np.where(one, pool[np.where(one, entries >> 8, 0)], _NOT_ONE).astype(np.uint32)


_FOLDED_ONE = LazyCodePointTable(np.uint32, _folded_one, unknown=0xFFFFFFFE)  # most code points: the one they become


def _normalised_by_table(texts: list[str]) -> tuple[np.ndarray, list[str]]:
    """(which of `texts` (none empty) were normalised, their words) from each code point's
    own: the texts made only of code points whose words do not depend on their neighbours
    (_folded_entries); the others are left to the Unicode calls. The same words as
    normalised_words' whole-text definition, at a gather per code point (the C calls ran at
    4-10 MB/s on real German, Russian and Japanese text: NFKC and NFKD normalise a text
    whole as soon as one character is not in normal form). A text whose every code point
    becomes one character (most: é becomes e, ё е, ｶ カ) is one gather; the others (ß
    becomes ss, a mark nothing) gather each code point's run of characters."""
    sizes = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.cumsum(sizes) - sizes
    points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4")
    one = _FOLDED_ONE.values(points)
    not_one = one == _NOT_ONE
    simple = np.add.reduceat(not_one.view(np.uint8), starts, dtype=np.int64) == 0
    words: list[str | None] = [None] * len(texts)
    if simple.any():
        text = np.where(not_one, np.uint32(32), one).astype("<u4").tobytes().decode("utf-32-le")
        for j, a, b in zip(np.flatnonzero(simple).tolist(), starts[simple].tolist(), (starts + sizes)[simple].tolist()):
            words[j] = text[a:b]
    rest = np.flatnonzero(~simple)
    safe = simple.copy()
    if rest.size:
        entries = _FOLDED.values(points[np.repeat(~simple, sizes)])
        sizes = sizes[rest]
        starts = np.cumsum(sizes) - sizes
        safe[rest] = np.minimum.reduceat(entries, starts) != _UNSAFE
        lengths = np.where(entries == _UNSAFE, 0, entries & 0xFF)
        total = int(lengths.sum())
        at = np.repeat((entries >> 8) - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)
        text = np.array(_FOLD_POOL, dtype="<u4")[at].tobytes().decode("utf-32-le")
        ends = np.cumsum(np.add.reduceat(lengths, starts))
        for j, a, b in zip(rest.tolist(), np.append(0, ends[:-1]).tolist(), ends.tolist()):
            if safe[j]:
                words[j] = text[a:b]
    return safe, [w for w in words if w is not None]


def normalised_words(encoded: list[bytes]) -> list[bytes]:
    """`encoded` (UTF-8 texts) normalised for words: NFKC, case folding, NFKD without combining
    marks, every other non-word character a space. ASCII texts stay as they are: the word
    byte table lowercases and splits them alike, much faster. Most others (all but those with
    a combining mark or a character that composes with the one before it) are mapped code
    point by code point (_normalised_by_table); the rest take the Unicode steps, C calls
    per text, and the marks and separators go in one numpy pass over their code points (a
    regex over them ran at 5 MB/s)."""
    out = list(encoded)
    others = [i for i, e in enumerate(encoded) if not e.isascii()]
    if not others:
        return out
    texts = [encoded[i].decode("utf-8") for i in others]
    safe, words = _normalised_by_table(texts)
    for i, w in zip(np.asarray(others)[safe].tolist(), words):
        out[i] = w.encode("utf-8")
    others = np.asarray(others)[~safe].tolist()
    if not others:
        return out
    folded_texts = [folded(texts[j]) for j in np.flatnonzero(~safe).tolist()]
    sizes = np.fromiter(map(len, folded_texts), dtype=np.int64, count=len(folded_texts))
    points = np.frombuffer("".join(folded_texts).encode("utf-32-le"), dtype="<u4")
    kinds = KINDS.values(points)
    kept = kinds != MARK
    # Code points kept per text (a non-ASCII text has one or more, so no run of reduceat is empty).
    kept_sizes = np.add.reduceat(kept.astype(np.int64), np.cumsum(sizes) - sizes)
    words = np.where(kinds == SEPARATOR, np.uint32(32), points)[kept].astype("<u4")
    text = words.tobytes().decode("utf-32-le")
    ends = np.cumsum(kept_sizes)
    for i, start, end in zip(others, (ends - kept_sizes).tolist(), ends.tolist()):
        out[i] = text[start:end].encode("utf-8")
    return out


def word_hashes(encoded: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(uint32 hash of every word of the documents, in order; int64 words per document).

    A word's hash covers its length and its first, middle and last 8 bytes: every byte of a
    word up to 24 bytes long (all but a few of a text's words); longer runs (URLs, hashes)
    that differ only elsewhere count as the same word."""
    if not encoded:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    encoded = normalised_words(encoded)
    # One buffer, documents separated by (and ending in) a byte that is not a word byte, so no
    # word spans two; 8 more bytes for the 8-byte reads below. bytes.translate lowercases the
    # word bytes and zeroes the others.
    text = b"\n".join([b"", *encoded, bytes(8)]).translate(_WORD_BYTES)
    mask = np.frombuffer(text, dtype=np.uint8) != 0
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1  # starts and ends of words, alternately
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
    # Every byte position as the start of an (unaligned, little-endian) 8-byte value.
    at = np.ndarray(shape=(len(text) - 7,), dtype="<u8", buffer=text, strides=(1,))
    h = at[starts]
    h &= _FIRST_BYTES[np.minimum(lengths, 8)]
    with np.errstate(over="ignore"):
        h *= _MIX64
        h += lengths.astype(np.uint64)
        # The last 8 bytes (overlapping the first) of words longer than 8, the middle 8 of
        # those longer than 16: a few words, added in place.
        long = np.flatnonzero(lengths > 8)
        h[long] += at[starts[long] + lengths[long] - 8] * _MIX64
        longer = long[lengths[long] > 16]
        h[longer] += at[starts[longer] + (lengths[longer] - 8) // 2]
        h *= _MIX64
    doc_ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 1)
    per_doc = np.diff(np.searchsorted(starts, doc_ends), prepend=0)
    return (h >> np.uint64(32)).astype(np.uint32), per_doc


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
    looks_at = np.ascontiguousarray(order.T[:_ROW_TRIES], dtype=np.int32)  # [try, bin]: the bin it looks at
    left = []
    for lo in range(0, out.shape[0], _DENSIFY_ROWS):
        block, own = out[lo:lo + _DENSIFY_ROWS], signatures_[lo:lo + _DENSIFY_ROWS]
        empty = own == EMPTY
        empty &= ~empty.all(axis=1, keepdims=True)  # rows with no filled bin stay empty
        at = np.flatnonzero(empty).astype(np.int32)  # row * k + bin
        flat_own, flat_out = own.reshape(-1), block.reshape(-1)
        for attempt in range(looks_at.shape[0]):
            if at.size == 0:
                break
            bins = at % k
            donor = flat_own[at - bins + looks_at[attempt][bins]]
            flat_out[at] = donor  # an empty donor leaves the bin empty
            at = at[donor == EMPTY]
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


def batch_signatures(settings: MinHashSettings, encoded: list[bytes] | None, ids: np.ndarray | None,
                     lengths: np.ndarray) -> np.ndarray:
    """The signatures of a batch's documents: from their UTF-8 texts (`encoded`, words) or
    their token ids (`ids`, documents end to end, `lengths` each). Row i is all EMPTY when
    document i has fewer than shingle_size units (see signed)."""
    if settings.shingle == WORDS:
        units, per_doc = word_hashes(encoded)
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
