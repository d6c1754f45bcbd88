"""Verify a flat-tokens dataset written by this pipeline (see docs: flat-tokens format).

    python -m flat_tokens.tools.verify PATH_OR_URL [--block N] [--storage_option KEY=VALUE ...]

Checks, for a dataset at a local path or fsspec URL (file://, gs://, ...), zarr format 2 or 3:

* the commit protocol: the root group metadata exists (it is written last), its attributes say
  ``format == "flat-tokens"`` and ``complete is True``; otherwise the output is unfinished;
* both splits ``train`` and ``validation`` exist and each is a flat-tokens array:
  ``encoded_tokens`` 1-D uint32, ``seq_starts`` 1-D uint64, an integer ``max_token_id``
  attribute;
* every data object the arrays' shapes imply is stored: each chunk (with zarr v3 sharding,
  each shard object), found by one listing per array. zarr reads a missing chunk as zeros,
  which no other check could tell from data; ``seq_starts[0] == 0``, ``seq_starts[-1] == len(encoded_tokens)``, strictly
  increasing (no empty sequences); the start bit (``v & 1``) set exactly at ``seq_starts[:-1]``;
* ``max_token_id`` is exact: for a non-empty split it equals the largest decoded id
  (``v >> 1``), because this pipeline writes the exact maximum. For an empty split there is
  no maximum to match, so any integer in ``[0, 2**31 - 1]`` is accepted (the pipeline's
  choice, typically 0, is not part of the contract);
* every chunk matches the checksum it carries (flat_tokens/format/chunk_checksums.py; the
  scheme is the root attribute ``storage.checksums``): the walk below reads every chunk, and
  each is checked as it is read; a damaged or truncated chunk is named. A dataset written
  before chunks carried checksums is checked as before, and verify says that its chunks
  carry none (a flipped bit there may go unseen);
* with the dataset's manifest (flat_tokens/format/manifest.py), every object read (metadata and
  chunks) is the one committed under its key, and the manifest and the root attributes match
  their seal; a dataset without one is checked as before, and verify says so. Shapes far beyond
  the stats, or more data objects than this tool writes, stop a split before anything is
  listed or allocated by them; metadata naming a codec or dtype this format does not use is
  exit 2;
* when the root has a ``stats`` attribute, ``stats[split]`` agrees with the arrays:
  ``sequences == len(seq_starts) - 1``, ``tokens == len(encoded_tokens)``,
  ``max_token_id ==`` the split attribute.

Memory is O(--block) whatever the size of the arrays: ``encoded_tokens`` is walked in blocks
and ``seq_starts`` is streamed alongside in blocks (merge style), never read whole.

Exit status: 0 when every check holds, 1 on any violation (including an unfinished output),
2 when the path does not exist or cannot be opened as a zarr group.
"""
from __future__ import annotations

import argparse
import json
import posixpath
import sys
from dataclasses import dataclass

import fsspec
import numpy as np
import zarr

from flat_tokens import VERSION
from flat_tokens import read_guard
from flat_tokens.format import storage_faults
from flat_tokens.format.gcs import close_gcs_sessions_at_exit
from flat_tokens.format.own_names import is_own_name
from flat_tokens.format.index_files import index_problems
from flat_tokens.format import chunk_checksums
from flat_tokens.format.chunk_objects import chunk_objects, missing_objects
from flat_tokens.format.claims import conflicts, refusals

# After `import zarr`, so gcsfs sessions on zarr's event loop close before zarr stops it.
close_gcs_sessions_at_exit()

SPLITS = ("train", "validation")
MAX_ID = 2**31 - 1
DEFAULT_BLOCK = 1 << 22
# What a user does next: the command that made an unfinished output resumes it (issue 20).
RERUN = "rerun the command that wrote it to resume it, or any command with --overwrite to replace it"
UNFINISHED = f"unfinished output: the run that wrote it did not finish (no root group metadata); {RERUN}"
NO_MANIFEST = ("note: this dataset has no manifest (it was committed before this tool wrote one, or by another "
               "tool): a chunk moved to another key, or copied from another build, may be read unseen. Rewrite it "
               "(rerun its command with --overwrite) to have every object checked against its key")
# More data objects than any array this tool writes (1 TB of text: ~890,000 in all): the
# listing of which are missing stays within a few hundred MB.
MAX_OBJECTS = 1 << 24
NO_CHECKSUMS = ("note: the chunks of this dataset carry no checksums, and it has no manifest (it was written "
                "before this tool's chunks carried them, or by another tool): a flipped bit in a chunk may decode "
                "to other token ids unseen, and a chunk moved to another key may be read unseen. "
                "Rewrite it (rerun its command with --overwrite) to have every chunk checked")


class CannotOpen(Exception):
    """The dataset path does not exist or is not a zarr group (exit status 2)."""


class _Stop(Exception):
    """A split is broken in a way that makes further checks of it meaningless; carries the message."""


@dataclass(frozen=True)
class SplitSummary:
    sequences: int
    tokens: int
    max_id: int  # largest decoded id, -1 for an empty split
    max_token_id: int | None  # the split attribute, None when missing or invalid


# ---------------------------------------------------------------------------------------------
# Public API


def verify_dataset(url: str, *, block: int = DEFAULT_BLOCK, storage_options: dict | None = None) -> list[str]:
    """Returns the problems found in the dataset at `url` (empty when it is valid).

    Raises CannotOpen when `url` does not exist or is not a zarr group."""
    return check_dataset(url, block=block, storage_options=storage_options)[0]


def check_dataset(url: str, *, block: int = DEFAULT_BLOCK, storage_options: dict | None = None,
                  notes: list | None = None) -> tuple[list[str], dict[str, SplitSummary]]:
    """Like verify_dataset, also returning a summary of every split that could be walked.
    `notes`: a list that receives what is worth saying but is no problem (chunks that carry
    no checksums)."""
    if block < 1:
        raise ValueError(f"block must be >= 1, is {block}")
    root = open_root(url, storage_options)
    if root is None:
        return [UNFINISHED] + check_conflicts(url, storage_options), {}
    attrs = dict(root.attrs)
    unfinished = check_commit(attrs)
    if unfinished:
        # Data of an unfinished run may be half written: checking it would only add noise.
        return [unfinished] + check_conflicts(url, storage_options), {}
    problems = check_owned(url, attrs, storage_options) + check_format(attrs)
    scheme = chunk_checksums.of_dataset(attrs)
    if scheme is None and notes is not None:
        notes.append(NO_CHECKSUMS)
    elif scheme not in (None, *chunk_checksums.SCHEMES):
        problems.append(f"root attribute storage.checksums is {scheme!r}: a checksum scheme this version does not "
                        f"know ({', '.join(chunk_checksums.SCHEMES)}); its chunks cannot be checked")
        scheme = None
    # Read again through the store that checks each chunk as it is read (flat_tokens/read_guard.py),
    # and every object against the manifest when the dataset has one.
    try:
        root = read_guard.open_group(url, storage_options)
    except read_guard.UnsupportedDataset as e:
        raise CannotOpen(str(e)) from None
    except read_guard.DatasetError as e:
        return problems + [str(e)], {}
    if root.store_path.store.manifest is None and scheme is not None and notes is not None:
        notes.append(NO_MANIFEST)  # (without checksums, NO_CHECKSUMS says so already)
    fs, base = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    summaries: dict[str, SplitSummary] = {}
    try:
        problems += _check_splits(root, attrs, fs, base, block, scheme, summaries)
    except read_guard.UnsupportedDataset as e:  # exit 2: not a dataset this tool reads
        raise CannotOpen(str(e)) from None
    except read_guard.DatasetError as e:  # metadata that does not match the manifest
        problems.append(str(e))
    return problems, summaries


def _check_splits(root: zarr.Group, attrs: dict, fs, base: str, block: int, scheme: str | None,
                  summaries: dict) -> list[str]:
    problems = []
    for name in SPLITS:
        if name not in root:
            problems.append(f"missing split group {name}")
            continue
        group = root[name]
        if not isinstance(group, zarr.Group):
            problems.append(f"{name} must be a group, is an array")
            continue
        split_problems, summary = check_split(group, name, block, stored=(fs, f"{base.rstrip('/')}/{name}"),
                                              checksums=scheme, expected=expected_lengths(attrs, name))
        problems += split_problems
        if summary is not None:
            summaries[name] = summary
    if "stats" in attrs:
        problems += check_stats(attrs["stats"], summaries)
    if isinstance(attrs.get("stats"), dict) and attrs["stats"].get("dedup_index"):  # --dedup exact or near
        problems += index_problems(fs, base, attrs["stats"]["dedup_index"], root.store_path.store.manifest)
    problems += check_sources(root, attrs, summaries, block)
    return problems


# ---------------------------------------------------------------------------------------------
# Opening and root checks


def open_root(url: str, storage_options: dict | None = None) -> zarr.Group | None:
    """Opens the root group read-only; None when the output exists but was never committed."""
    options = dict(storage_options or {})
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
        fs.invalidate_cache(path)  # gcsfs keeps listings: a dataset deleted since is not there
        exists = storage_faults.call(fs, lambda: fs._exists(path) if fs.async_impl else fs.exists(path), url)
    except storage_faults.StorageUnavailable:
        raise
    except Exception as e:  # bad protocol, credentials: the user must fix the URL
        raise CannotOpen(f"cannot open {url}: {type(e).__name__}: {e}") from None
    if not exists:
        raise CannotOpen(f"{url} does not exist")
    try:
        # Through the guarded store: a metadata document cut short in transit is read again.
        return zarr.open_group(store=read_guard.open_store(url, options), mode="r")
    except storage_faults.StorageUnavailable:
        raise
    except Exception as e:
        # The root metadata is written last, so split children without it mean a crashed run.
        base = path.rstrip("/")
        if any(fs.exists(f"{base}/{name}") for name in SPLITS) or \
                any(is_own_name(posixpath.basename(p.rstrip("/"))) for p in fs.ls(base, detail=False)):
            return None  # split groups, or only what a run writes first: its claim, its staging area
        raise CannotOpen(f"{url} is not a zarr group ({type(e).__name__}: {e})") from None


def check_conflicts(url: str, storage_options: dict | None = None) -> list[str]:
    """A conflict record means another run may have written into this output (see
    transforms/write/ownership.py): its data cannot be trusted, whatever the arrays say."""
    return [f"conflict record {name}: another run may have written into this output while it was being "
            f"written; rerun with --overwrite" for name in conflicts(url, storage_options)]


def check_owned(url: str, attrs: dict, storage_options: dict | None = None) -> list[str]:
    """Why a committed dataset cannot be trusted as its run's: conflict records, or a newer
    claim than the committing run's (ownership.refusals). The reader and export refuse it."""
    run_id = attrs.get("run_id")
    return refusals(url, run_id if isinstance(run_id, str) else "", storage_options)


def check_commit(attrs: dict) -> str | None:
    """The unfinished-output message when the root attributes do not mark a finished run."""
    complete = attrs.get("complete")
    if complete is not True:
        return (f"unfinished output: root attribute complete is {complete!r}, not true, so the run "
                f"that wrote it did not finish; {RERUN}")
    return None


def check_format(attrs: dict) -> list[str]:
    fmt = attrs.get("format")
    return [] if fmt == "flat-tokens" else [f"root attribute format is {fmt!r}, expected 'flat-tokens'"]


def check_stats(stats, summaries: dict[str, SplitSummary]) -> list[str]:
    """Compares the counts recorded at commit with the arrays (only for splits that were walked)."""
    if not isinstance(stats, dict):
        return [f"root attribute stats must be an object, is {stats!r}"]
    problems = []
    for key in ("documents", "rejected", "blank", "empty"):
        if key in stats and not _is_count(stats[key]):
            problems.append(f"stats.{key} must be a non-negative integer, is {stats[key]!r}")
    for name, summary in summaries.items():
        entry = stats.get(name)
        if not isinstance(entry, dict):
            problems.append(f"stats.{name} missing or not an object: {entry!r}")
            continue
        actual = {
            "sequences": (summary.sequences, "len(seq_starts) - 1"),
            "tokens": (summary.tokens, "len(encoded_tokens)"),
            "max_token_id": (summary.max_token_id, "the split attribute max_token_id"),
        }
        for key, (value, what) in actual.items():
            if key not in entry:
                problems.append(f"stats.{name}.{key} missing")
            elif value is not None and not (_is_int(entry[key]) and entry[key] == value):
                problems.append(f"stats.{name}.{key} = {entry[key]!r} disagrees with {name}: {what} = {value}")
    return problems


def _is_int(x) -> bool:
    # JSON true/false decode to bool, which is an int subclass but never a valid count.
    return isinstance(x, int) and not isinstance(x, bool)


def _is_count(x) -> bool:
    return _is_int(x) and x >= 0


# ---------------------------------------------------------------------------------------------
# One split


def expected_lengths(attrs: dict, split: str) -> dict[str, int]:
    """The arrays' lengths the root's `stats` give ({} when it gives none): a forged shape is
    found before any memory is sized by it."""
    stats = attrs.get("stats")
    split_stats = stats.get(split) if isinstance(stats, dict) else None
    if not isinstance(split_stats, dict) or not all(_is_count(split_stats.get(k)) for k in ("tokens", "sequences")):
        return {}
    return {"encoded_tokens": split_stats["tokens"], "seq_starts": split_stats["sequences"] + 1,
            "seq_sources": split_stats["sequences"]}


def check_bounds(arr: zarr.Array, member: str, expected: dict[str, int]) -> None:
    """The array's length is what the stats say, and its object count sane, before anything
    is allocated or listed by them (a forged 2**34-element shape once grew verify to 23 GB)."""
    n = arr.shape[0]
    if member in expected and n > 2 * expected[member] + (1 << 20):  # (a shape a little off is found below)
        raise _Stop(f"{member} has shape ({n},), the root's stats say {expected[member]}: the metadata was "
                    f"edited or belongs to another dataset; refusing to check it")
    objects = chunk_objects(arr.metadata.to_dict())
    if objects is not None and objects.count > MAX_OBJECTS:
        raise _Stop(f"{member} has shape ({n},) in blocks of {objects.block}: {objects.count} objects, more than "
                    f"any dataset this tool writes ({MAX_OBJECTS}); refusing to check it")


def check_split(group: zarr.Group, name: str, block: int, stored: tuple | None = None,
                checksums: str | None = None, expected: dict[str, int] | None = None
                ) -> tuple[list[str], SplitSummary | None]:
    """Checks one flat-tokens array; the summary is None when a structural problem stopped the walk.
    `stored`: (filesystem, path of the split's directory), to check that every chunk is stored.
    `checksums`: the scheme every chunk read is checked under (None: unchecked). `expected`:
    the arrays' lengths by the stats (expected_lengths)."""
    problems: list[str] = []
    try:
        tok = _member_array(group, "encoded_tokens", 4)
        st = _member_array(group, "seq_starts", 8)
        for member, arr in (("encoded_tokens", tok), ("seq_starts", st), ("seq_sources", group.get("seq_sources"))):
            if isinstance(arr, zarr.Array) and len(arr.shape) == 1:
                check_bounds(arr, member, expected or {})
        for arr in (tok, st, group.get("seq_sources")):
            if isinstance(arr, zarr.Array):
                read_guard.check_chunks(arr, arr.path, checksums)
        if stored is not None:
            arrays = [("encoded_tokens", tok), ("seq_starts", st)]
            extension = group.get("seq_sources")  # optional (--record_sources): stored whole too
            if isinstance(extension, zarr.Array) and len(extension.shape) == 1:
                arrays.append(("seq_sources", extension))
            lost = [p for member, arr in arrays for p in check_stored(stored[0], f"{stored[1]}/{member}", member, arr)]
            if lost:  # the walk would read zeros there: its findings would only add noise
                raise _Stop("; ".join(lost))
        attr_max, attr_problem = read_max_token_id(group.attrs)
        if attr_problem:
            problems.append(attr_problem)
        n, m = tok.shape[0], st.shape[0]
        check_ends(st, n)
        walk = walk_split(tok, st, block)
    except _Stop as e:
        return [f"{name}: {msg}" for msg in problems + [str(e)]], None
    problems += walk.problems()
    problems += check_max(walk, attr_max, n)
    summary = SplitSummary(sequences=m - 1, tokens=n, max_id=walk.max_id, max_token_id=attr_max)
    return [f"{name}: {msg}" for msg in problems], summary


def _member_array(group: zarr.Group, member: str, itemsize: int) -> zarr.Array:
    """The 1-D unsigned array `member`; any byte order is accepted (zarr decodes it)."""
    if member not in group:
        raise _Stop(f"missing array {member}")
    arr = group[member]
    if not isinstance(arr, zarr.Array):
        raise _Stop(f"{member} must be an array, is a group")
    want = f"uint{itemsize * 8}"
    if arr.dtype.kind != "u" or arr.dtype.itemsize != itemsize:
        raise _Stop(f"{member} has dtype {arr.dtype}, expected {want}")
    if len(arr.shape) != 1:
        raise _Stop(f"{member} has shape {arr.shape}, expected 1-D")
    return arr


def check_stored(fs, array_path: str, member: str, arr: zarr.Array) -> list[str]:
    """Every chunk (or shard object) the array's shape implies is stored: one listing."""
    objects = chunk_objects(arr.metadata.to_dict())
    if objects is None:
        return [f"{member}: its chunk layout is not a regular 1-D grid; cannot check that every chunk is stored"]
    lost = missing_objects(fs, array_path, objects)
    if not lost:
        return []
    what = "shard objects" if getattr(arr, "shards", None) else "chunks"
    n = arr.shape[0]
    shown = ", ".join(f"{i} = elements [{i * objects.block}, {min(n, (i + 1) * objects.block)})" for i in lost[:5])
    more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
    return [f"{member}: {len(lost)} of {objects.count} {what} missing from storage ({shown}{more}); "
            f"zarr would read them as zeros"]


def read_max_token_id(attrs) -> tuple[int | None, str | None]:
    """(value, problem): value is None when the attribute is missing or not a valid id bound."""
    if "max_token_id" not in attrs:
        return None, "missing attribute max_token_id"
    value = attrs["max_token_id"]
    if not _is_int(value):
        return None, f"max_token_id must be an integer, is {value!r} ({type(value).__name__})"
    if not 0 <= value <= MAX_ID:
        return None, f"max_token_id = {value} is outside [0, 2**31-1]"
    return value, None


def check_ends(st: zarr.Array, n: int) -> None:
    """seq_starts non-empty, first 0 and last n; reads two elements only."""
    m = st.shape[0]
    if m == 0:
        raise _Stop("seq_starts is empty, expected at least [0]")
    first = int(_read(st, "seq_starts", 0, 1)[0])
    if first != 0:
        raise _Stop(f"seq_starts[0] = {first}, expected 0")
    last = int(_read(st, "seq_starts", m - 1, m)[0])
    if last != n:
        raise _Stop(f"seq_starts[{m - 1}] (last) = {last}, expected len(encoded_tokens) = {n}")


def _read(arr: zarr.Array, member: str, lo: int, hi: int) -> np.ndarray:
    try:
        return read_guard.read(arr, lo, hi)
    except read_guard.CorruptChunk as e:  # names the chunk and the dataset
        raise _Stop(str(e)) from None
    except storage_faults.StorageUnavailable:
        raise  # says nothing about the data: the whole check fails, to be run again
    except Exception as e:  # a missing or unreadable chunk is a property of the data
        raise _Stop(f"cannot read {member}[{lo}:{hi}]: {type(e).__name__}: {e}") from None


class StartStream:
    """Streams seq_starts in blocks, checking strict increase on the way, and hands out its
    values in order below a moving limit.

    Memory: the buffer holds at most one read block plus the values below the current limit
    that were not handed out yet; strict increase (checked before a value is handed out)
    bounds the latter by the width of the token block asking for them."""

    def __init__(self, arr: zarr.Array, block: int):
        self._arr, self._block = arr, block
        self._len = arr.shape[0]
        self._next = 0  # index of the first element not read yet
        self._buf = np.empty(0, np.uint64)  # read, not handed out yet
        self._last: int | None = None  # last value read, to check increase across blocks

    def take_below(self, limit: int) -> np.ndarray:
        """All values < limit not handed out yet (uint64, increasing)."""
        while (self._buf.size == 0 or self._buf[-1] < limit) and self._next < self._len:
            self._buf = np.concatenate([self._buf, self._read_block()])
        k = int(np.searchsorted(self._buf, np.uint64(limit), side="left"))
        taken, self._buf = self._buf[:k], self._buf[k:]
        return taken

    def drain(self) -> None:
        """Reads the rest, only to check it is increasing; keeps no more than one block."""
        while self._next < self._len:
            self._read_block()
        self._buf = self._buf[:0]

    def _read_block(self) -> np.ndarray:
        lo, hi = self._next, min(self._len, self._next + self._block)
        chunk = _read(self._arr, "seq_starts", lo, hi).astype(np.uint64, copy=False)
        # Compare, never subtract: a decrease would wrap around in uint64.
        if self._last is not None and chunk[0] <= self._last:
            raise _Stop(_not_increasing(lo - 1, self._last, int(chunk[0])))
        bad = np.flatnonzero(chunk[1:] <= chunk[:-1])
        if bad.size:
            i = int(bad[0])
            raise _Stop(_not_increasing(lo + i, int(chunk[i]), int(chunk[i + 1])))
        self._next, self._last = hi, int(chunk[-1])
        return chunk


def _not_increasing(i: int, a: int, b: int) -> str:
    why = " (an empty sequence)" if a == b else ""
    return f"seq_starts not strictly increasing at index {i + 1}: seq_starts[{i}] = {a}, seq_starts[{i + 1}] = {b}{why}"


@dataclass
class Walk:
    """What one pass over encoded_tokens found."""
    max_id: int = -1
    max_at: int = -1  # first index holding max_id
    wrong_bits: int = 0
    bit_set_not_start: int = 0  # start bit set where no sequence starts
    start_without_bit: int = 0  # a sequence starts but the bit is clear
    first_wrong: int = -1
    first_wrong_value: int = 0

    def problems(self) -> list[str]:
        if not self.wrong_bits:
            return []
        v, i = self.first_wrong_value, self.first_wrong
        expected = "a sequence starts there" if (v & 1) == 0 else "no sequence starts there"
        return [f"encoded_tokens: start bit wrong at {self.wrong_bits} positions "
                f"({self.bit_set_not_start} set where no sequence starts, {self.start_without_bit} clear "
                f"where seq_starts says one starts); first at index {i}: value {v} has start bit {v & 1} "
                f"but {expected}"]


def walk_split(tok: zarr.Array, st: zarr.Array, block: int) -> Walk:
    """One pass over encoded_tokens in blocks, merging the seq_starts stream alongside.

    Precondition (check_ends): seq_starts[0] == 0 and seq_starts[-1] == len(tok), so every start
    handed out for the block [a, b) lies in it."""
    n = tok.shape[0]
    starts = StartStream(st, block)
    walk = Walk()
    for a in range(0, n, block):
        b = min(n, a + block)
        v = _read(tok, "encoded_tokens", a, b)
        expected = np.zeros(b - a, bool)
        expected[(starts.take_below(b) - np.uint64(a)).astype(np.intp)] = True
        actual = (v & 1).astype(bool)
        wrong = np.flatnonzero(actual != expected)
        if wrong.size:
            if not walk.wrong_bits:
                walk.first_wrong, walk.first_wrong_value = a + int(wrong[0]), int(v[wrong[0]])
            walk.wrong_bits += wrong.size
            set_not_start = int(np.count_nonzero(actual[wrong]))
            walk.bit_set_not_start += set_not_start
            walk.start_without_bit += wrong.size - set_not_start
        # max(v >> 1) == max(v) >> 1, so no decoded copy of the block is needed.
        top = int(v.max())
        if top >> 1 > walk.max_id:
            walk.max_id, walk.max_at = top >> 1, a + int(np.argmax(v >> 1 == top >> 1))
    # Everything left must be the final value n; reading it checks the increase to the end.
    starts.drain()
    return walk


def check_max(walk: Walk, attr_max: int | None, n: int) -> list[str]:
    """Decoded ids within [0, 2**31-1] and max_token_id the exact maximum (see module doc)."""
    problems = []
    if walk.max_id > MAX_ID:  # cannot happen with uint32 storage; kept as the format's rule
        problems.append(f"encoded_tokens: decoded id {walk.max_id} at index {walk.max_at} exceeds 2**31-1")
    if attr_max is None or n == 0:
        return problems
    if walk.max_id > attr_max:
        problems.append(f"encoded_tokens: decoded id {walk.max_id} at index {walk.max_at} "
                        f"exceeds max_token_id {attr_max}")
    elif walk.max_id < attr_max:
        problems.append(f"max_token_id = {attr_max} is not the exact maximum: the largest decoded id "
                        f"is {walk.max_id} (at encoded_tokens index {walk.max_at})")
    return problems


# ---------------------------------------------------------------------------------------------
# The seq_sources extension (--record_sources)


def check_sources(root: zarr.Group, attrs: dict, summaries: dict[str, SplitSummary], block: int) -> list[str]:
    """A dataset that records sources: the root attribute `sources` lists their names, and each
    split walked has `seq_sources`, 1-D uint16, one id per sequence, every id naming a source;
    with a mixture, each source's sequences per split are those the `mixture` report counts.
    Nothing is checked for a dataset without either (the extension is optional)."""
    names = attrs.get("sources")
    recorded = [name for name in summaries if "seq_sources" in root[name]]
    if names is None and not recorded:
        return []
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        return [f"root attribute sources must be a non-empty list of names, is {names!r}"]
    problems, counts = [], {}
    for name, summary in summaries.items():
        try:
            arr = _member_array(root[name], "seq_sources", 2)
        except _Stop as e:
            problems.append(f"{name}: {e}")
            continue
        if arr.shape[0] != summary.sequences:
            problems.append(f"{name}: seq_sources has {arr.shape[0]} entries for {summary.sequences} sequences")
            continue
        found = np.zeros(1 << 16, np.int64)
        try:
            for lo in range(0, arr.shape[0], block):
                found += np.bincount(_read(arr, "seq_sources", lo, min(arr.shape[0], lo + block)), minlength=1 << 16)
        except _Stop as e:
            problems.append(f"{name}: {e}")
            continue
        beyond = np.flatnonzero(found[len(names):])
        if beyond.size:
            problems.append(f"{name}: seq_sources holds id {len(names) + int(beyond[0])}, but only "
                            f"{len(names)} sources are named")
        counts[name] = found[:len(names)].tolist()
    reported = attrs.get("mixture", {}).get("sources") if isinstance(attrs.get("mixture"), dict) else None
    if isinstance(reported, list) and len(reported) == len(names):
        for name, per_source in counts.items():
            for i, entry in enumerate(reported):
                want = entry.get(f"{name}_sequences") if isinstance(entry, dict) else None
                if want is not None and want != per_source[i]:
                    problems.append(f"{name}: seq_sources holds {per_source[i]} sequences of source {names[i]!r}, "
                                    f"the mixture report {want}")
    return problems


# ---------------------------------------------------------------------------------------------
# Command line


def summary_line(problems: list[str], summaries: dict[str, SplitSummary]) -> str:
    if problems:
        return f"FAIL: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
    parts = [f"{name} {s.sequences} seqs {s.tokens} tokens" for name, s in summaries.items()]
    return "OK: " + ", ".join(parts)


def storage_option(text: str) -> tuple[str, object]:
    """The argparse type of every reading command's --storage_option KEY=VALUE (export's too)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:  # JSON values (true, 3, {"a": 1}) are passed typed; anything else as a string
        return key, json.loads(value)
    except ValueError:
        return key, value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="flat-tokens verify",
                                 description="Verify a flat-tokens dataset written by this pipeline.")
    ap.add_argument("path", help="dataset path or fsspec URL (file://, gs://, ...)")
    ap.add_argument("--version", action="version", version=VERSION)
    ap.add_argument("--block", type=_positive_int, default=DEFAULT_BLOCK,
                    help=f"tokens (and seq_starts entries) read at a time; bounds memory (default {DEFAULT_BLOCK})")
    ap.add_argument("--storage_option", type=storage_option, action="append", default=[],
                    metavar="KEY=VALUE", help="fsspec storage option, repeatable; VALUE is parsed as JSON if it can be")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes: list[str] = []
    counted = storage_faults.counts()
    try:
        problems, summaries = check_dataset(args.path, block=args.block,
                                            storage_options=dict(args.storage_option) or None, notes=notes)
    except CannotOpen as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a storage fault is one line, never a traceback
        failure = storage_faults.one_line(e, args.path)
        if failure is None:
            raise
        print(f"error: {failure}", file=sys.stderr)
        return 1
    retried = storage_faults.summary(since=counted)
    if retried:
        notes.append(retried)
    for p in problems:
        print(p)
    for note in notes:  # on stderr: stdout stays the problems and the summary line
        print(note, file=sys.stderr)
    print(summary_line(problems, summaries))
    return 1 if problems else 0


if __name__ == "__main__":
    from flat_tokens.tools.cli import run_command
    sys.exit(run_command(main))
