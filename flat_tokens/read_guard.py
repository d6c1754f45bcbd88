"""Reads that never serve zeros or another dataset's data (for flat_tokens.reader).

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
  (`check_chunks`, flat_tokens/format/chunk_checksums.py: a CRC-32C of its stored bytes, so
  every flipped bit is found), and raises CorruptChunk naming the chunk and the dataset.
  zarr checks the crc32c/crc32 codecs itself as it decodes; with
  zarr 3 sharding it reads inner chunks by byte range, and only zarr checks those. `read`
  names the chunk whatever zarr raised (a truncated chunk of a dataset written before chunks
  carried checksums raised a bare RuntimeError).
* With the dataset's manifest (flat_tokens/format/manifest.py; `open_group` loads it and checks
  its seal), the same store checks every object it reads against its own key's entry before
  zarr uses it: metadata as zarr opens groups and arrays, chunks as they are read, and a
  zarr 3 shard whole (once) before its inner chunks are served by byte range. So a chunk in
  another's place, from another build or split, or edited metadata raises, naming the key
  (`ChunksMustExist.manifest_check`: one function, for callers that read objects themselves).
  Local objects must be regular files (`stat`, before any open: a FIFO would block), and an
  array's metadata naming a codec or dtype this format does not use raises
  UnsupportedDataset before zarr builds anything from it.
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
import stat

import numpy as np
import zarr
from fsspec.core import url_to_fs
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from flat_tokens.format import storage_faults
from flat_tokens.format.storage_faults import StorageUnavailable  # noqa: F401 (API: the store is unreachable)
from flat_tokens.format import array_metadata, chunk_checksums, manifest

# Keys zarr may ask for that need not exist; every other key of a split is a chunk (or shard).
METADATA_KEYS = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"})
ROOT_ATTRIBUTES = {2: ".zattrs", 3: "zarr.json"}
WHOLE_OBJECTS_KEPT = 4  # sharded objects kept whole, checked, while their inner chunks are read (one per read thread)


class DatasetError(Exception):
    """The dataset cannot be read: missing, not committed, or not a flat-tokens dataset."""


class MissingChunk(DatasetError):
    """A chunk the arrays' shapes say exists is not in the store."""


class CorruptChunk(DatasetError):
    """A chunk's stored bytes do not match the checksum they carry, or cannot be decoded."""


class UnsupportedDataset(DatasetError):
    """An array's metadata names a codec, dtype or shape this format does not use."""


class DatasetReplaced(DatasetError):
    """The dataset the reader opened is no longer the committed one at its URL."""


def _is_metadata(key: str) -> bool:
    return posixpath.basename(key) in METADATA_KEYS


class ChunksMustExist(WrapperStore):
    """A read-only store in which a missing chunk is an error, never the fill value, and a
    chunk read whole is checked against the checksum it carries (see `check_chunks`). With
    the dataset's manifest (`expect`), every object it lists is checked against its own
    key's entry, whole, before any of its bytes are used (`manifest_check`)."""

    def __init__(self, store, url: str = "", checksums: dict | None = None, expected: dict | None = None):
        super().__init__(store)
        self._url = url
        self._checksums = {} if checksums is None else checksums  # array path -> scheme; shared by copies
        self._expected = {} if expected is None else expected  # "manifest", "whole": shared by copies

    @property
    def rereads(self) -> int:
        """Fresh reads of bytes that fail their check: an object store's response may be cut
        short in transit; a local disk's read is what is stored (none)."""
        return storage_faults.REREADS if isinstance(self._store, FsspecStore) else 0

    def _with_store(self, store):
        return type(self)(store, self._url, self._checksums, self._expected)

    def expect(self, listed: manifest.Manifest) -> None:
        """From now on, every object `listed` names is checked against its entry as it is read."""
        self._expected["manifest"] = listed
        self._expected["whole"] = {}  # key -> verified bytes of the last sharded objects read by range

    @property
    def manifest(self) -> manifest.Manifest | None:
        return self._expected.get("manifest")

    def _local_path(self, key: str) -> str | None:
        root = getattr(self._store, "root", None)
        return None if root is None else os.path.join(str(root), key)

    def _refuse_special(self, key: str, size: int | None) -> None:
        """A local object must be a regular file (of the manifest's size): never a FIFO, whose
        open would block, nor a link to a device such as /dev/zero, read without end."""
        path = self._local_path(key)
        if path is None:
            return
        try:
            found = os.stat(path)  # does not open: a FIFO cannot block here
        except (FileNotFoundError, NotADirectoryError):
            return  # zarr reports it missing
        except OSError as e:
            raise DatasetError(f"{self._url}: {key} cannot be read: {e}") from None
        if not stat.S_ISREG(found.st_mode):
            raise CorruptChunk(f"{self._url}: {self._name(key)} is not a regular file (a FIFO, device or directory); "
                               f"a dataset's objects are files; refusing to read it")
        if size is not None and found.st_size != size and found.st_size > self.manifest.largest(key):
            # No larger than its neighbours: read, so the error can name the object it holds.
            raise CorruptChunk(f"{self._url}: {self._name(key)} holds {found.st_size} bytes, the manifest of run "
                               f"{self.manifest.run_id} lists {size}; refusing to read it")

    async def _whole(self, key: str, prototype):
        """The whole object at `key`, checked against the manifest, for reads by byte range
        (zarr 3 shards): checked once, kept while its neighbours' ranges are read."""
        whole = self._expected["whole"]
        if key not in whole:
            self._refuse_special(key, self.manifest.size_of(key))
            value = await self._fetch(key, prototype, None,
                                      lambda v: None if v is None else self.manifest.problem(key, v.to_bytes()))
            if value is None:
                raise self._missing(key)
            self.manifest_check(key, value.to_bytes())
            while len(whole) >= WHOLE_OBJECTS_KEPT:
                whole.pop(next(iter(whole)))
            whole[key] = value.to_bytes()
        return whole[key]

    def check_chunks(self, array_path: str, scheme: str | None) -> None:
        """From now on, every chunk of the array at `array_path` (e.g. "train/encoded_tokens")
        read whole is checked against its checksum under `scheme`
        (flat_tokens/format/chunk_checksums.py); None: not checked."""
        self._checksums[array_path.strip("/")] = scheme

    def _missing(self, key: str) -> MissingChunk:
        return MissingChunk(f"{self._url}: chunk {key} is missing: the dataset lost data (or is being deleted); "
                            f"it cannot be read")

    def manifest_check(self, key: str, data, entry: manifest.Entry | None = None) -> None:
        """Raises unless `data`, read whole at `key`, is the object the manifest lists there.
        `entry`: its manifest.Entry, when the caller computed it already."""
        listed = self.manifest
        if listed is None:
            return
        why = listed.problem(key, data, entry)
        if why:
            kind = DatasetError if _is_metadata(key) else CorruptChunk
            raise kind(f"{self._url}: {self._name(key)} {why}; the dataset cannot be trusted there")

    def _refuse_unsupported(self, key: str, data) -> None:
        """An array's metadata that names a codec or dtype this format does not use is refused
        before zarr builds anything from it (flat_tokens/format/array_metadata.py)."""
        try:
            document = json.loads(bytes(data))
        except ValueError as e:
            raise UnsupportedDataset(f"{self._url}: {key} is not JSON ({e})") from None
        why = array_metadata.unsupported(document)
        if why:
            raise UnsupportedDataset(f"{self._url}: {key}: {why}; not a flat-tokens dataset this tool reads")

    @staticmethod
    def _name(key: str) -> str:
        return key if _is_metadata(key) else f"chunk {key}"

    def _check(self, key: str, value, byte_range) -> None:
        if value is None:
            if not _is_metadata(key):
                raise self._missing(key)
            if self.manifest is not None and self.manifest.expected(key) is not None:
                raise DatasetError(f"{self._url}: {key} is missing, but the manifest of run {self.manifest.run_id} "
                                   f"lists it; the dataset cannot be read")
            return
        if byte_range is not None:
            return
        data = value.as_numpy_array()
        if posixpath.basename(key) in (".zarray", "zarr.json"):
            self.manifest_check(key, data)  # first: an edited document is named as such
            self._refuse_unsupported(key, data)
            return
        if not _is_metadata(key):
            scheme = self._checksums.get(posixpath.dirname(key)) or self._checksums.get(
                posixpath.dirname(posixpath.dirname(key)))  # zarr 2 "a/0", zarr 3 "a/c/0"
            # What the chunk carries decides, not a removable attribute: a checksum frame is checked.
            scheme = scheme or chunk_checksums.carried(data)
            entry = None
            if scheme == chunk_checksums.ZSTD_FRAME and self.manifest is not None:
                # One CRC pass for both checks: the frame's CRC-32C, extended over the trailer's head.
                frame_crc, why = chunk_checksums.check_zstd_frame(data)
                if frame_crc is not None:
                    entry = manifest.Entry.after(data, frame_crc, chunk_checksums.TRAILER_SIZE)
            else:
                why = chunk_checksums.problem(data, scheme)
            if why:
                raise CorruptChunk(f"{self._url}: chunk {key} is damaged: it {why}; the dataset cannot be trusted "
                                   f"there (rewrite it: rerun the command that wrote it with --overwrite)")
            self.manifest_check(key, data, entry)
            return
        self.manifest_check(key, data)

    def _judge(self, key: str, value, byte_range) -> str | None:
        """Why the bytes read for `key` are wrong (what _check would raise), or None; a missing
        chunk raises MissingChunk. A metadata document that is not JSON is wrong too: a read cut
        short in transit (storage_faults reads it again)."""
        try:
            self._check(key, value, byte_range)
        except MissingChunk:
            raise
        except DatasetError as e:  # CorruptChunk, a manifest mismatch, an unsupported document
            return str(e)
        if value is not None and byte_range is None and _is_metadata(key):
            return storage_faults.not_json(value.to_bytes())
        return None

    async def _fetch(self, key: str, prototype, byte_range, judge):
        """The object's bytes, read again while they fail `judge` (an object store's response may
        be cut short in transit) and retried while the store fails at the transport, within
        its patience (flat_tokens/format/storage_faults.py): only bytes wrong on a fresh read are judged."""
        return await storage_faults.read_async(lambda: self._store.get(key, prototype, byte_range),
                                               f"{self._url.rstrip('/')}/{key}", judge, self.rereads)

    async def get(self, key, prototype, byte_range=None):
        listed = self.manifest
        size = None if listed is None else listed.size_of(key)
        if byte_range is not None and size is not None:  # a shard's index or inner chunk
            return prototype.buffer.from_bytes(byte_slice(await self._whole(key, prototype), byte_range))
        self._refuse_special(key, size)
        value = await self._fetch(key, prototype, byte_range, lambda v: self._judge(key, v, byte_range))
        try:
            self._check(key, value, byte_range)
        except CorruptChunk as e:
            if self.rereads:  # the same wrong bytes on every fresh read: stored so
                raise CorruptChunk(f"{e} (on {self.rereads + 1} reads)") from None
            raise
        return value  # a metadata document still not JSON: zarr names it

    async def get_partial_values(self, prototype, key_ranges):
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range)
                                           for key, byte_range in key_ranges)))

    async def _get_many(self, requests):
        for key, prototype, byte_range in requests:  # one at a time, as zarr's own Store does
            yield key, await self.get(key, prototype, byte_range)


def byte_slice(data: bytes, byte_range) -> bytes:
    """The bytes of `data` a zarr ByteRequest asks for."""
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return data[len(data) - min(byte_range.suffix, len(data)):]
    raise TypeError(f"unknown byte range {byte_range!r}")


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


def load_manifest(url: str, storage_options: dict | None = None) -> manifest.Manifest | None:
    """The committed dataset's manifest, checked against the seal in its root attributes
    (flat_tokens/format/manifest.py); None for a dataset committed before manifests. Raises
    DatasetError when the manifest or the root attributes were edited, or one is missing."""
    fs, path = url_to_fs(url, **dict(storage_options or {}))
    path = path.rstrip("/")
    attrs = None
    for name in ROOT_ATTRIBUTES.values():
        try:  # read again while it is not JSON (a body cut short), as every object the reader reads
            document = storage_faults.read_json(fs, f"{path}/{name}")
        except FileNotFoundError:
            continue
        except ValueError as e:
            raise DatasetError(f"{url}: {name} is not JSON ({e})") from None
        attrs = document.get("attributes", {}) if name == "zarr.json" else document
        break
    if not isinstance(attrs, dict):
        raise DatasetError(f"{url}: no root attributes")
    sealed = manifest.sealed_by(attrs)
    where = f"{path}/{manifest.MANIFEST}"
    try:
        info = fs.info(where)
    except FileNotFoundError:
        info = None
    data = None
    if info is not None:
        if info.get("type") != "file" or (sealed is not None and info.get("size") != sealed.get("size")):
            raise DatasetError(f"{url}: {manifest.MANIFEST} is not the {sealed and sealed.get('size')}-byte file "
                               f"the root attributes seal (it holds {info.get('size')} bytes, type "
                               f"{info.get('type')}); the dataset cannot be trusted")
        # Read again while it does not match the seal: a body cut short in transit is no edit.
        data = storage_faults.cat_file(fs, where, where, storage_faults.judged_by(
            lambda d: manifest.open_sealed(d, attrs)))
    try:
        return manifest.open_sealed(data, attrs)
    except manifest.ManifestError as e:
        raise DatasetError(f"{url}: {e}; the dataset cannot be trusted") from None


def open_group(url: str, storage_options: dict | None = None) -> zarr.Group:
    """The root group through a ChunksMustExist store; with the dataset's manifest, every
    object read (metadata first) is checked against it."""
    store = open_store(url, storage_options)
    listed = load_manifest(url, storage_options)
    if listed is not None:
        store.expect(listed)
    return zarr.open_group(store=store, mode="r")
