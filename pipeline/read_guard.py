"""Reads that never serve zeros or another dataset's data (for pipeline.reader).

zarr reads a chunk that is not in the store as the array's fill value: a lost chunk, or a
dataset deleted under an open reader, would come back as token id 0, silently. A flipped bit
in a compressed chunk decodes, more often than not, to other token ids. And a reader that
opened one run's dataset keeps its arrays' metadata: after `--overwrite` replaced the
dataset with one of the same shape, it would read the new run's chunks as if they were the
old run's. Three guards, one for each:

* `open_store` wraps the dataset's zarr store so that reading a chunk that does not exist
  raises MissingChunk (metadata documents may be absent: zarr asks for some that a format
  does not have). The read that finds the chunk missing costs nothing more.
* The same store checks each chunk it reads whole against the checksum the chunk carries
  (`check_chunks`, transforms/write/chunk_checksums.py: a CRC-32C of its stored bytes, so
  every flipped bit is found), and raises CorruptChunk naming the chunk and the dataset.
  zarr checks the crc32c/crc32 codecs itself as it decodes; with
  zarr 3 sharding it reads inner chunks by byte range, and only zarr checks those. `read`
  names the chunk whatever zarr raised (a truncated chunk of a dataset written before chunks
  carried checksums raised a bare RuntimeError).
* `RunGuard.check` reads the root attributes (one small object: `.zattrs`, or `zarr.json` for
  zarr 3) and raises DatasetReplaced unless they still name the run that was opened and say
  it is complete. The reader calls it *after* each block it reads: a replacing run removes
  the root metadata before it deletes or writes any chunk (transforms/write/ownership.py), and
  once removed the old run's root never comes back, so root metadata that still names the
  opened run after a read proves the data read was that run's.

Imports numpy, zarr and fsspec only: a trainer's environment needs no Beam.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import posixpath

import numpy as np
import zarr
from fsspec.core import url_to_fs
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from transforms import storage_faults
from transforms.storage_faults import StorageUnavailable  # noqa: F401 (API: the store is unreachable)
from transforms.write import chunk_checksums

# Keys zarr may ask for that need not exist; every other key of a split is a chunk (or shard).
METADATA_KEYS = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"})
ROOT_ATTRIBUTES = {2: ".zattrs", 3: "zarr.json"}


class DatasetError(Exception):
    """The dataset cannot be read: missing, not committed, or not a flat-tokens dataset."""


class MissingChunk(DatasetError):
    """A chunk the arrays' shapes say exists is not in the store."""


class CorruptChunk(DatasetError):
    """A chunk's stored bytes do not match the checksum they carry, or cannot be decoded."""


class DatasetReplaced(DatasetError):
    """The dataset the reader opened is no longer the committed one at its URL."""


def _is_metadata(key: str) -> bool:
    return posixpath.basename(key) in METADATA_KEYS


class ChunksMustExist(WrapperStore):
    """A read-only store in which a missing chunk is an error, never the fill value, and a
    chunk read whole is checked against the checksum it carries (see `check_chunks`)."""

    def __init__(self, store, url: str = "", checksums: dict | None = None):
        super().__init__(store)
        self._url = url
        self._checksums = {} if checksums is None else checksums  # array path -> scheme; shared by copies

    @property
    def rereads(self) -> int:
        """Fresh reads of bytes that fail their check: an object store's response may be cut
        short in transit; a local disk's read is what is stored (none)."""
        return storage_faults.REREADS if isinstance(self._store, FsspecStore) else 0

    def _with_store(self, store):
        return type(self)(store, self._url, self._checksums)

    def check_chunks(self, array_path: str, scheme: str | None) -> None:
        """From now on, every chunk of the array at `array_path` (e.g. "train/encoded_tokens")
        read whole is checked against its checksum under `scheme`
        (transforms/write/chunk_checksums.py); None: not checked."""
        self._checksums[array_path.strip("/")] = scheme

    def _missing(self, key: str) -> MissingChunk:
        return MissingChunk(f"{self._url}: chunk {key} is missing: the dataset lost data (or is being deleted); "
                            f"it cannot be read")

    def _problem(self, key: str, value, byte_range) -> str | None:
        """Why the bytes read for `key` are wrong (a chunk that fails its checksum, a metadata
        document that is not JSON), or None. A missing chunk raises MissingChunk."""
        if value is None:
            if not _is_metadata(key):
                raise self._missing(key)
            return None
        if byte_range is not None:
            return None
        if _is_metadata(key):
            return storage_faults.not_json(value.to_bytes())
        if not self._checksums:
            return None
        scheme = self._checksums.get(posixpath.dirname(key)) or self._checksums.get(
            posixpath.dirname(posixpath.dirname(key)))  # zarr 2 "a/0", zarr 3 "a/c/0"
        return chunk_checksums.problem(value.as_numpy_array(), scheme)

    async def get(self, key, prototype, byte_range=None):
        # Bytes that fail their check are read again before they are judged, and a read that
        # fails at the transport is retried within the store's patience (storage_faults).
        value = await storage_faults.read_async(lambda: self._store.get(key, prototype, byte_range),
                                                f"{self._url.rstrip('/')}/{key}",
                                                lambda v: self._problem(key, v, byte_range), self.rereads)
        why = self._problem(key, value, byte_range)
        if why and not _is_metadata(key):
            reads = f" (on {self.rereads + 1} reads)" if self.rereads else ""
            raise CorruptChunk(f"{self._url}: chunk {key} is damaged: it {why}{reads}; the dataset cannot be trusted "
                               f"there (rewrite it: rerun the command that wrote it with --overwrite)")
        return value  # a metadata document still not JSON: zarr names it

    async def get_partial_values(self, prototype, key_ranges):
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range)
                                           for key, byte_range in key_ranges)))

    async def _get_many(self, requests):
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)


def check_chunks(array: zarr.Array, path: str, scheme: str | None) -> None:
    """Makes every whole-chunk read of `array` (at `path` under its store's root) check the
    checksum the chunk carries, when its store is a ChunksMustExist. Sharded arrays are
    read by byte range, which zarr's own crc32c codec checks."""
    store = array.store_path.store
    if isinstance(store, ChunksMustExist):
        store.check_chunks(path, None if array.shards else scheme)


def read(array: zarr.Array, lo: int, hi: int) -> np.ndarray:
    """array[lo:hi]; whatever reading a chunk raises (a damaged or truncated chunk: zarr's
    codecs, zstd), a DatasetError naming the chunk and the dataset, once fresh reads failed
    the same way (a range read cut short in transit fails zarr's own checks too)."""
    store = getattr(getattr(array, "store_path", None), "store", None)
    rereads = store.rereads if isinstance(store, ChunksMustExist) else 0
    for attempt in range(rereads + 1):
        try:
            return np.asarray(array[lo:hi])
        except (DatasetError, StorageUnavailable):
            raise
        except Exception as e:  # noqa: BLE001 - every failure to decode is named below
            error = e
            if attempt < rereads:
                storage_faults.count_reread()
    url = store._url if isinstance(store, ChunksMustExist) else str(store)
    raise _locate(array, lo, hi, url, array.path, error) from None


def _locate(array: zarr.Array, lo: int, hi: int, url: str, path: str, error: Exception) -> DatasetError:
    """The error naming the first chunk of [lo, hi) that cannot be read alone (re-read chunk by
    chunk: only on this failure path), or the range when each chunk reads alone."""
    n = array.shape[0]
    block = int(array.shards[0]) if array.shards else int(array.chunks[0])
    inner = int(array.chunks[0])
    for first in range(lo - lo % inner, hi, inner):
        a, b = first, min(n, first + inner)
        try:
            np.asarray(array[a:b])
        except StorageUnavailable:
            raise
        except DatasetError as e:
            return e
        except Exception as e:  # noqa: BLE001
            key = f"{path}/{array.metadata.encode_chunk_key((a // block,))}"
            inside = f" (its inner chunk {(a % block) // inner})" if array.shards else ""
            return CorruptChunk(f"{url}: chunk {key}{inside}, elements [{a}, {b}) of {path}, cannot be read: "
                                f"{type(e).__name__}: {e}; the chunk is damaged or truncated (rewrite it: rerun the "
                                f"command that wrote it with --overwrite)")
    return CorruptChunk(f"{url}: {path}[{lo}:{hi}] cannot be read: {type(error).__name__}: {error}")


def open_store(url: str, storage_options: dict | None = None) -> ChunksMustExist:
    """The dataset's store, read-only, with missing chunks raising MissingChunk."""
    if "://" in url and not url.startswith("file://"):
        inner = FsspecStore.from_url(url, storage_options=dict(storage_options or {}), read_only=True)
    else:
        path = url[len("file://"):] if url.startswith("file://") else url
        inner = LocalStore(os.path.expanduser(path), read_only=True)
    return ChunksMustExist(inner, url)


def run_identity(attrs: dict) -> str:
    """What names the run that committed a dataset: its `run_id`; for a dataset written by
    another tool (no run id), a digest of its root attributes."""
    run_id = attrs.get("run_id")
    if isinstance(run_id, str) and run_id:
        return run_id
    return "attributes:" + hashlib.sha256(json.dumps(attrs, sort_keys=True, default=str).encode()).hexdigest()


class RunGuard:
    """Checks that the committed dataset at `url` is still the run that was opened.

    Plain data (URL, options, format, identity): it pickles, and each process opens its own
    filesystem on first use."""

    def __init__(self, url: str, storage_options: dict | None, zarr_format: int, identity: str):
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.zarr_format = zarr_format
        self.identity = identity
        self._fs = None

    def __getstate__(self):
        return {**self.__dict__, "_fs": None}

    def current_attributes(self) -> dict | None:
        """The root attributes committed at the URL now (one small read), or None when there is
        no root metadata (the dataset was deleted, or is being replaced)."""
        if self._fs is None:
            self._fs, self._path = url_to_fs(self.url, **self.storage_options)
        key = posixpath.join(self._path.rstrip("/"), ROOT_ATTRIBUTES[self.zarr_format])
        try:
            raw = storage_faults.cat_file(self._fs, key, f"{self.url.rstrip('/')}/{ROOT_ATTRIBUTES[self.zarr_format]}",
                                          storage_faults.not_json)
        except FileNotFoundError:
            return None
        document = json.loads(raw)
        return document.get("attributes", {}) if self.zarr_format == 3 else document

    def check(self) -> None:
        """Raises DatasetReplaced unless the opened run is still the committed one."""
        attrs = self.current_attributes()
        if attrs is None:
            raise DatasetReplaced(f"{self.url}: the dataset was deleted or uncommitted while it was being read "
                                  f"(no root metadata now); what was read cannot be trusted")
        if attrs.get("complete") is not True or run_identity(attrs) != self.identity:
            now = attrs.get("run_id") or "another dataset"
            raise DatasetReplaced(f"{self.url}: the dataset was replaced while it was being read (run "
                                  f"{self.identity} was opened, the committed one is now {now}, "
                                  f"complete={attrs.get('complete')!r}); reopen it to read the new one")


def open_group(url: str, storage_options: dict | None = None) -> zarr.Group:
    """The root group through a ChunksMustExist store."""
    return zarr.open_group(store=open_store(url, storage_options), mode="r")
