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
with numpy over the batch; a text with other letters is compared with its str.upper() and
str.lower(), code point by code point.
"""
import numpy as np

CAPITAL_LEVELS = 16
MAX_ANOMALY_RATE = 255
_SPACE, _TAB, _NEWLINE = 32, 9, 10


def _per_document(positions: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the sorted `positions` fall in each document (documents end at `ends`)."""
    return np.diff(np.searchsorted(positions, ends), prepend=0)


def _capitals_of(text: str) -> tuple[int, int]:
    """(uppercase letters, cased letters) of a text of any script."""
    upper, lower = text.upper(), text.lower()
    if len(upper) == len(text) == len(lower):  # no letter changes length when its case does (ß, İ do)
        points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        lowered = np.frombuffer(lower.encode("utf-32-le"), dtype="<u4")
        uppered = np.frombuffer(upper.encode("utf-32-le"), dtype="<u4")
        return int(np.count_nonzero(points != lowered)), int(np.count_nonzero(lowered != uppered))
    return sum(c.isupper() for c in text), sum(c.isupper() or c.islower() for c in text)


def copy_defects(encoded: list[bytes]) -> np.ndarray:
    """uint16 defects (capital level << 8 | whitespace anomaly rate) of each UTF-8 text."""
    if not encoded:
        return np.empty(0, dtype=np.uint16)
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    ends = np.cumsum(sizes + 1)  # each text and the newline after it
    b = np.frombuffer(b"\n".join([*encoded, b""]), dtype=np.uint8)
    upper = _per_document(np.flatnonzero((b >= 65) & (b <= 90)), ends)
    cased = upper + _per_document(np.flatnonzero((b >= 97) & (b <= 122)), ends)
    for i, text in enumerate(encoded):
        if not text.isascii():
            upper[i], cased[i] = _capitals_of(text.decode("utf-8"))
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
