"""What makes one near-copy a worse copy to keep than another (--dedup near): capitals and
mangled whitespace. The kept text of a cluster of near-copies is the one a person would keep:
the original, not its all-caps or re-spaced variant (near_dedup.rank_of orders by these
after the input, before the length).

A document's defects are one uint16, computed where it is tokenized, for a whole batch at
once, and staged with its signature:

    high byte  its capitals: floor(16 * uppercase letters / cased letters), at most 15
               (0 for ordinary prose, 4 for Title Case, 15 for ALL CAPS)
    low byte   its whitespace anomalies per KiB of text, at most 255: a run of 2 or more
               blanks (space, tab) inside a line, blanks at the end of a line, a third
               newline in a row. Indentation (blanks after a newline) is not one.

Both are rates, in coarse steps, so that a copy with a few words edited has the defects of
its original, and a longer text is not worse for being longer. ASCII letters are counted
with numpy over the batch; the other texts' letters too, with a table of each code point's
case (non_ascii_capitals).
"""
import numpy as np

from transforms.tokenize.code_points import LazyCodePointTable

CAPITAL_LEVELS = 16
MAX_ANOMALY_RATE = 255
_SPACE, _TAB, _NEWLINE = 32, 9, 10


def _per_document(positions: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the sorted `positions` fall in each document (documents end at `ends`)."""
    return np.diff(np.searchsorted(positions, ends), prepend=0)


# A code point's case (_case_counts): what non_ascii_capitals counts of it, in fields of
# _FIELD bits, so that one sum over a text's code points counts all three at once.
_FIELD = 21
_FIELD_MASK = (1 << _FIELD) - 1
_RESIZES, _LOWER_CHANGES, _LOWER_NOT_UPPER = 2 * _FIELD, _FIELD, 0  # (fields' shifts) fast counts
_IS_UPPER, _IS_CASED = _FIELD, 0  # character by character


def _case_counts(points: np.ndarray) -> np.ndarray:
    """Each code point's two entries (int64): [0] the fast counts (whether its case changes
    its length, whether str.lower() changes it, whether its lower() and upper() differ), [1]
    str.isupper and (str.isupper or str.islower)."""
    entries = np.zeros((points.size, 2), dtype=np.int64)
    for i, c in enumerate(map(chr, points.tolist())):
        upper, lower = c.upper(), c.lower()
        entries[i, 0] = (((len(upper) != 1 or len(lower) != 1) << _RESIZES) | ((lower != c) << _LOWER_CHANGES)
                         | ((lower != upper) << _LOWER_NOT_UPPER))
        entries[i, 1] = (c.isupper() << _IS_UPPER) | ((c.isupper() or c.islower()) << _IS_CASED)
    return entries


_FAST = LazyCodePointTable(np.int64, lambda points: _case_counts(points)[:, 0], unknown=-1)
_CHARACTER_BY_CHARACTER = LazyCodePointTable(np.int64, lambda points: _case_counts(points)[:, 1], unknown=-1)


def non_ascii_capitals(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(uppercase letters, cased letters) of each of `texts` (none empty), of any script, for
    all at once: one lookup of each code point's counts, one sum per text. A text none of whose
    letters changes length with its case counts the code points that str.lower() changes and
    those whose lower() and upper() differ (code point by code point: lower()'s one context
    rule, a final sigma, changes neither count); any other counts str.isupper and
    str.islower code point by code point. (Text by text, copy_defects took 1.2 s per 28,000
    documents of real text in 10 languages; so, 0.4 s.)"""
    sizes = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.cumsum(sizes) - sizes
    points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype="<u4")
    wide = sizes.max() > _FIELD_MASK  # a text so long that a field of its sum could overflow
    resizes, upper, cased = _field_sums(_FAST.values(points), starts, (_RESIZES, _LOWER_CHANGES, _LOWER_NOT_UPPER), wide)
    resized = np.flatnonzero(resizes)
    if resized.size:
        inside = np.repeat(np.isin(np.arange(len(texts)), resized), sizes)
        upper[resized], cased[resized] = _field_sums(_CHARACTER_BY_CHARACTER.values(points[inside]),
                                                     np.cumsum(sizes[resized]) - sizes[resized],
                                                     (_IS_UPPER, _IS_CASED), wide)
    return upper, cased


def _field_sums(entries: np.ndarray, starts: np.ndarray, shifts: tuple, wide: bool) -> list[np.ndarray]:
    """Each field's sum over each run of `entries` (runs start at `starts`): one sum of the
    packed entries, or (`wide`) one per field."""
    if wide:
        return [np.add.reduceat((entries >> shift) & _FIELD_MASK, starts) for shift in shifts]
    sums = np.add.reduceat(entries, starts)
    return [(sums >> shift) & _FIELD_MASK for shift in shifts]


def copy_defects(encoded: list[bytes]) -> np.ndarray:
    """uint16 defects (capital level << 8 | whitespace anomaly rate) of each UTF-8 text."""
    if not encoded:
        return np.empty(0, dtype=np.uint16)
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    ends = np.cumsum(sizes + 1)  # each text and the newline after it
    b = np.frombuffer(b"\n".join([*encoded, b""]), dtype=np.uint8)
    upper = _per_document(np.flatnonzero((b >= 65) & (b <= 90)), ends)
    cased = upper + _per_document(np.flatnonzero((b >= 97) & (b <= 122)), ends)
    others = [i for i, text in enumerate(encoded) if not text.isascii()]
    if others:
        upper[others], cased[others] = non_ascii_capitals([encoded[i].decode("utf-8") for i in others])
    capitals = np.minimum(CAPITAL_LEVELS * upper // np.maximum(cased, 1), CAPITAL_LEVELS - 1)

    blank = (b == _SPACE) | (b == _TAB)
    newline = b == _NEWLINE
    after_text = np.concatenate([[False], ~(blank[:-1] | newline[:-1])])
    inside = blank[:-1] & blank[1:] & after_text[:-1]  # the first blank of a run of 2+ after a word
    trailing = blank[:-1] & newline[1:]
    third = newline[2:] & newline[1:-1] & newline[:-2]
    anomalies = (_per_document(np.flatnonzero(inside | trailing), ends)
                 + _per_document(np.flatnonzero(third) + 2, ends))
    # The newline joining two texts is no text's: a text's last blanks are at its end of line.
    rate = np.minimum(anomalies * 1024 // np.maximum(sizes, 1), MAX_ANOMALY_RATE)
    return (capitals.astype(np.uint16) << np.uint16(8)) | rate.astype(np.uint16)
