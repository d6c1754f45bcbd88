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
               newline in a row of the text's own (its end counts as one). Indentation
               (blanks after a newline) is not one. A text's defects are a function of
               the text alone, whatever batch it is in.

Both are rates, in coarse steps, so that a copy with a few words edited has the defects of
its original, and a longer text is not worse for being longer. ASCII letters are counted
with numpy over the batch; the other texts' letters too, with a table of each code point's
case bits (non_ascii_capitals, characters.py).
"""
import numpy as np

from transforms.tokenize.characters import CASED, LOWER_CHANGES, LOWER_NOT_UPPER, RESIZES, UPPER, BatchText

DEFINITION = "capitals-16-anomalies-of-own-newlines"  # part of a staged batch's key: what its defects mean
CAPITAL_LEVELS = 16
MAX_ANOMALY_RATE = 255
_SPACE, _TAB, _NEWLINE = 32, 9, 10


def _counts(flags: np.ndarray, starts: np.ndarray, unit: int = 1) -> np.ndarray:
    """How many of `flags` (bool, or uint8 holding `unit` or 0) are set in each span of them
    (spans start at `starts`, none empty): one sum per span, in 32 bits where it cannot
    overflow (np.add.reduceat: a third of a running sum's time, or of np.flatnonzero's)."""
    dtype = np.int32 if flags.size * unit < 1 << 31 else np.int64
    return np.add.reduceat(flags.view(np.uint8), starts, dtype=dtype).astype(np.int64) // unit


def non_ascii_capitals(text: BatchText) -> tuple[np.ndarray, np.ndarray]:
    """(uppercase letters, cased letters) of each of the batch's non-ASCII texts, of any
    script, from their code points' case bits (characters.py), all texts at once. A text
    none of whose letters changes length with its case counts the code points that
    str.lower() changes and those whose lower() and upper() differ (code point by code
    point: lower()'s one context rule, a final sigma, changes neither count); any other
    counts str.isupper and str.islower code point by code point. (Text by text, copy_defects
    took 1.2 s per 28,000 documents of real text in 10 languages.)"""
    case = text.case_bytes()
    starts = np.append(0, text.ends[:-1])
    upper = _counts(case & np.uint8(LOWER_CHANGES), starts, LOWER_CHANGES)
    cased = _counts(case & np.uint8(LOWER_NOT_UPPER), starts, LOWER_NOT_UPPER)
    # RESIZES is bit 0: masked, the bytes are booleans (np.flatnonzero of bytes cost 3x).
    resized = np.unique(text.spans_of(np.flatnonzero((case & np.uint8(RESIZES)).view(np.bool_))))
    for j, start, end in zip(resized.tolist(), starts[resized].tolist(), text.ends[resized].tolist()):
        upper[j] = np.count_nonzero(case[start:end] & np.uint8(UPPER))  # a few texts (a repeat over all cost 4x)
        cased[j] = np.count_nonzero(case[start:end] & np.uint8(CASED))
    return upper, cased


def _ascii_capitals(encoded: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(uppercase letters, cased letters) of each of the ASCII texts `encoded`."""
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 1
    b = np.frombuffer(b"\n".join([*encoded, b""]), dtype=np.uint8)
    starts = np.cumsum(sizes) - sizes
    upper = _counts((b >= 65) & (b <= 90), starts)
    return upper, upper + _counts((b >= 97) & (b <= 122), starts)


def copy_defects(text: BatchText) -> np.ndarray:
    """uint16 defects (capital level << 8 | whitespace anomaly rate) of each of the batch's texts."""
    encoded = text.encoded
    if not encoded:
        return np.empty(0, dtype=np.uint16)
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    starts = np.cumsum(sizes + 1) - (sizes + 1)  # each text and the newline after it
    b = np.frombuffer(b"\n".join([*encoded, b""]), dtype=np.uint8)
    upper, cased = np.zeros(len(encoded), dtype=np.int64), np.zeros(len(encoded), dtype=np.int64)
    ascii_ = np.ones(len(encoded), dtype=bool)
    ascii_[text.others] = False
    if ascii_.any():
        upper[ascii_], cased[ascii_] = _ascii_capitals([e for e, a in zip(encoded, ascii_.tolist()) if a])
    if text.others.size:
        upper[text.others], cased[text.others] = non_ascii_capitals(text)
    capitals = np.minimum(CAPITAL_LEVELS * upper // np.maximum(cased, 1), CAPITAL_LEVELS - 1)

    blank = (b == _SPACE) | (b == _TAB)
    newline = b == _NEWLINE
    # Each anomaly at one byte: the first blank of a run of 2+ after a word, a blank before a
    # newline, a newline after two of the text's own. (The newline joining two texts is no
    # text's: a text's last blanks are at its end of line, and no count looks into the text
    # before, so a text's defects are the same in any batch.)
    anomaly = np.zeros(b.size, dtype=bool)
    anomaly[1:-1] = blank[1:-1] & blank[2:] & ~(blank[:-2] | newline[:-2])
    anomaly[:-1] |= blank[:-1] & newline[1:]
    third = newline[2:] & newline[1:-1] & newline[:-2]  # at byte i + 2
    # Only a text's own newlines: not the one joining it to the text before, nor that text's.
    for first_bytes in (starts, starts + 1):
        at = first_bytes - 2
        third[at[(at >= 0) & (at < third.size)]] = False
    anomaly[2:] |= third
    anomalies = _counts(anomaly, starts)
    rate = np.minimum(anomalies * 1024 // np.maximum(sizes, 1), MAX_ANOMALY_RATE)
    return (capitals.astype(np.uint16) << np.uint16(8)) | rate.astype(np.uint16)
