"""Checksums of what this tool writes and later reads back (issue 27): CRC-32C everywhere.

Why CRC-32C: it is computed by a CPU instruction (google-crc32c, which zarr depends on
already: ~20 GB/s on one core here for a buffer in cache; docs/design.md, "Checksums"), it is
zarr 3's standard `crc32c` codec, and it is the checksum GCS keeps for every object, so a
listing alone tells whether a stored object is the one that was written. It detects every
single-bit error and every burst of up to 32 bits; other damage passes with probability 2**-32.

Two uses:

* Staged files (transforms/staging.py) are *sealed*: the payload, then an 8-byte trailer,
  `SEAL_MAGIC` and the CRC-32C of the payload (little-endian). `unseal` checks it and raises
  Damaged, naming the object. Files that must stay as they are (a batch's ids, which the
  shuffle maps in place) are summed instead, and the sum is sealed into another file.
* `Sum` (size, CRC-32C) of an object as it was written; `damaged_objects` tells which of
  many stored objects no longer match their sums: from the listing where the store lists a
  CRC-32C (GCS: no object is read), else by reading each one.

Imports no Beam: the reader uses it (through flat_tokens/format/chunk_checksums.py).
"""
from __future__ import annotations

import base64
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import google_crc32c
import numpy as np

from flat_tokens.format import storage_faults

SEAL_MAGIC = b"FTc1"  # "flat-tokens, CRC-32C, version 1"
SEAL_SIZE = len(SEAL_MAGIC) + 4


class Damaged(ValueError):
    """A stored object does not match the checksum written with it."""


def crc32c(data, value: int = 0) -> int:
    """CRC-32C of `data` (bytes or any contiguous buffer), continuing from `value`."""
    # google-crc32c takes bytes and numpy arrays, not memoryviews: a uint8 view, no copy.
    return google_crc32c.extend(value, _bytes_view(data))


def _bytes_view(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


class Sum(NamedTuple):
    """What a stored object must be: its size in bytes and its CRC-32C."""

    size: int
    crc32c: int

    @classmethod
    def of(cls, data) -> "Sum":
        view = _bytes_view(data)
        return cls(view.size, crc32c(view))

    def to_json(self) -> list:
        return [self.size, self.crc32c]

    @classmethod
    def from_json(cls, value) -> "Sum":
        size, crc = value
        return cls(int(size), int(crc))


def object_entry(data) -> tuple[int, int, int]:
    """(size, CRC-32C of all but the last 4 bytes, those 4 bytes as a little-endian number): what
    a dataset's manifest lists for an object (flat_tokens/format/manifest.py: Entry says why not
    the whole object's CRC-32C), computed wherever an object is checked against it."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    head = n - min(n, 4)
    return n, crc32c(view[:head]), int.from_bytes(bytes(view[head:]), "little")


def seal(payload) -> bytes:
    """`payload` with its trailer: what a staged file holds."""
    return b"".join((payload, SEAL_MAGIC, struct.pack("<I", crc32c(payload))))  # one copy of the payload, not three


def unseal(data, name: str) -> memoryview:
    """The payload of a sealed object, checked; Damaged (naming `name`) when it is not whole."""
    view = memoryview(data).cast("B")
    if view.nbytes < SEAL_SIZE or view[-SEAL_SIZE:-4] != SEAL_MAGIC:
        raise Damaged(f"{name}: damaged: no checksum trailer at its end ({view.nbytes} bytes; truncated, or not "
                      f"written by this version)")
    payload = view[:-SEAL_SIZE]
    stored = struct.unpack("<I", view[-4:])[0]
    if crc32c(payload) != stored:
        raise Damaged(f"{name}: damaged: its CRC-32C is {crc32c(payload):08x}, the checksum written with it "
                      f"{stored:08x}")
    return payload


def listed_crc32c(info: dict) -> int | None:
    """The CRC-32C a store lists for an object (GCS: base64 of the big-endian value), or None."""
    value = info.get("crc32c")
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def stored_problem(fs, path: str, want: Sum, info: dict | None = None) -> str | None:
    """Why the object at `path` is not the one summed by `want` (None when it is). `info`:
    its entry in a listing, when there is one (size and CRC-32C then need no read)."""
    if info is not None:
        size, listed = info.get("size"), listed_crc32c(info)
        if size is not None and int(size) != want.size:
            return f"holds {int(size)} bytes, {want.size} were written"
        if listed is not None:
            return None if listed == want.crc32c else f"its CRC-32C is {listed:08x}, {want.crc32c:08x} was written"
    try:  # read again while it differs (a body cut short in transit): only a fresh read's bytes count
        data = storage_faults.cat_file(fs, path, path, lambda d: None if Sum.of(d) == want else "differs")
    except FileNotFoundError:
        return "is missing"
    got = Sum.of(data)
    if got.size != want.size:
        return f"holds {got.size} bytes, {want.size} were written"
    if got.crc32c != want.crc32c:
        return f"its CRC-32C is {got.crc32c:08x}, {want.crc32c:08x} was written"
    return None


def damaged_objects(fs, expected: dict[str, Sum], listed: dict[str, dict] | None = None,
                    threads: int = 16) -> dict[str, str]:
    """{path: what is wrong} for the objects of `expected` ({path: Sum}, paths as `fs` names
    them) that are missing or differ from their sums. `listed`: {path: listing entry} from
    the caller's listing; where an entry gives the object's CRC-32C (GCS) nothing is read,
    else each object is read once, on `threads` threads."""
    listed = listed or {}

    def check(item):
        path, want = item
        return path, stored_problem(fs, path, want, listed.get(path))

    if not expected:
        return {}
    with ThreadPoolExecutor(max(1, min(threads, len(expected)))) as pool:
        return {path: why for path, why in pool.map(check, expected.items()) if why is not None}
