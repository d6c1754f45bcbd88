"""What near dedup needs to know of each character, and a batch's texts as it reads them.

Two things of a text depend on its characters one by one: its words (words.py: Unicode NFKC,
case folding, NFKD without the combining marks, every other non-word character a space) and
its capitals (copy_defects.py). Both are pure functions of a code point, so each code point
has one uint32 entry in CHARACTERS, computed the first time a process meets it, with the
same str and unicodedata calls as the definitions (code_points.py):

    bits  0-20  VALUE    the code point it becomes in words (LENGTH 1), or where its
                         characters start in POOL (LENGTH 2 to 6)
    bits 21-23  LENGTH   how many characters it becomes in words: 0 (a combining mark), 1,
                         2 to 6 (ß: ss, ½: 1, a space and 2, a Hangul syllable: its jamo;
                         one of separators only, …, is one space); WHOLE
                         (7): its text is normalised whole, by the Unicode calls (a
                         character that interacts with its neighbours, or becomes more)
    bits 24-28  its case (copy_defects): RESIZES (str.upper() or str.lower() changes its
                         length), LOWER_CHANGES, LOWER_NOT_UPPER, UPPER (str.isupper),
                         CASED (str.isupper or str.islower)

A BatchText looks up its non-ASCII texts' code points once, for the words and the capitals
together (separately, the two lookups, each text's decoding and its code points cost as
much again as the rest of near dedup's work on the text: 2.5 s of the 12 s it added to 107k
documents of real text in 30 languages).
"""
import functools
import unicodedata

import numpy as np

from transforms.tokenize.code_points import LazyCodePointTable

VALUE_BITS = 21
VALUE_MASK = np.uint32((1 << VALUE_BITS) - 1)
LENGTH_SHIFT = VALUE_BITS
WHOLE = 7  # a LENGTH: the text is normalised whole
CASE_SHIFT = 24
RESIZES, LOWER_CHANGES, LOWER_NOT_UPPER, UPPER, CASED = (1 << i for i in range(5))  # case bits, from CASE_SHIFT
assert CASE_SHIFT % 8 == 0 and RESIZES == 1 and LENGTH_SHIFT % 8 == 5  # BatchText's byte views; non_ascii_capitals
_UNKNOWN = 0xFFFFFFFF  # no entry has bits 29-31 set

WORD, MARK, SEPARATOR = 0, 1, 2  # what a code point is to the words (kind_of)
NEWLINE = 10  # ends each text in a BatchText's code points, and in its normalised words
DELETED = 1  # a mark's character in words.py's pass, dropped from its UTF-8 (U+0001 is a separator: 32)


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


POOL: list[int] = []  # the characters of every entry of LENGTH 2 to 6, end to end


def _words_entry(c: int, backward: np.ndarray) -> int:
    """VALUE | LENGTH << LENGTH_SHIFT of code point c."""
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
        return WHOLE << LENGTH_SHIFT
    words = [32 if kind == SEPARATOR else p for p, kind in ((ord(x), kind_of(ord(x))) for x in out) if kind != MARK]
    if not words:
        return 0
    if set(words) == {32}:
        return 32 | 1 << LENGTH_SHIFT  # separators only (…): as a word splits, one is as good as three
    if len(words) == 1:
        return words[0] | 1 << LENGTH_SHIFT
    if len(words) >= WHOLE or len(POOL) + len(words) > VALUE_MASK:
        return WHOLE << LENGTH_SHIFT  # a few characters (ﷺ) or a full pool: the Unicode calls
    at = len(POOL)
    POOL.extend(words)
    return at | len(words) << LENGTH_SHIFT


def _case_bits(c: int) -> int:
    ch = chr(c)
    upper, lower = ch.upper(), ch.lower()
    return ((RESIZES if len(upper) != 1 or len(lower) != 1 else 0) | (LOWER_CHANGES if lower != ch else 0)
            | (LOWER_NOT_UPPER if lower != upper else 0) | (UPPER if ch.isupper() else 0)
            | (CASED if ch.isupper() or ch.islower() else 0))


def _entries(points: np.ndarray) -> np.ndarray:
    backward = _composes_backward()
    return np.fromiter((_words_entry(c, backward) | _case_bits(c) << CASE_SHIFT for c in points.tolist()),
                       dtype=np.uint32, count=points.size)


CHARACTERS = LazyCodePointTable(np.uint32, _entries, unknown=_UNKNOWN)


def pool() -> np.ndarray:
    return np.array(POOL, dtype=np.uint32)


class BatchText:
    """A batch's texts as near dedup reads them: `encoded`, each in UTF-8 (for the digests,
    the ASCII texts' words and everyone's whitespace), and for the texts that are not ASCII
    (`others`: their indices; `texts`: them as str), their code points end to end, each
    text followed by a NEWLINE (`points`; `ends`: where each text's span ends, after its
    newline), with each code point's CHARACTERS entry (`entries`)."""

    def __init__(self, encoded: list[bytes], texts: list[str] | None = None):
        """`texts`: the same texts as str, when the caller has them (saves decoding)."""
        self.encoded = encoded
        others = [i for i, e in enumerate(encoded) if not e.isascii()]
        self.others = np.array(others, dtype=np.int64)
        self.texts = [texts[i] for i in others] if texts is not None else [encoded[i].decode("utf-8") for i in others]
        spans = np.fromiter(map(len, self.texts), dtype=np.int64, count=len(others)) + 1
        self.ends = np.cumsum(spans)
        self.points = np.frombuffer("\n".join([*self.texts, ""]).encode("utf-32-le"), dtype="<u4")
        self.entries = CHARACTERS.values(self.points)

    @classmethod
    def of(cls, texts: list[str]) -> "BatchText":
        return cls([t.encode("utf-8") for t in texts], texts)

    def word_lengths(self) -> np.ndarray:
        """uint8: each code point's LENGTH (the top 3 bits of the entries' third bytes: one
        pass over bytes, not two over the uint32 entries)."""
        return self.entries.astype("<u4", copy=False).view(np.uint8)[LENGTH_SHIFT // 8::4] >> (LENGTH_SHIFT % 8)

    def case_bytes(self) -> np.ndarray:
        """uint8: each code point's case bits (the entries' high bytes, copied out: the passes
        over a strided view of them cost twice as much)."""
        return np.ascontiguousarray(self.entries.astype("<u4", copy=False).view(np.uint8)[CASE_SHIFT // 8::4])

    def spans_of(self, positions: np.ndarray) -> np.ndarray:
        """Which of the non-ASCII texts (an index into `texts`) each of `positions` (of
        `points`) lies in."""
        return np.searchsorted(self.ends, positions, side="right")
