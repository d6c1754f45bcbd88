"""The dataset's manifest (issue 37): every object it holds, bound to its key, and sealed.

A chunk's own checksum (flat_tokens/format/chunk_checksums.py) says its bytes are whole; it
cannot say the chunk is the one that belongs at its key: two chunks swapped by a sync tool,
a chunk or a whole split copied from another build, a shard index entry set to "empty" or a
shape edited in `.zarray` are all whole objects. The manifest closes that:

* It lists every object of the dataset except the root attributes: each array's metadata
  (`.zarray`/`zarr.json`), each split's group metadata (`.zgroup`/`.zattrs`/`zarr.json`), the
  root's `.zgroup` (zarr 2), and every data object (chunk, or shard object with zarr 3
  sharding), under its own key, as an `Entry`: its size, the CRC-32C of its bytes but the
  last 4, and those 4 bytes (why not the whole object's CRC-32C: see Entry). Data objects
  are kept per array as three packed little-endian columns (uint64 sizes, uint32 CRC-32Cs,
  uint32 tails; base64 in the JSON), indexed by chunk number: ~22 bytes per chunk in the
  object, 16 in memory, and loading 250,000 of them is a base64 decode, not 250,000 dict
  entries.
* The commit writes it as the object `MANIFEST` at the dataset's root, then seals it in the
  root attributes (written last, they are the commit): attribute `manifest` holds the
  manifest's size and the SHA-256 of its bytes together with every *other* root attribute
  (canonical JSON). So the root attributes (run id, stats, `storage.checksums`,
  `max_token_id`s through the split metadata) and the manifest vouch for each other: an
  edited attribute, an edited or swapped manifest, a manifest without its seal or a seal
  without its manifest are all refused.
* The manifest names its run: a split copied from another build has that build's group
  attributes and chunks, which this build's entries do not match.

Readers (flat_tokens/read_guard.py) check each object they read against *its own key's* entry,
and name, when it is one, the key whose entry the bytes match instead.

Pure (json, hashlib, numpy, CRC-32C): no zarr, no Beam, no storage; the write side's
caller lists and sums the stored objects, the read side's caller fetches them.
"""
from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from flat_tokens.format.checksums import crc32c, object_entry

MANIFEST = "flat-tokens-manifest.json"  # at the dataset's root, beside the root metadata
ATTRIBUTE = "manifest"  # the root attribute that seals it
FORMAT = "flat-tokens-manifest"
VERSION = 1


class ManifestError(ValueError):
    """The manifest is missing, damaged, not this dataset's, or an object does not match it."""


class Entry(NamedTuple):
    """What one stored object must be: its size, the CRC-32C of all its bytes but the last 4,
    and those 4 bytes (little-endian). Not the CRC-32C of the whole object: a zarr 3 chunk, or
    a shard whose index ends with its own CRC-32C, ends with the CRC-32C of what precedes it,
    and the CRC-32C of any such message is one constant for its length (CRC's residue). So
    two zarr 3 chunks of one size, or a shard whose index entry was set to "empty" and its
    index CRC recomputed, would have the same whole-object CRC-32C (what GCS lists); the head's
    CRC-32C and the tail tell them apart, and together bind every byte."""

    size: int
    crc32c: int
    tail: int

    @classmethod
    def of(cls, data) -> "Entry":
        return cls(*object_entry(data))

    @classmethod
    def after(cls, data, crc: int, covered_to_end: int) -> "Entry":
        """Entry.of(data), given `crc`, the CRC-32C of all of `data` but its last
        `covered_to_end` (>= 4) bytes: one CRC pass for a caller that had that one already."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        return cls(n, crc32c(view[n - covered_to_end:n - 4], crc), int.from_bytes(bytes(view[n - 4:]), "little"))

    def describe(self) -> str:
        return f"{self.size} bytes, CRC-32C {self.crc32c:08x} then {self.tail:08x}"


@dataclass(frozen=True)
class ArrayObjects:
    """The data objects of one 1-D array: object i is named `prefix + str(i)` under the array
    (`0` in zarr 2, `c/0` with zarr 3's default keys), its Entry (sizes[i], crcs[i], tails[i])."""

    prefix: str
    sizes: np.ndarray  # uint64
    crcs: np.ndarray  # uint32
    tails: np.ndarray  # uint32

    def entry(self, i: int) -> Entry:
        return Entry(self.sizes.item(i), self.crcs.item(i), self.tails.item(i))

    def index(self, rest: str) -> int | None:
        digits = rest[len(self.prefix):] if rest.startswith(self.prefix) else ""
        if not (digits.isascii() and digits.isdigit()) or (digits[0] == "0" and digits != "0"):
            return None
        i = int(digits)
        return i if i < self.sizes.size else None

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "count": int(self.sizes.size),
                "sizes": base64.b64encode(self.sizes.astype("<u8").tobytes()).decode("ascii"),
                "crc32c": base64.b64encode(self.crcs.astype("<u4").tobytes()).decode("ascii"),
                "tails": base64.b64encode(self.tails.astype("<u4").tobytes()).decode("ascii")}

    @classmethod
    def from_json(cls, value: dict) -> "ArrayObjects":
        sizes = np.frombuffer(base64.b64decode(value["sizes"]), dtype="<u8")
        crcs = np.frombuffer(base64.b64decode(value["crc32c"]), dtype="<u4")
        tails = np.frombuffer(base64.b64decode(value["tails"]), dtype="<u4")
        if not (sizes.size == crcs.size == tails.size == int(value["count"])) or not isinstance(value["prefix"], str):
            raise ManifestError("an array's columns do not hold its count of objects")
        return cls(value["prefix"], sizes, crcs, tails)


class Manifest:
    """What every object of one dataset must be: `objects` {key: Entry} (metadata) and `arrays`
    {array path: ArrayObjects} (data), keys relative to the dataset's root."""

    def __init__(self, run_id: str, objects: dict[str, Entry], arrays: dict[str, ArrayObjects]):
        self.run_id = run_id
        self.objects = dict(objects)
        self.arrays = dict(arrays)
        self._by_entry = None

    # -- lookups -----------------------------------------------------------------------------
    def _data(self, key: str) -> tuple[ArrayObjects, int] | None:
        # zarr 2 "train/encoded_tokens/0", zarr 3 "train/encoded_tokens/c/0": one or two levels
        head, _, name = key.rpartition("/")
        objects = self.arrays.get(head)
        if objects is None:
            head, _, directory = head.rpartition("/")
            objects = self.arrays.get(head)
            if objects is None:
                return None
            name = f"{directory}/{name}"
        index = objects.index(name)
        return None if index is None else (objects, index)

    def expected(self, key: str) -> Entry | None:
        """The entry of `key` (relative to the dataset's root), or None when it lists no such object."""
        key = key.strip("/")
        if key in self.objects:
            return self.objects[key]
        found = self._data(key)
        if found is None:
            return None
        objects, i = found
        return objects.entry(i)

    def covers(self, key: str) -> bool:
        """Whether `key` lies where the manifest accounts for every object: a listed metadata
        object, or anything inside a listed array (a chunk name it does not list is foreign)."""
        key = key.strip("/")
        return key in self.objects or any(key.startswith(a + "/") for a in self.arrays)

    def holder_of(self, got: Entry) -> str | None:
        """The key whose entry `got` matches (a chunk in another one's place), or None. Built on
        the first failure only."""
        if self._by_entry is None:
            index = {tuple(e): k for k, e in self.objects.items()}
            for path, objects in self.arrays.items():
                columns = zip(objects.sizes.tolist(), objects.crcs.tolist(), objects.tails.tolist())
                for i, entry in enumerate(columns):
                    index.setdefault(entry, f"{path}/{objects.prefix}{i}")
            self._by_entry = index
        return self._by_entry.get(tuple(got))

    def problem(self, key: str, data, entry: Entry | None = None) -> str | None:
        """Why the object read whole at `key` (its bytes `data`; `entry`, its Entry when the
        caller has it) is not the one the manifest lists there (a phrase), or None when it is
        (or the manifest does not cover `key`)."""
        want = self.expected(key)
        if want is None:
            return f"is not in the dataset's manifest (run {self.run_id})" if self.covers(key) else None
        got = Entry.of(data) if entry is None else entry
        if got == want:
            return None
        other = self.holder_of(got)
        where = (f"it holds the bytes the manifest lists for {other} (moved or copied there)" if other else
                 "its bytes are not this dataset's (from another build, another split, or damaged)")
        return (f"does not match the manifest of run {self.run_id}: {where}; it holds {got.describe()}, "
                f"{want.describe()} were committed")

    def size_of(self, key: str) -> int | None:
        want = self.expected(key)
        return None if want is None else want.size

    def largest(self, key: str) -> int:
        """The largest object the manifest lists beside `key` (in its array; else `key`'s own
        size): what a reader may read to tell which object sits at `key`."""
        found = self._data(key.strip("/"))
        if found is None:
            return self.size_of(key) or 0
        return int(found[0].sizes.max())

    # -- the stored form ---------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        document = {"format": FORMAT, "version": VERSION, "run_id": self.run_id,
                    "objects": {k: list(s) for k, s in sorted(self.objects.items())},
                    "arrays": {p: a.to_json() for p, a in sorted(self.arrays.items())}}
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        try:
            document = json.loads(data)
            if document.get("format") != FORMAT or document.get("version") != VERSION:
                raise ManifestError(f"{MANIFEST} is not a {FORMAT} version {VERSION} (written by a newer version?)")
            objects = {str(k): Entry(*map(int, v)) for k, v in document["objects"].items()}
            arrays = {str(p): ArrayObjects.from_json(a) for p, a in document["arrays"].items()}
            return cls(str(document["run_id"]), objects, arrays)
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"{MANIFEST} cannot be parsed ({type(e).__name__}: {e})") from None


def canonical(attrs: dict) -> bytes:
    """The root attributes other than the seal, as the seal binds them: sorted JSON of their
    JSON round trip (what a reader gets back from `.zattrs`/`zarr.json`)."""
    plain = json.loads(json.dumps({k: v for k, v in attrs.items() if k != ATTRIBUTE}))
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(manifest_bytes: bytes, attrs: dict) -> str:
    return hashlib.sha256(manifest_bytes + b"\n" + canonical(attrs)).hexdigest()


def seal(manifest_bytes: bytes, attrs: dict) -> dict:
    """The root attribute `manifest` for a dataset whose other root attributes are `attrs`."""
    return {"object": MANIFEST, "size": len(manifest_bytes), "sha256": _digest(manifest_bytes, attrs)}


def sealed_by(attrs: dict) -> dict | None:
    """The seal the root attributes hold (None: a dataset committed without a manifest)."""
    value = attrs.get(ATTRIBUTE)
    return value if isinstance(value, dict) else None


def open_sealed(manifest_bytes: bytes | None, attrs: dict) -> Manifest | None:
    """The manifest, checked against the seal in the root attributes `attrs`. None for a
    dataset from before manifests (neither a seal nor a manifest object); ManifestError when
    only one of them is there, they do not match, or the manifest names another run."""
    value = attrs.get(ATTRIBUTE)
    if value is None and manifest_bytes is None:
        return None
    if value is None:
        raise ManifestError(f"{MANIFEST} is there but the root attributes hold no `{ATTRIBUTE}` seal: the root "
                            f"attributes were edited (checks cannot be removed by removing an attribute)")
    if manifest_bytes is None:
        raise ManifestError(f"the root attributes seal a manifest, but {MANIFEST} is missing")
    if not isinstance(value, dict) or value.get("size") != len(manifest_bytes) or value.get("sha256") != _digest(
            manifest_bytes, attrs):
        raise ManifestError(f"{MANIFEST} and the root attributes do not match their seal: one of them was edited, "
                            f"or comes from another build")
    manifest = Manifest.from_bytes(manifest_bytes)
    if "run_id" in attrs and attrs["run_id"] != manifest.run_id:  # (a commit without provenance names none)
        raise ManifestError(f"{MANIFEST} is run {manifest.run_id}'s, the root attributes name run "
                            f"{attrs.get('run_id')}")
    return manifest


def array_objects(prefix: str, entries: list[Entry]) -> ArrayObjects:
    """The packed entries of one array's data objects, in chunk order."""
    n = len(entries)
    return ArrayObjects(prefix, np.fromiter((e.size for e in entries), dtype=np.uint64, count=n),
                        np.fromiter((e.crc32c for e in entries), dtype=np.uint32, count=n),
                        np.fromiter((e.tail for e in entries), dtype=np.uint32, count=n))
