"""Words, the units of `--near_shingle words` (the default): what a word is, and every word of
a batch's texts as a 32-bit hash (word_hashes), which minhash.py shingles.

A text's words are those of the text normalised (normalised_words): Unicode NFKC, then case
folding (str.casefold: every script's case, ß -> ss), then NFKD with the combining marks
dropped (accents: é -> e, ё -> е, й -> и), and a word is a run of word characters (letters,
digits, `_`: Python's `\\w`); everything else (spaces, punctuation of any script) separates
words, so a changed line break, a changed case or accent or an added comma changes no
shingle. Numbers are not folded (a changed price or version is a change).

How, for a whole batch at once (characters.BatchText):
- ASCII texts (most) are their own words: the word byte table lowercases and splits them
  as the normalisation would.
- Every other text is mapped code point by code point: each one's entry (characters.py)
  says what it becomes, one character (most: é becomes e, ё е, ｶ カ), none (a mark) or a
  few (ß ss), and the batch's non-ASCII texts become their words with one numpy pass
  over their code points (a mark's character is dropped from the UTF-8 after it); only the
  texts with a character that becomes a few are copied out and expanded.
  That gives the whole-text definition's words whenever no character of the text interacts
  with its neighbours (characters._words_entry says when); the texts with one (a
  combining mark, a half-width sound mark: LENGTH WHOLE) take the Unicode calls, which
  ran at 4-10 MB/s on real German, Russian and Japanese text (NFKC and NFKD normalise a
  text whole as soon as one character is not in normal form).
"""
import codecs

import numpy as np

from transforms.segments import gather_segments
from transforms.tokenize.characters import DELETED, KINDS, MARK, NEWLINE, SEPARATOR, VALUE_MASK, WHOLE, BatchText, folded, pool

WORD_NORMALISATION = "nfkc-casefold-nfkd-nomarks"  # staged with signatures: what a word is


def _word_byte_table() -> bytes:
    """For bytes.translate: word bytes to themselves (ASCII letters lowercased), others to 0."""
    table = bytearray(256)
    for c in range(256):
        if c >= 0x80 or chr(c).isalnum() or c == ord("_"):
            table[c] = ord(chr(c).lower()) if c < 0x80 else c
    return bytes(table)


_WORD_BYTES = _word_byte_table()
_FIRST_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_MIX64 = np.uint64(0x9E3779B97F4A7C15)


def normalised_words(text: BatchText) -> list[bytes]:
    """Each of the batch's texts normalised for words, in UTF-8: NFKC, case folding, NFKD
    without combining marks, every other non-word character a space. ASCII texts stay as they
    are (the word byte table lowercases and splits them alike, much faster)."""
    out = list(text.encoded)
    for i, words in zip(text.others.tolist(), _normalised_others(text)):
        out[i] = words
    return out


def _normalised_others(text: BatchText) -> list[bytes]:
    """The non-ASCII texts' words, from their code points' entries: one pass makes each code
    point its character (a mark: DELETED, dropped from the UTF-8 in one pass), and the
    newlines ending the texts, kept through, split the UTF-8 of the whole into texts. The
    texts holding a character that becomes several (Korean's syllables, German's ß: 12% of
    the code points of real text in 30 languages) are made again on their own
    (_irregular_words)."""
    if not text.texts:
        return []
    lengths = text.word_lengths()
    chars = text.entries & VALUE_MASK
    irregular = np.flatnonzero(lengths != 1)
    marks = irregular[lengths[irregular] == 0]
    chars[marks] = DELETED
    expanding = irregular[lengths[irregular] > 1]
    redone = _irregular_words(text, chars, lengths, expanding) if expanding.size else {}
    chars[expanding] = 32  # their texts are redone: any valid code point but a newline
    chars[text.ends - 1] = NEWLINE
    words = _lines(chars, len(text.texts), marks.size > 0)
    for j, normalised in redone.items():
        words[j] = normalised
    return words


def _lines(chars: np.ndarray, n: int, marked: bool) -> list[bytes]:
    """The first n newline-ended lines of code points `chars`, each in UTF-8, without the
    DELETED characters (`marked`: there are some)."""
    encoded = codecs.utf_32_le_decode(chars)[0].encode("utf-8")
    return (encoded.translate(None, bytes([DELETED])) if marked else encoded).split(b"\n")[:n]


def _irregular_words(text: BatchText, chars: np.ndarray, lengths: np.ndarray,
                     irregular: np.ndarray) -> dict[int, bytes]:
    """{text: its words} for the texts holding the `irregular` code points (entries of
    LENGTH 2 to 6 or WHOLE): their code points copied out, each irregular entry's characters
    put in place (_expanded), the texts with a WHOLE entry normalised by the Unicode calls.
    Only these texts' code points are moved (moving every text's cost as much as the rest of
    their words)."""
    spans = text.spans_of(irregular)
    affected = np.unique(spans)
    ends = text.ends[affected]
    starts = np.append(0, text.ends[:-1])[affected]
    sizes = ends - starts
    sub_ends = np.cumsum(sizes)
    shift = (sub_ends - sizes - starts)[np.searchsorted(affected, spans)]  # text positions -> the copy's
    sub = gather_segments(chars, np.diff(text.ends, prepend=0), affected)
    sizes_of = lengths[irregular].astype(np.int64)
    whole = np.unique(spans[sizes_of == WHOLE])
    sub, newlines = _expanded(sub, sizes_of, irregular + shift, sub_ends - 1)
    sub[newlines] = NEWLINE
    redone = dict(zip(affected.tolist(), _lines(sub, affected.size, True)))
    for j, normalised in zip(whole.tolist(), _normalised_whole([text.texts[j] for j in whole.tolist()])):
        redone[j] = normalised
    return redone


def _expanded(chars: np.ndarray, sizes: np.ndarray, irregular: np.ndarray,
              newlines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the characters with each irregular entry's in its place, where the newlines went):
    an entry of LENGTH WHOLE (its text is replaced) or 0 leaves nothing, one of 2 to 6 its
    run of POOL. The others keep their order in the slots left (a boolean mask: np.repeat
    over all code points cost 3x). _irregular_words calls it on the texts that need it only;
    marks are DELETED before, in place."""
    sizes[sizes == WHOLE] = 0
    grown = np.cumsum(sizes - 1)  # how much longer the output is, after each irregular entry
    starts = irregular + grown - (sizes - 1)  # where each one's characters go
    out = np.empty(chars.size + int(grown[-1]), dtype=np.uint32)
    many = sizes > 0
    runs, counts = starts[many], sizes[many]
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    slots = np.repeat(runs, counts) + within
    out[slots] = pool()[np.repeat(chars[irregular[many]].astype(np.int64), counts) + within]
    regular_slots = np.ones(out.size, dtype=bool)
    regular_slots[slots] = False
    regular = np.ones(chars.size, dtype=bool)
    regular[irregular] = False
    out[regular_slots] = chars[regular]
    before = np.searchsorted(irregular, newlines)  # irregular entries before each newline
    return out, newlines + np.append(0, grown)[before]


def _normalised_whole(texts: list[str]) -> list[bytes]:
    """Texts normalised by the Unicode calls (text by text, in C), their marks and separators
    found in one numpy pass over their code points (a regex over them ran at 5 MB/s)."""
    if not texts:
        return []
    folded_texts = [folded(t) for t in texts]
    points = np.frombuffer("\n".join([*folded_texts, ""]).encode("utf-32-le"), dtype="<u4")
    kinds = KINDS.values(points)
    kept = kinds != MARK
    ends = np.cumsum(np.fromiter(map(len, folded_texts), dtype=np.int64, count=len(texts)) + 1) - 1
    chars = np.where(kinds == SEPARATOR, np.uint32(32), points).astype("<u4")
    chars[ends] = NEWLINE  # no newline is a mark
    return codecs.utf_32_le_decode(chars[kept])[0].encode("utf-8").split(b"\n")[:len(texts)]


def word_hashes(text: BatchText) -> tuple[np.ndarray, np.ndarray]:
    """(uint32 hash of every word of the batch's texts, in order; int64 words per text).

    A word's hash covers its length and its first, middle and last 8 bytes: every byte of a
    word up to 24 bytes long (all but a few of a text's words); longer runs (URLs, hashes)
    that differ only elsewhere count as the same word."""
    if not text.encoded:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    encoded = normalised_words(text)
    # One buffer, texts separated by (and ending in) a byte that is not a word byte, so no
    # word spans two; 8 more bytes for the 8-byte reads below. bytes.translate lowercases the
    # word bytes and zeroes the others.
    buffer = b"\n".join([b"", *encoded, bytes(8)]).translate(_WORD_BYTES)
    mask = np.frombuffer(buffer, dtype=np.uint8) != 0
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1  # starts and ends of words, alternately
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
    # Every byte position as the start of an (unaligned, little-endian) 8-byte value.
    at = np.ndarray(shape=(len(buffer) - 7,), dtype="<u8", buffer=buffer, strides=(1,))
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
