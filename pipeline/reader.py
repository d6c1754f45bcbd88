"""Reading a flat-tokens dataset in a trainer (see docs: flat-tokens format).

    from pipeline.reader import FlatTokensSplit, open_dataset

    train = FlatTokensSplit("out/sample.zarr", "train")        # or "gs://bucket/ds.zarr"
    len(train), train.num_tokens, train.max_token_id
    train.sequence(3)                      # ids of sequence 3 (unpacked access: two reads)
    window = train.packed(7, 2048)         # encoded_tokens[7*2048:8*2048] (packed access: one read)
    inputs, targets = inputs_targets(window)
    inputs, targets = train.packed_batch([7, 0, 12], 2048)    # two (3, 2048) int32 arrays

Only a committed dataset opens (root attributes ``format == "flat-tokens"`` and
``complete is True``); anything else raises DatasetError. Opening reads metadata only;
every access reads exactly the slices it needs, so memory stays bounded whatever the size of
the dataset, and random access is O(1) in it. Nothing is cached: a FlatTokensSplit holds no
mutable state after construction, so one instance may be shared by reader threads. It also
pickles (by URL), so it can be handed to DataLoader worker processes.

Decoded token ids are returned as int32 (the format bounds ids by 2**31 - 1).

Packed windows: window ``i`` of length ``L`` is ``encoded_tokens[i*L:(i+1)*L]``. There are
``num_windows(L) == num_tokens // L`` full windows. The last ``num_tokens % L`` tokens form
a partial window, which is dropped by default (index ``num_windows(L)`` raises IndexError);
``packed(i, L, partial=True)`` returns it, shorter than ``L``. ``packed_batch`` only serves
full windows, so its rows always have length ``L``.

Inputs and targets (the format's rule): ``targets = ids``; ``inputs[j] = targets[j-1]``,
or 0 where a sequence starts (start bit set). A window is one training sequence: its first
input is always 0, since the token before the window is not part of it (the window need
not begin at a sequence start). No loss mask is needed.
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator

import numpy as np
import zarr

from pipeline import verify

SPLITS = ("train", "validation")
TOKENS = "encoded_tokens"
SEQ_STARTS = "seq_starts"


class DatasetError(Exception):
    """The dataset cannot be read: missing, not committed, or not a flat-tokens dataset."""


class UncommittedDataset(DatasetError):
    """The dataset exists but its run did not commit it (it may be half written)."""


def _open_committed_root(url: str, storage_options: dict | None) -> zarr.Group:
    try:
        root = verify.open_root(str(url), storage_options)
    except verify.CannotOpen as e:
        raise DatasetError(str(e)) from None
    if root is None:
        raise UncommittedDataset(f"{url}: {verify.UNFINISHED}")
    attrs = dict(root.attrs)
    unfinished = verify.check_commit(attrs)
    if unfinished:
        raise UncommittedDataset(f"{url}: {unfinished}")
    problems = verify.check_format(attrs)
    if problems:
        raise DatasetError(f"{url}: {problems[0]}")
    return root


def _member(group: zarr.Group, url: str, split: str, name: str, kind: str, itemsize: int) -> zarr.Array:
    if name not in group or not isinstance(group[name], zarr.Array):
        raise DatasetError(f"{url}: split {split} has no array {name}")
    arr = group[name]
    if arr.dtype.kind != kind or arr.dtype.itemsize != itemsize or len(arr.shape) != 1:
        raise DatasetError(f"{url}: {split}/{name} is {arr.dtype} {arr.shape}, expected 1-D uint{itemsize * 8}")
    return arr


def _index(i, n: int, what: str) -> int:
    """i as an int in [0, n); negative or out-of-range indices raise IndexError."""
    try:
        k = operator.index(i)
    except TypeError:
        raise TypeError(f"{what} index must be an integer, got {type(i).__name__}") from None
    if not 0 <= k < n:
        raise IndexError(f"{what} index {k} out of range [0, {n})")
    return k


def _positive(length) -> int:
    k = int(length)
    if k != length or k < 1:
        raise ValueError(f"window length must be a positive integer, got {length!r}")
    return k


def decode(encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids as int32, start flags as bool) of encoded tokens: ``t = v >> 1``, ``start = v & 1``."""
    v = np.asarray(encoded, dtype=np.uint32)
    return (v >> np.uint32(1)).astype(np.int32), (v & np.uint32(1)).astype(bool)


def inputs_targets(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of encoded window(s), per the format's rule; works along the last axis.

    targets = ids; inputs[j] = targets[j-1], or 0 where a sequence starts; inputs[0] = 0."""
    targets, starts = decode(window)
    inputs = np.zeros_like(targets)
    inputs[..., 1:] = targets[..., :-1]
    inputs[starts] = 0
    return inputs, targets


class FlatTokensSplit:
    """One split (``train`` or ``validation``) of a committed flat-tokens dataset."""

    def __init__(self, url: str, split: str = "train", storage_options: dict | None = None, *,
                 _root: zarr.Group | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.url = str(url)
        self.split = split
        self.storage_options = dict(storage_options or {})
        root = _root if _root is not None else _open_committed_root(self.url, self.storage_options)
        if split not in root or not isinstance(root[split], zarr.Group):
            raise DatasetError(f"{self.url}: no split group {split}")
        group = root[split]
        self._tokens = _member(group, self.url, split, TOKENS, "u", 4)
        self._starts = _member(group, self.url, split, SEQ_STARTS, "u", 8)
        if self._starts.shape[0] < 1:
            raise DatasetError(f"{self.url}: {split}/{SEQ_STARTS} is empty, expected at least [0]")
        max_id, problem = verify.read_max_token_id(group.attrs)
        if problem:
            raise DatasetError(f"{self.url}: {split}: {problem}")
        self.max_token_id: int = max_id
        self.num_tokens: int = int(self._tokens.shape[0])
        self.num_sequences: int = int(self._starts.shape[0]) - 1
        self.attrs: dict = dict(root.attrs)  # the dataset's root attributes (provenance, stats)

    # -- pickling: by URL, so workers reopen the store themselves -------------------------------
    def __getstate__(self):
        return {"url": self.url, "split": self.split, "storage_options": self.storage_options}

    def __setstate__(self, state):
        self.__init__(state["url"], state["split"], state["storage_options"])

    def __repr__(self) -> str:
        return (f"FlatTokensSplit({self.url!r}, {self.split!r}: {self.num_sequences} sequences, "
                f"{self.num_tokens} tokens, max_token_id {self.max_token_id})")

    # -- unpacked access ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, i) -> np.ndarray:
        return self.sequence(i)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self.num_sequences):
            yield self.sequence(i)

    def sequence_bounds(self, i) -> tuple[int, int]:
        """[start, end) of sequence i in encoded_tokens: one read of seq_starts[i:i+2]."""
        k = _index(i, self.num_sequences, "sequence")
        a, b = (int(x) for x in self._starts[k:k + 2])
        return a, b

    def encoded_sequence(self, i) -> np.ndarray:
        """The stored (encoded) tokens of sequence i: two reads."""
        a, b = self.sequence_bounds(i)
        return np.asarray(self._tokens[a:b])

    def sequence(self, i) -> np.ndarray:
        """Token ids (int32) of sequence i: two reads, seq_starts[i:i+2] then the tokens."""
        return decode(self.encoded_sequence(i))[0]

    def sequence_lengths(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Lengths (int64) of sequences lo..hi-1: one read of seq_starts[lo:hi+1]."""
        hi = self.num_sequences if hi is None else hi
        if not 0 <= lo <= hi <= self.num_sequences:
            raise IndexError(f"sequence range [{lo}, {hi}) not within [0, {self.num_sequences}]")
        if lo == hi:
            return np.empty(0, np.int64)
        return np.diff(np.asarray(self._starts[lo:hi + 1]).astype(np.int64))

    def iter_sequence_lengths(self, block: int = 1 << 20) -> Iterator[np.ndarray]:
        """All sequence lengths, in order, in blocks of at most `block` (bounded memory)."""
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        for lo in range(0, self.num_sequences, block):
            yield self.sequence_lengths(lo, min(self.num_sequences, lo + block))

    # -- packed access --------------------------------------------------------------------------
    def num_windows(self, length: int, partial: bool = False) -> int:
        """Full windows of `length` tokens; with partial=True, plus the shorter last one if any."""
        length = _positive(length)
        full, rest = divmod(self.num_tokens, length)
        return full + (1 if partial and rest else 0)

    def packed(self, i, length: int, partial: bool = False) -> np.ndarray:
        """Encoded window i: ``encoded_tokens[i*length:(i+1)*length]`` (one read, uint32).

        Full windows only unless partial=True, which also serves the last, shorter window."""
        length = _positive(length)
        k = _index(i, self.num_windows(length, partial), f"window (length {length})")
        return np.asarray(self._tokens[k * length:min(self.num_tokens, (k + 1) * length)])

    def packed_inputs_targets(self, i, length: int, partial: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of window i, int32, per the format's rule (see inputs_targets)."""
        return inputs_targets(self.packed(i, length, partial))

    def packed_batch(self, indices: Iterable[int], length: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), each int32 of shape (len(indices), length): one read per window."""
        length = _positive(length)
        indices = list(indices)
        windows = np.empty((len(indices), length), np.uint32)
        for row, i in enumerate(indices):
            windows[row] = self.packed(i, length)
        return inputs_targets(windows)


def open_dataset(url: str, storage_options: dict | None = None) -> dict[str, FlatTokensSplit]:
    """Both splits of a committed dataset: ``{"train": ..., "validation": ...}``."""
    root = _open_committed_root(str(url), storage_options)
    return {s: FlatTokensSplit(url, s, storage_options, _root=root) for s in SPLITS}
