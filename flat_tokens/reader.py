"""Reading a flat-tokens dataset in a trainer (see docs: flat-tokens format).

    from flat_tokens.reader import FlatTokensSplit, open_dataset

    train = FlatTokensSplit("out/sample.zarr", "train")        # or "gs://bucket/ds.zarr"
    len(train), train.num_tokens, train.max_token_id
    train.sequence(3)                      # ids of sequence 3 (unpacked access: two reads)
    window = train.packed(7, 2048)         # encoded_tokens[7*2048:8*2048] (packed access: one read)
    inputs, targets = inputs_targets(window)
    inputs, targets = train.packed_batch([7, 0, 12], 2048)    # two (3, 2048) int32 arrays

    for ids in train: ...                  # every sequence in order, read block by block
    for inputs, targets in train.packed_batches(2048, 32, seed=0, start_step=0): ...
    train.packed_batches(2048, 32, rank=1, world_size=4, segments=True, sources=True)  # -> Batch

Only a committed dataset opens (root attributes ``format == "flat-tokens"`` and
``complete is True``); anything else raises DatasetError. Reads never serve zeros, damaged
data or another dataset's data (flat_tokens/read_guard.py): a missing chunk raises
MissingChunk, a chunk that does not match the checksum it carries (or cannot be decoded)
raises CorruptChunk naming it, and a dataset deleted or replaced after it was opened raises
DatasetReplaced at the next read. Nor do they serve arrays that disagree with each other: a
shape that does not match seq_starts' end, a seq_starts read that does not increase or whose
boundaries carry no start bit, an id above max_token_id raise InconsistentData naming the
array and index (flat_tokens/served_checks.py). Opening reads metadata (and seq_starts' first
and last entries) only;
every access reads exactly the slices it needs, so memory stays bounded whatever the size of
the dataset, and random access is O(1) in it. Nothing is cached: a FlatTokensSplit holds no
mutable state after construction, so one instance may be shared by reader threads (each
iterator keeps its own state). It also pickles (by URL), so it can be handed to DataLoader
worker processes.

Reading for a trainer: random access decompresses whole chunks for a few tokens, so
sequential and epoch-wise reading go through iterators that read chunk-aligned blocks of a
few MB, each chunk once. ``for ids in split`` (or ``iter_sequences(start, stop)``,
``iter_encoded``) yields every sequence whole, however many chunks or blocks it spans.
``packed_batches(L, B, seed=, start_step=)`` yields shuffled (inputs, targets) batches of
full windows: contiguous blocks of windows in a seeded permutation, each row of the batch a
lane that serves its own slice of them in a seeded order (flat_tokens/batch_order.py). Every
permutation is keyed by (seed, epoch, piece, lane) alone, so batch k is a pure function of
(seed, k), whatever the number of hosts, and ``start_step=k`` resumes at batch k without
reading what comes before it. The stream runs epoch after epoch (each epoch every full window
at most once, reshuffled) unless ``epochs=`` ends it; see packed_batches for the details.

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
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import zarr

from flat_tokens import read_guard, served_checks
from flat_tokens.tools import verify
from flat_tokens.batch_order import BatchOrder, Piece, host_rows
from flat_tokens.read_guard import CorruptChunk, DatasetError, DatasetReplaced, MissingChunk, RunGuard  # noqa: F401 (API)
from flat_tokens.served_checks import InconsistentData  # noqa: F401 (API)
from flat_tokens.format.storage_faults import StorageUnavailable  # noqa: F401 (API: the store is unreachable; retry later)
from flat_tokens.format import chunk_checksums

SPLITS = ("train", "validation")
TOKENS = "encoded_tokens"
SEQ_STARTS = "seq_starts"
SEQ_SOURCES = "seq_sources"  # an extension (--record_sources): the source of each sequence

# Sequential reads take about this many items per read, rounded up to whole chunks: a few MB,
# so each chunk is decompressed once and memory stays bounded whatever the dataset's size.
TOKENS_READ = 1 << 20  # 4 MB of encoded tokens
STARTS_READ = 1 << 18  # 2 MB of seq_starts
# packed_batches' defaults: contiguous read blocks of about this many tokens (4 MB, whole
# 256Ki-token chunks for power-of-two lengths), and this many blocks per shuffle buffer (128 MB).
BLOCK_TOKENS = 1 << 20
BUFFER_BLOCKS = 32
READ_THREADS = 4  # concurrent block reads while a shuffle buffer loads (object stores: latency)
SPAN = 16  # steps gathered at a time, lane by lane, by packed_batches


class UncommittedDataset(DatasetError):
    """The dataset exists but its run did not commit it (it may be half written)."""


def _open_committed_root(url: str, storage_options: dict | None) -> tuple[zarr.Group, RunGuard]:
    """The root group, opened so that a missing chunk raises (read_guard), and the guard that
    tells whether the run opened is still the committed one."""
    try:
        found = verify.open_root(str(url), storage_options)
    except verify.CannotOpen as e:
        raise DatasetError(str(e)) from None
    if found is None:
        raise UncommittedDataset(f"{url}: {verify.UNFINISHED}")
    root = read_guard.open_group(str(url), storage_options)
    attrs = dict(root.attrs)
    unfinished = verify.check_commit(attrs)
    if unfinished:
        raise UncommittedDataset(f"{url}: {unfinished}")
    problems = verify.check_format(attrs) or verify.check_owned(str(url), attrs, storage_options)
    if problems:
        raise DatasetError(f"{url}: {problems[0]}")
    return root, RunGuard(str(url), storage_options, root.metadata.zarr_format, read_guard.run_identity(attrs))


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


def window_length(length) -> int:
    """A window length as a positive int (blend and loaders check theirs so too); ValueError otherwise."""
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


def segments(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment_ids, positions) of encoded window(s), int32, along the last axis: for trainers
    that mask attention across documents. A new segment starts at every start bit and at the
    window's first token; segment ids count from 1 in each window, and a token's position is
    its distance from its segment's first token."""
    starts = (np.asarray(window, dtype=np.uint32) & np.uint32(1)).astype(bool)
    starts[..., :1] = True
    length = starts.shape[-1]
    segment_ids = np.cumsum(starts, axis=-1, dtype=np.int32)
    index = np.arange(length, dtype=np.int32)
    began = np.where(starts, index, 0)
    np.maximum.accumulate(began, axis=-1, out=began)
    return segment_ids, index - began


class Batch(NamedTuple):
    """A packed batch with what was asked for beside inputs and targets (else None): all of
    shape (rows, length). segment_ids and positions are int32 (see `segments`); sources, the
    source id (uint16, `FlatTokensSplit.source_names`) of the sequence each token belongs to."""

    inputs: np.ndarray
    targets: np.ndarray
    segment_ids: np.ndarray | None = None
    positions: np.ndarray | None = None
    sources: np.ndarray | None = None


def batch_of(windows: np.ndarray, sources: np.ndarray | None, with_segments: bool):
    """(inputs, targets), or a Batch when segments or sources were asked for."""
    inputs, targets = inputs_targets(windows)
    if not with_segments and sources is None:
        return inputs, targets
    segment_ids, positions = segments(windows) if with_segments else (None, None)
    return Batch(inputs, targets, segment_ids, positions, sources)


def checked_count(value, what: str, minimum: int = 1) -> int:
    """value as an int >= minimum; anything else raises TypeError or ValueError naming it."""
    try:
        k = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}") from None
    if k < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {k}")
    return k


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _read_unit(arr: zarr.Array, items: int) -> int:
    """About `items`, rounded up to whole chunks of arr, so aligned reads never split a chunk."""
    return _round_up(max(1, items), max(1, int(arr.chunks[0])))


class _LanePiece:
    """One piece of one lane (BatchOrder.piece_at): its rows, read by background futures (only
    those a served step needs), and with `sources` each token's source id beside them."""

    def __init__(self, piece: Piece, rows: np.ndarray, sources: np.ndarray | None, reads: list[Future]):
        self.first, self.end, self.serving = piece.first, piece.end, piece.serving
        self.rows, self.sources, self._reads = rows, sources, reads

    def windows(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The encoded windows served at `steps` (all in this piece) and their tokens' sources
        (or None): copies."""
        while self._reads:
            self._reads.pop().result()  # waits for the read; re-raises its error here
        rows = self.serving[steps - self.first]
        return self.rows[rows], None if self.sources is None else self.sources[rows]


def serves_steps(start: int, every: int = 1):
    """wanted(first, end) for a process that serves the steps start, start + every, ...: a mask
    over the steps [first, end), true where the step is served (LaneStream reads only those)."""
    def wanted(first: int, end: int) -> np.ndarray:
        steps = np.arange(first, end, dtype=np.int64)
        return (steps >= start) & ((steps - start) % every == 0)
    return wanted


class LaneStream:
    """One lane of a split's BatchOrder (one row of every global batch), served by step as steps
    rise, read piece by piece (the next piece in the background, by `pool`). `wanted`
    (serves_steps) marks the steps this process serves: only their windows are read. Used by
    FlatTokensSplit.packed_batches and by flat_tokens.blend."""

    def __init__(self, split: "FlatTokensSplit", order: BatchOrder, lane: int, length: int,
                 pool: ThreadPoolExecutor, with_sources: bool = False, total: int | None = None, wanted=None):
        self._split, self._order, self._lane, self._length, self._pool = split, order, lane, length, pool
        self._with_sources, self._total, self._wanted = with_sources, total, wanted
        self._current = self._upcoming = None

    def _start(self, step: int) -> _LanePiece:
        return self._split._read_piece(self._order.piece_at(self._lane, step), self._length, self._pool,
                                       self._with_sources, self._wanted)

    def start(self, step: int) -> None:
        """Starts reading the piece that serves `step` (so that every lane's first read is queued
        before any lane's next one)."""
        if self._current is None or not self._current.first <= step < self._current.end:
            self._current, self._upcoming = self._start(step), None

    def windows(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The encoded windows this lane serves at `steps` (rising) and their tokens' sources (or
        None)."""
        pieces, sources, i = [], [], 0
        while i < steps.size:
            step = int(steps[i])
            if self._current is None or not self._current.first <= step < self._current.end:
                upcoming = self._upcoming
                self._current = (upcoming if upcoming is not None and upcoming.first <= step < upcoming.end
                                 else self._start(step))
                self._upcoming = None
            j = i + int(np.searchsorted(steps[i:], self._current.end))
            windows, window_sources = self._current.windows(steps[i:j])
            pieces.append(windows)
            sources.append(window_sources)
            i = j
            if self._upcoming is None and (self._total is None or self._current.end < self._total):
                self._upcoming = self._start(self._current.end)  # read in the background
        if len(pieces) == 1:
            return pieces[0], sources[0]
        if not pieces:
            return (np.empty((0, self._length), np.uint32),
                    np.empty((0, self._length), np.uint16) if self._with_sources else None)
        return np.concatenate(pieces), None if sources[0] is None else np.concatenate(sources)


def _ids_of(blocks: Iterator[tuple[np.ndarray, np.ndarray]], encoded: bool) -> Iterator[np.ndarray]:
    """One array per sequence from (encoded, bounds) blocks: ids (int32), or the encoded tokens."""
    for enc, bounds in blocks:
        offsets = bounds.tolist()
        values = enc if encoded else (enc >> np.uint32(1)).view(np.int32)  # decoded once per block
        for a, b in zip(offsets, offsets[1:]):
            yield values[a:b].copy()  # its own array: a sequence kept by the caller pins no block


class FlatTokensSplit:
    """One split (``train`` or ``validation``) of a committed flat-tokens dataset."""

    def __init__(self, url: str, split: str = "train", storage_options: dict | None = None, *,
                 _opened: tuple[zarr.Group, RunGuard] | None = None, _identity: str | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.url = str(url)
        self.split = split
        self.storage_options = dict(storage_options or {})
        root, self._guard = _opened if _opened is not None else _open_committed_root(self.url, self.storage_options)
        if _identity is not None and _identity != self._guard.identity:
            # An unpickled split must go on reading the run its original opened, not a newer one.
            raise DatasetReplaced(f"{self.url}: the dataset was replaced after this reader was opened (run "
                                  f"{_identity} was opened, the committed one is now {self._guard.identity}); "
                                  f"open it again to read the new one")
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
        self._sources = None
        if SEQ_SOURCES in group:  # written with --record_sources
            self._sources = _member(group, self.url, split, SEQ_SOURCES, "u", 2)
            if self._sources.shape[0] != self.num_sequences:
                raise DatasetError(f"{self.url}: {split}/{SEQ_SOURCES} has {self._sources.shape[0]} entries for "
                                   f"{self.num_sequences} sequences")
        # Every chunk read is checked against the checksum it carries (None: a dataset written
        # before chunks carried one, read unchecked).
        self.chunk_checksums: str | None = chunk_checksums.of_dataset(self.attrs)
        for arr in (self._tokens, self._starts, self._sources):
            if arr is not None:
                read_guard.check_chunks(arr, arr.path, self.chunk_checksums)
        names = self.attrs.get("sources")
        self.source_names: list[str] | None = list(names) if self._sources is not None and names else None
        self._checks = self._check_ends()

    def _check_ends(self) -> served_checks.SplitChecks:
        """The checks of what this split serves (flat_tokens/served_checks.py), after the first
        one: seq_starts begins at 0 and ends at the token count, so the arrays' shapes agree
        with the data (a shape edited larger would serve zeros, smaller would never end)."""
        checks = served_checks.SplitChecks(self.url, self.split, self.num_tokens, self.num_sequences,
                                           self.max_token_id, int(self._tokens.chunks[0]), int(self._starts.chunks[0]))
        n = self.num_sequences
        if n == 0:  # seq_starts == [0]: zarr stores no chunk that holds the fill value alone
            checks.ends(0, 0)
        else:
            checks.ends(int(read_guard.read(self._starts, 0, 1)[0]), int(read_guard.read(self._starts, n, n + 1)[0]))
        return checks

    # -- pickling: by URL, so workers reopen the store themselves -------------------------------
    def __getstate__(self):
        return {"url": self.url, "split": self.split, "storage_options": self.storage_options,
                "run": self._guard.identity}

    def __setstate__(self, state):
        self.__init__(state["url"], state["split"], state["storage_options"], _identity=state.get("run"))

    @property
    def run_id(self) -> str:
        """The run whose dataset this reader serves (its `run_id`, or a digest of the root
        attributes of a dataset without one). Every read checks that it is still the committed
        one at the URL, and raises DatasetReplaced otherwise."""
        return self._guard.identity

    def _read(self, arr, lo: int, hi: int, check: bool = True) -> np.ndarray:
        """arr[lo:hi]: a missing chunk raises MissingChunk (read_guard), and with `check` the run
        is confirmed after the read, so the values are the opened run's or an error is raised."""
        try:
            values = read_guard.read(arr, lo, hi)
            if arr is self._tokens:  # what is served is checked as it is read (served_checks)
                self._checks.tokens(values, lo)
            elif arr is self._starts:
                self._checks.starts(values, lo)
        except DatasetReplaced:
            raise
        except DatasetError:
            # Another run's objects fail the opened run's manifest and checks: a dataset replaced
            # under the reader is said to be so, not called damaged.
            self._guard.check()
            raise
        if check:
            self._guard.check()
        return values

    def __repr__(self) -> str:
        return (f"FlatTokensSplit({self.url!r}, {self.split!r}: {self.num_sequences} sequences, "
                f"{self.num_tokens} tokens, max_token_id {self.max_token_id})")

    # -- unpacked access ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, i) -> np.ndarray:
        return self.sequence(i)

    def __iter__(self) -> Iterator[np.ndarray]:
        """Token ids (int32) of every sequence, in order, read block by block (iter_sequences)."""
        return self.iter_sequences()

    def iter_sequences(self, start: int = 0, stop: int | None = None) -> Iterator[np.ndarray]:
        """Token ids (int32) of sequences start..stop-1, in order: each chunk is read and
        decompressed once (see _sequence_blocks), unlike a loop over sequence(i)."""
        return _ids_of(self._sequence_blocks(*self._range(start, stop)), encoded=False)

    def iter_encoded(self, start: int = 0, stop: int | None = None) -> Iterator[np.ndarray]:
        """The stored (encoded, uint32) tokens of sequences start..stop-1, in order, like
        iter_sequences."""
        return _ids_of(self._sequence_blocks(*self._range(start, stop)), encoded=True)

    def _range(self, start, stop) -> tuple[int, int]:
        stop = self.num_sequences if stop is None else stop
        start, stop = checked_count(start, "start", 0), checked_count(stop, "stop", 0)
        if not start <= stop <= self.num_sequences:
            raise IndexError(f"sequence range [{start}, {stop}) not within [0, {self.num_sequences}]")
        return start, stop

    def _sequence_blocks(self, start: int, stop: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Sequences start..stop-1 in order, as (encoded, bounds) pairs: `encoded` holds whole
        sequences and `bounds` (int64, one longer) their offsets in it.

        Both arrays are read forward in chunk-aligned reads of about TOKENS_READ tokens and
        STARTS_READ starts, so each chunk is decompressed once. A sequence that crosses a read's
        end is completed by the next read; one longer than a read comes out whole from one larger
        read. Memory: about one read of each array, or the longest sequence if it is longer."""
        if start == stop:
            return
        t_unit, s_unit = _read_unit(self._tokens, TOKENS_READ), _read_unit(self._starts, STARTS_READ)
        buf, buf_lo, buf_hi = np.empty(0, np.uint32), -1, -1  # buf = encoded_tokens[buf_lo:buf_hi]
        carry: list[int] = []  # the last start read: the first bound of the next read's sequences
        lo = start
        while lo <= stop:  # seq_starts[start:stop + 1], one aligned read at a time
            hi = min(stop + 1, (lo // s_unit + 1) * s_unit)
            read = self._read(self._starts, lo, hi)
            self._checks.starts(read[:1], lo, carry[0] if carry else None)  # continues the last read
            bounds = np.concatenate([np.array(carry, np.int64), read.astype(np.int64)])
            first_sequence = lo - len(carry)  # the sequence that starts at bounds[0]
            carry, lo = [int(bounds[-1])], hi
            if buf_hi < 0:
                buf_lo = buf_hi = int(bounds[0]) // t_unit * t_unit
            i, n = 0, bounds.size - 1
            while i < n:
                a = int(bounds[i])
                if bounds[i + 1] > buf_hi:  # sequence i ends beyond the buffer: read on, aligned
                    new_hi = min(self.num_tokens, _round_up(int(bounds[i + 1]), t_unit))  # > buf_hi: checked
                    new = self._read(self._tokens, buf_hi, new_hi)
                    if a < buf_hi:
                        buf, buf_lo = np.concatenate([buf[a - buf_lo:], new]), a
                    else:
                        buf, buf_lo = new, buf_hi
                    buf_hi = new_hi
                j = min(n, int(np.searchsorted(bounds, buf_hi, "right")) - 1)  # i..j-1 are whole in buf
                whole, offsets = buf[a - buf_lo:int(bounds[j]) - buf_lo], bounds[i:j + 1] - a
                self._checks.sequences_begin(whole, offsets[:-1], first_sequence + i, a)
                yield whole, offsets
                i = j

    def sequence_bounds(self, i) -> tuple[int, int]:
        """[start, end) of sequence i in encoded_tokens: one read of seq_starts[i:i+2]."""
        k = _index(i, self.num_sequences, "sequence")
        a, b = (int(x) for x in self._read(self._starts, k, k + 2))
        return a, b

    def encoded_sequence(self, i) -> np.ndarray:
        """The stored (encoded) tokens of sequence i: two reads (and one check of the run)."""
        k = _index(i, self.num_sequences, "sequence")
        a, b = (int(x) for x in self._read(self._starts, k, k + 2, check=False))
        encoded = self._read(self._tokens, a, b)
        self._checks.sequences_begin(encoded, np.zeros(1, np.int64), k, a)
        return encoded

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
        return np.diff(self._read(self._starts, lo, hi + 1).astype(np.int64))

    def iter_sequence_lengths(self, block: int = 1 << 20) -> Iterator[np.ndarray]:
        """All sequence lengths, in order, in blocks of at most `block` (bounded memory)."""
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        for lo in range(0, self.num_sequences, block):
            yield self.sequence_lengths(lo, min(self.num_sequences, lo + block))

    # -- sources (datasets written with --record_sources) --------------------------------------
    def _need_sources(self):
        if self._sources is None:
            raise DatasetError(f"{self.url}: {self.split} has no {SEQ_SOURCES} array: the dataset was written "
                               f"without --record_sources (or --mixture)")
        return self._sources

    def sources(self, i):
        """The source id of sequence i (an int), or of the sequences of a slice (a uint16
        array); ``source_names[id]`` is its name."""
        arr = self._need_sources()
        if isinstance(i, slice):
            lo, hi, step = i.indices(self.num_sequences)
            return self._read(arr, lo, max(lo, hi))[::step]
        k = _index(i, self.num_sequences, "sequence")
        return int(self._read(arr, k, k + 1)[0])

    def sequence_at(self, token: int) -> int:
        """The sequence holding token `token` (in [0, num_tokens)): a few chunk reads of
        seq_starts, however large the split."""
        found = self._sequence_at(_index(token, self.num_tokens, "token"), {})
        self._guard.check()
        return found

    def _sequence_at(self, token: int, firsts: dict) -> int:
        """sequence_at: a binary search over seq_starts' chunks (their first entries, remembered
        in `firsts`), then one chunk read. The caller checks the run."""
        unit = int(self._starts.chunks[0])
        lo, hi = 0, (self.num_sequences + unit) // unit - 1  # chunks 0..hi; chunk 0 starts at token 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid not in firsts:
                firsts[mid] = int(self._read(self._starts, mid * unit, mid * unit + 1, check=False)[0])
            lo, hi = (mid, hi) if firsts[mid] <= token else (lo, mid - 1)
        starts = self._read(self._starts, lo * unit, min((lo + 1) * unit, self.num_sequences + 1), check=False)
        return lo * unit + int(np.searchsorted(starts, np.uint64(token), "right")) - 1

    def _token_sources(self, encoded: np.ndarray, first_token: int, firsts: dict) -> np.ndarray:
        """The source id (uint16) of each of the tokens encoded_tokens[first_token:...] given."""
        if encoded.size == 0:
            return np.empty(0, np.uint16)
        bits = (encoded & np.uint32(1)).astype(np.int64)
        first = self._sequence_at(first_token, firsts)
        of = np.cumsum(bits) - bits[0]  # sequence of each token, counted from `first`
        ids = self._read(self._sources, first, first + int(of[-1]) + 1, check=False)
        return ids[of]

    # -- packed access --------------------------------------------------------------------------
    def num_windows(self, length: int, partial: bool = False) -> int:
        """Full windows of `length` tokens; with partial=True, plus the shorter last one if any."""
        length = window_length(length)
        full, rest = divmod(self.num_tokens, length)
        return full + (1 if partial and rest else 0)

    def packed(self, i, length: int, partial: bool = False) -> np.ndarray:
        """Encoded window i: ``encoded_tokens[i*length:(i+1)*length]`` (one read, uint32).

        Full windows only unless partial=True, which also serves the last, shorter window."""
        length = window_length(length)
        k = _index(i, self.num_windows(length, partial), f"window (length {length})")
        return self._read(self._tokens, k * length, min(self.num_tokens, (k + 1) * length))

    def packed_inputs_targets(self, i, length: int, partial: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of window i, int32, per the format's rule (see inputs_targets)."""
        return inputs_targets(self.packed(i, length, partial))

    def packed_batch(self, indices: Iterable[int], length: int, *, segments: bool = False,
                     sources: bool = False):
        """(inputs, targets), each int32 of shape (len(indices), length): one read per window.

        With segments=True or sources=True, a Batch that also holds segment_ids and positions
        (see `segments`) or each token's source id."""
        length = window_length(length)
        if sources:
            self._need_sources()
        indices = list(indices)
        windows = np.empty((len(indices), length), np.uint32)
        token_sources = np.empty((len(indices), length), np.uint16) if sources else None
        n, firsts = self.num_windows(length), {}
        for row, i in enumerate(indices):
            k = _index(i, n, f"window (length {length})")
            windows[row] = self._read(self._tokens, k * length, (k + 1) * length, check=False)
            if sources:
                token_sources[row] = self._token_sources(windows[row], k * length, firsts)
        if indices:
            self._guard.check()  # once for the batch: every window read before it is the opened run's
        return batch_of(windows, token_sources, segments)

    def packed_batches(self, length: int, batch_size: int, *, seed: int = 0, start_step: int = 0,
                       epochs: int | None = None, rank: int = 0, world_size: int = 1, segments: bool = False,
                       sources: bool = False, block_tokens: int = BLOCK_TOKENS,
                       buffer_blocks: int = BUFFER_BLOCKS) -> Iterator:
        """Shuffled batches of full windows: (inputs, targets), int32 of shape
        (batch_size / world_size, length).

        Global batch k is a pure function of (seed, k) and the arguments other than rank and
        world_size: row j of every batch is lane j's window (flat_tokens/batch_order.py). Each
        epoch the m = num_windows // batch_size windows of lane j are the slice [j*m, (j+1)*m)
        of the epoch's shuffled sequence of blocks (the num_windows % batch_size left over sit
        out that epoch, a different few each epoch), served in a seeded order; an epoch is m
        steps, and every batch is full. ``start_step=k`` resumes exactly at batch k without
        reading what precedes it. With ``epochs=None`` the stream never ends; ``epochs=n`` ends
        it after n * m steps. A split with fewer full windows than batch_size raises ValueError.

        Data parallel hosts: ``rank=r, world_size=w`` (w must divide batch_size; ValueError
        naming the nearest world sizes that do) serves the rows [r*B/w, (r+1)*B/w) of every
        global batch, B = batch_size: lanes whose slices together are a contiguous 1/w of each
        epoch, so a host reads about 1/w of the split per epoch. The hosts' rows at step k,
        concatenated by rank, are the single-host batch k for every such w, so a job resumed at
        step k on another number of hosts continues the same global stream exactly.

        ``segments=True`` and ``sources=True`` make each batch a Batch with segment_ids and
        positions (see `segments`), or each token's source id (datasets written with
        --record_sources), beside inputs and targets.

        Reads are contiguous runs of whole windows inside blocks of about `block_tokens` tokens;
        each lane holds a piece of max(1, buffer_blocks // batch_size) blocks at a time, and
        reads its next one in the background. Memory: about 2 * 4 * block_tokens *
        max(buffer_blocks, batch_size) / world_size bytes (256 MB with the defaults and
        batch_size <= 32 on one host). The order depends on block_tokens and buffer_blocks:
        resume with the same values."""
        length = window_length(length)
        batch_size = checked_count(batch_size, "batch_size")
        start_step = checked_count(start_step, "start_step", 0)
        lanes = host_rows(batch_size, rank, world_size)
        if sources:
            self._need_sources()
        if epochs is not None:
            epochs = checked_count(epochs, "epochs", 0)
        order = self._batch_order(length, batch_size, seed, block_tokens, buffer_blocks)
        return self._packed_batches(order, length, lanes, start_step, epochs, segments, sources)

    def _batch_order(self, length: int, batch_size: int, seed, block_tokens, buffer_blocks) -> BatchOrder:
        """The window order of packed_batches; ValueError when a lane would get no window."""
        seed = checked_count(seed, "seed", 0)
        if seed >= 1 << 64:
            raise ValueError(f"seed must be < 2**64, got {seed}")
        n = self.num_windows(length)
        if n < batch_size:
            held = f"holds no full window of {length} tokens" if n == 0 else \
                f"holds {n} full windows of {length} tokens, fewer than batch_size {batch_size}"
            raise ValueError(f"{self.url}:{self.split} {held} ({self.num_tokens} tokens): there is nothing to "
                             f"serve{'' if n == 0 else ' to every row of a batch'}")
        lane_blocks = max(1, checked_count(buffer_blocks, "buffer_blocks") // batch_size)
        return BatchOrder(n, batch_size, max(1, checked_count(block_tokens, "block_tokens") // length), lane_blocks, seed)

    def _packed_batches(self, order: BatchOrder, length: int, lanes: range, start_step: int, epochs: int | None,
                        with_segments: bool, with_sources: bool, every: int = 1) -> Iterator:
        """This host's batches (rows `lanes` of the global ones): steps start_step, start_step +
        every, ... (a DataLoader worker serves every `every`-th step, and reads only their windows)."""
        total = None if epochs is None else epochs * order.per_lane  # steps of the stream
        pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="flat-tokens-read")
        try:
            streams = [LaneStream(self, order, j, length, pool, with_sources, total, serves_steps(start_step, every))
                       for j in lanes]
            if total is None or start_step < total:
                for stream in streams:
                    stream.start(start_step)
            step = start_step
            while total is None or step < total:
                # SPAN steps at a time, lane by lane (one gather per lane, not one per window).
                steps = step + every * np.arange(SPAN, dtype=np.int64)
                if total is not None:
                    steps = steps[steps < total]
                windows = np.empty((steps.size, len(streams), length), np.uint32)
                token_sources = np.empty(windows.shape, np.uint16) if with_sources else None
                for row, stream in enumerate(streams):
                    windows[:, row], lane_sources = stream.windows(steps)
                    if with_sources:
                        token_sources[:, row] = lane_sources
                for t in range(steps.size):
                    yield batch_of(windows[t], None if token_sources is None else token_sources[t], with_segments)
                step += every * steps.size
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _read_piece(self, piece: Piece, length: int, pool: ThreadPoolExecutor, with_sources: bool = False,
                    wanted=None) -> _LanePiece:
        """A lane's piece, its windows read by `pool`: of each run, the span from the first to the
        last row served at a step `wanted(first, end)` marks (all of them without `wanted`)."""
        size = piece.end - piece.first
        rows = np.empty((size, length), np.uint32)
        token_sources = np.empty((size, length), np.uint16) if with_sources else None
        needed = np.ones(size, bool)
        if wanted is not None:
            needed[:] = False
            needed[piece.serving[wanted(piece.first, piece.end)]] = True
        reads, row, firsts = [], 0, {}
        for window, count in piece.runs:
            used = np.flatnonzero(needed[row:row + count])
            if used.size:
                a, z = row + int(used[0]), row + int(used[-1]) + 1
                out_sources = None if token_sources is None else token_sources[a:z]
                reads.append(pool.submit(self._read_windows, rows[a:z], window + a - row, length, out_sources, firsts))
            row += count
        return _LanePiece(piece, rows, token_sources, reads)

    def _read_windows(self, out: np.ndarray, window: int, length: int, out_sources: np.ndarray | None = None,
                      firsts: dict | None = None) -> None:
        """Reads len(out) consecutive windows, from `window` on, into out: one contiguous read
        (and their tokens' sources into out_sources), then one check of the run."""
        flat = self._read(self._tokens, window * length, (window + len(out)) * length, check=False)
        out[...] = flat.reshape(out.shape)
        if out_sources is not None:
            out_sources[...] = self._token_sources(flat, window * length, firsts).reshape(out.shape)
        self._guard.check()


def open_dataset(url: str, storage_options: dict | None = None) -> dict[str, FlatTokensSplit]:
    """Both splits of a committed dataset: ``{"train": ..., "validation": ...}``."""
    opened = _open_committed_root(str(url), storage_options)
    return {s: FlatTokensSplit(url, s, storage_options, _opened=opened) for s in SPLITS}
