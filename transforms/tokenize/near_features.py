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
"""
import threading

import numpy as np

from transforms.segments import gather_segments
from transforms.tokenize import minhash
from transforms.tokenize.characters import BatchText
from transforms.tokenize.copy_defects import copy_defects

MEMO_BYTES = 32 << 20  # 65,536 texts' signatures at the default 256 bins


class FeatureMemo:
    """The features of the last `capacity` distinct texts met, by content digest: a ring of
    rows, the oldest overwritten first. Safe to share between threads."""

    def __init__(self, settings: minhash.MinHashSettings, capacity: int | None = None):
        self.settings = settings
        self.capacity = capacity or max(1, MEMO_BYTES // (2 * settings.hashes + 2))
        self._signatures = np.empty((self.capacity, settings.hashes), dtype=np.uint16)
        self._defects = np.empty(self.capacity, dtype=np.uint16)
        self._slot_of: dict[bytes, int] = {}
        self._key_in: list[bytes | None] = [None] * self.capacity
        self._next = 0
        self._lock = threading.Lock()

    def get(self, keys: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found: bool per key, their signatures, their defects): copies, so a later put
        cannot change them."""
        with self._lock:
            slots = np.array([self._slot_of.get(k, -1) for k in keys], dtype=np.int64)
            found = slots >= 0
            return found, self._signatures[slots[found]], self._defects[slots[found]]

    def put(self, keys: list[bytes], signatures: np.ndarray, defects: np.ndarray) -> None:
        with self._lock:
            for key, signature, defect in zip(keys, signatures, defects.tolist()):
                if key in self._slot_of:
                    continue
                slot = self._next
                self._next = (slot + 1) % self.capacity
                old = self._key_in[slot]
                if old is not None:
                    del self._slot_of[old]
                self._key_in[slot] = key
                self._slot_of[key] = slot
                self._signatures[slot] = signature
                self._defects[slot] = defect


def computed(settings: minhash.MinHashSettings, texts: list[str], encoded: list[bytes], ids: np.ndarray,
             lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, defects) of documents: their texts (as str and UTF-8) and, for token
    shingles, their ids (end to end, `lengths` each)."""
    text = BatchText(encoded, texts)
    return minhash.batch_signatures(settings, text, ids, lengths), copy_defects(text)


def batch_features(settings: minhash.MinHashSettings, texts: list[str], encoded: list[bytes], digests: np.ndarray,
                   ids: np.ndarray, lengths: np.ndarray,
                   memo: FeatureMemo | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, defects) of a batch's documents (their texts, content digests (n, 2), and
    ids end to end, `lengths` each), computed for the texts `memo` does not hold (once each,
    however many copies the batch has) and taken from it for the others."""
    if memo is None:
        return computed(settings, texts, encoded, ids, lengths)
    packed = np.ascontiguousarray(digests, dtype="<u8").tobytes()
    keys = [packed[i:i + 16] for i in range(0, len(packed), 16)]
    found, signatures_found, defects_found = memo.get(keys)
    signatures = np.empty((len(keys), settings.hashes), dtype=np.uint16)
    defects = np.empty(len(keys), dtype=np.uint16)
    signatures[found], defects[found] = signatures_found, defects_found
    missing = np.flatnonzero(~found)
    if missing.size:
        first_of = {}  # each missing text's first document in the batch
        for i in missing.tolist():
            first_of.setdefault(keys[i], i)
        new = np.fromiter(first_of.values(), dtype=np.int64, count=len(first_of))
        new_ids = gather_segments(ids, lengths, new) if settings.shingle == minhash.TOKENS else ids
        new_signatures, new_defects = computed(settings, [texts[i] for i in new.tolist()],
                                               [encoded[i] for i in new.tolist()], new_ids, lengths[new])
        row_of = {key: row for row, key in enumerate(first_of)}
        rows = np.array([row_of[keys[i]] for i in missing.tolist()], dtype=np.int64)
        signatures[missing], defects[missing] = new_signatures[rows], new_defects[rows]
        memo.put(list(first_of), new_signatures, new_defects)
    return signatures, defects
