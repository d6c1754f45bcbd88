"""A batch's near features (--dedup near): each document's MinHash signature and copy
defects, computed once per distinct text a worker process meets.

The features are computed where documents are tokenized, before exact dedup merges the
copies of a text: so each copy would pay for its words, its signature and its capitals,
which cost as much as the rest of the job per byte of non-ASCII text (docs/dedup.md,
"Cost"). They are a pure function of the text (and the settings), so a worker keeps the
last texts' features by content digest (FeatureMemo) and a copy costs its digest and a
lookup; nothing the job writes depends on what the memo held. The memo is one per
process, shared by its threads (apache_beam.utils.shared), and bounded: MEMO_BYTES of
signatures, the oldest dropped first.

On local runs with several worker processes (pipeline/graph.py passes the spill directory
then; one process keeps the memo in memory) they share one memo instead (SharedFeatureMemo):
a file of rows in the run's spill directory, mapped by every process, so a text costs one
computation a machine, not one a process (with two processes, the 5x benchmark corpus
computed 40% of its documents' features with a memo per process). Processes write rows
without locks; a row holds a check of its key and features, and a row whose check fails (a
write torn by another, a crash) is a miss, never a hit.
"""
import os
import threading
from itertools import repeat

import numpy as np

from transforms import hashing
from transforms.segments import gather_segments
from transforms.tokenize import minhash
from transforms.tokenize.characters import BatchText
from transforms.tokenize.copy_defects import copy_defects

MEMO_BYTES = 32 << 20  # 65,536 texts' signatures at the default 256 bins
SHARED_MEMO_BYTES = 64 << 20  # the shared memo's file: 123,361 rows at the default 256 bins
WAYS = 4  # the rows a text may be in (a set): a new text takes one of its set's empty rows first
PIECE_BYTES = 1 << 20  # text whose features are computed at once (pieces)


class FeatureMemo:
    """The features of the last `capacity` distinct texts met, by content digest: a ring of
    rows, the oldest overwritten first, found by a dict from the digest's first half (an
    int: a dict of 16-byte keys, and a loop over the keys to evict, cost twice as much) and
    checked against its second. Safe to share between threads."""

    def __init__(self, settings: minhash.MinHashSettings, capacity: int | None = None):
        self.settings = settings
        self.capacity = capacity or max(1, MEMO_BYTES // (2 * settings.hashes + 2))
        self._signatures = np.empty((self.capacity, settings.hashes), dtype=np.uint16)
        self._defects = np.empty(self.capacity, dtype=np.uint16)
        self._digests = np.zeros((self.capacity, 2), dtype=np.uint64)
        self._held = np.zeros(self.capacity, dtype=bool)
        self._slot_of: dict[int, int] = {}
        self._next = 0
        self._lock = threading.Lock()

    def _slots(self, digests: np.ndarray) -> np.ndarray:
        """Each digest's row, or -1."""
        slot_of = self._slot_of
        slots = np.fromiter(map(slot_of.get, digests[:, 0].tolist(), repeat(-1)), dtype=np.int64, count=len(digests))
        found = np.flatnonzero(slots >= 0)
        same = self._held[slots[found]] & (self._digests[slots[found]] == digests[found]).all(axis=1)
        slots[found[~same]] = -1  # a first half met with another second half: not this text
        return slots

    def get(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found: bool per text (its content digest, a row of `digests`), their signatures,
        their defects): copies, so a later put cannot change them."""
        with self._lock:
            slots = self._slots(digests)
            found = slots >= 0
            return found, self._signatures[slots[found]], self._defects[slots[found]]

    def put(self, digests: np.ndarray, signatures: np.ndarray, defects: np.ndarray) -> None:
        """Hold the features of texts `digests` (distinct), evicting the oldest held."""
        with self._lock:
            new = np.flatnonzero(self._slots(digests) < 0)[-self.capacity:]
            if not new.size:
                return
            slots = (self._next + np.arange(new.size)) % self.capacity
            self._next = int(slots[-1] + 1) % self.capacity
            evicted = slots[self._held[slots]]
            for key, slot in zip(self._digests[evicted, 0].tolist(), evicted.tolist()):
                if self._slot_of.get(key) == slot:
                    del self._slot_of[key]
            self._slot_of.update(zip(digests[new, 0].tolist(), slots.tolist()))
            self._digests[slots], self._held[slots] = digests[new], True
            self._signatures[slots] = signatures[new]
            self._defects[slots] = defects[new]


class SharedFeatureMemo:
    """Texts' features by content digest, in a file that every worker process of a machine
    maps (`path`, in the run's spill directory): sets of WAYS rows, a text's set chosen by
    its digest. A row is (digest, check, defects, signature); its check is a 64-bit mix of
    every other word of the row, so a row torn by two writers, or half written, is not
    found. Writers take no lock: the worst a race does is lose a row."""

    def __init__(self, settings: minhash.MinHashSettings, path: str, size: int = SHARED_MEMO_BYTES):
        self.settings = settings
        pad = 3 + (-settings.hashes) % 4  # rows of whole 64-bit words
        self._row = np.dtype([("key", "<u8", (2,)), ("check", "<u8"), ("defects", "<u2"), ("pad", "<u2", (pad,)),
                              ("signature", "<u2", (settings.hashes,))])
        self._sets = max(1, size // (self._row.itemsize * WAYS))
        rows = self._sets * WAYS
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < rows * self._row.itemsize:
                os.ftruncate(fd, rows * self._row.itemsize)  # every process asks the same size
        finally:
            os.close(fd)
        self._table = np.memmap(path, dtype=self._row, mode="r+", shape=(rows,))
        # One fixed odd multiplier per 64-bit word of a row, 0 for the check's own word.
        self._mix = hashing.splitmix64(np.arange(self._row.itemsize // 8, dtype=np.uint64)) | np.uint64(1)
        self._mix[2] = 0

    def _checks(self, rows: np.ndarray) -> np.ndarray:
        words = rows.view("<u8").reshape(rows.size, self._mix.size)
        with np.errstate(over="ignore"):
            # splitmix64 is never 0 at 0: an all-zero row (never written) fails its check
            return hashing.splitmix64((words * self._mix).sum(axis=1, dtype=np.uint64))

    def _sets_of(self, keys: np.ndarray) -> np.ndarray:
        """(n, WAYS) rows of each key's set."""
        first = (keys[:, 0] % np.uint64(self._sets)).astype(np.int64) * WAYS
        return first[:, None] + np.arange(WAYS)

    def get(self, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found: bool per text (its content digest, a row of `digests`), their signatures,
        their defects)."""
        digests = np.ascontiguousarray(digests, dtype="<u8")
        candidates = self._sets_of(digests)
        same = (self._table["key"][candidates] == digests[:, None, :]).all(axis=2)
        found = same.any(axis=1)
        rows = self._table[candidates[found, same[found].argmax(axis=1)]]
        intact = (self._checks(rows) == rows["check"]) & (rows["key"] == digests[found]).all(axis=1)
        found[found] = intact
        return found, rows["signature"][intact], rows["defects"][intact]

    def put(self, digests: np.ndarray, signatures: np.ndarray, defects: np.ndarray) -> None:
        """Hold the features of texts `digests` (distinct): each in an empty row of its set,
        or (none empty) in the row its digest picks."""
        if not len(digests):
            return
        digests = np.ascontiguousarray(digests, dtype="<u8")
        candidates = self._sets_of(digests)
        empty = self._table["check"][candidates] == 0
        way = np.where(empty.any(axis=1), empty.argmax(axis=1), (digests[:, 1] % np.uint64(WAYS)).astype(np.int64))
        rows = np.zeros(len(digests), dtype=self._row)
        rows["key"], rows["defects"], rows["signature"] = digests, defects, signatures
        rows["check"] = self._checks(rows)
        self._table[candidates[np.arange(len(digests)), way]] = rows


def computed(settings: minhash.MinHashSettings, texts: list[str], encoded: list[bytes], ids: np.ndarray | None,
             lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, defects) of documents: their texts (as str and UTF-8) and, for token
    shingles, their ids (end to end, `lengths` each). Computed PIECE_BYTES of text at a time
    (pieces): a text's features do not depend on the texts beside it."""
    tokens = settings.shingle == minhash.TOKENS
    id_ends = np.cumsum(lengths) if tokens else None
    signatures, defects = [], []
    for lo, hi in pieces(encoded):
        text = BatchText(encoded[lo:hi], texts[lo:hi])
        if tokens:
            first = int(id_ends[lo - 1]) if lo else 0
            piece_ids, piece_lengths = ids[first:int(id_ends[hi - 1])], lengths[lo:hi]
        else:
            piece_ids = piece_lengths = None
        signatures.append(minhash.batch_signatures(settings, text, piece_ids, piece_lengths))
        defects.append(copy_defects(text))
    if not signatures:
        return np.empty((0, settings.hashes), dtype=np.uint16), np.empty(0, dtype=np.uint16)
    return np.concatenate(signatures), np.concatenate(defects)


def pieces(encoded: list[bytes], size: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) ranges of `encoded`, in order: each ends at the first text that makes it
    `size` bytes (PIECE_BYTES) or more, or at the end.

    A batch's features take a few passes over arrays of 4 to 8 bytes per character. Over a
    whole batch (16 MB of text) each array is a fresh mapping of its own, faulted in page by
    page, and no pass finds the last one's bytes in cache; a megabyte at a time, they stay in
    the heap and the cache. On 107k documents of real text in a --dedup near run, computing
    the features took 3.3 s of CPU instead of 4.7 s, and 100 page faults instead of 16,600."""
    size = size or PIECE_BYTES
    bounds, held = [0], 0
    for i, n in enumerate(map(len, encoded)):
        held += n
        if held >= size:
            bounds.append(i + 1)
            held = 0
    if bounds[-1] != len(encoded):
        bounds.append(len(encoded))
    return list(zip(bounds[:-1], bounds[1:]))


def batch_features(settings: minhash.MinHashSettings, texts: list[str], encoded: list[bytes], digests: np.ndarray,
                   ids: np.ndarray, lengths: np.ndarray,
                   memo: FeatureMemo | SharedFeatureMemo | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, defects) of a batch's documents (their texts, content digests (n, 2), and
    ids end to end, `lengths` each), computed for the texts `memo` does not hold (once each,
    however many copies the batch has, in the order of their first copies) and taken from it
    for the others."""
    if memo is None:
        return computed(settings, texts, encoded, ids, lengths)
    first, copy_of = first_copies(digests)
    found, signatures_found, defects_found = memo.get(digests[first])
    signatures = np.empty((first.size, settings.hashes), dtype=np.uint16)
    defects = np.empty(first.size, dtype=np.uint16)
    signatures[found], defects[found] = signatures_found, defects_found
    if not found.all():
        new = first[~found]
        new_ids = gather_segments(ids, lengths, new) if settings.shingle == minhash.TOKENS else ids
        listed = new.tolist()
        new_signatures, new_defects = computed(settings, [texts[i] for i in listed], [encoded[i] for i in listed],
                                               new_ids, lengths[new])
        signatures[~found], defects[~found] = new_signatures, new_defects
        memo.put(digests[new], new_signatures, new_defects)
    return signatures[copy_of], defects[copy_of]


def first_copies(digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first document of each distinct text, in document order; for each document, its
    text's place in the first)."""
    n = len(digests)
    order = np.lexsort((np.arange(n), digests[:, 1], digests[:, 0]))  # by text, each text's copies in order
    ordered = digests[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    text_of = np.empty(n, dtype=np.int64)
    text_of[order] = np.cumsum(starts) - 1  # each document's text, in digest order
    first_in_digest_order = order[starts]
    by_position = np.argsort(first_in_digest_order)
    place = np.empty_like(by_position)
    place[by_position] = np.arange(by_position.size)
    return first_in_digest_order[by_position], place[text_of]
