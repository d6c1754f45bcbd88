"""The output zarr group: where it lives, how its arrays are created, and how it is committed.

The commit protocol: each split's arrays (`OUTPUT/train/encoded_tokens`, ...) are created
first, with no group metadata above them. The commit writes each split's group metadata,
then the root group's (`.zattrs`/`.zgroup`, or `zarr.json`), last, with the provenance and
`"complete": true`. Every object is created once and never updated: each is stored
create-only (transforms/create_only.py), so a run that lost the output cannot replace it.
Until the root metadata is there, zarr cannot open `OUTPUT` as a group and `flat_tokens.tools.verify`
reports an unfinished run. Before any of this, the run claims the output
(`transforms/write/ownership.py`): only this tool's own output is ever replaced.
"""
import logging
import os
import posixpath
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

import numcodecs
import numpy as np
import zarr
from fsspec.core import url_to_fs
from zarr.core.buffer import default_buffer_prototype

from flat_tokens.format import chunk_checksums, manifest, storage_faults
from flat_tokens.format.checksums import Sum
from flat_tokens.format.gcs import close_gcs_sessions_at_exit
from flat_tokens.format.index_files import index_objects
from transforms import create_only
from transforms.write import ownership, stored_sums
from transforms.write.ownership import OutputError, OutputTaken  # noqa: F401 - part of this module's API

# After `import zarr`: gcsfs sessions on zarr's event loop must close before zarr stops it.
close_gcs_sessions_at_exit()

# Multi-threaded Blosc writes blocks in the order threads finish: the same chunk would
# compress to different bytes on a retry. Single-threaded, a rewrite is byte-identical.
numcodecs.blosc.use_threads = False

SPLITS = ("train", "validation")
TOKENS = "encoded_tokens"
SEQ_STARTS = "seq_starts"
SEQ_SOURCES = "seq_sources"  # --record_sources: an extension array, one uint16 per sequence
ROOT_METADATA = ownership.ROOT_METADATA
RUN_ATTRIBUTE = ownership.SPLIT_RUN_ATTRIBUTE


@dataclass(frozen=True)
class StoreTarget:
    """Everything a worker needs to open the output: plain data, so it pickles anywhere."""

    url: str
    zarr_format: int = 2
    tokens_chunk: int = 1 << 18
    seq_starts_chunk: int = 1 << 16
    chunks_per_shard: int | None = None  # zarr v3 sharding: inner chunks per shard object
    codec: str = "zstd"
    run_id: str = ""
    storage_options: dict = field(default_factory=dict)
    record_sources: bool = False  # also write each split's seq_sources

    def chunk(self, name: str) -> int:
        return self.tokens_chunk if name == TOKENS else self.seq_starts_chunk  # seq_sources: per sequence too

    def arrays(self) -> tuple[str, ...]:
        """The arrays of each split this run writes."""
        return (TOKENS, SEQ_STARTS, SEQ_SOURCES) if self.record_sources else (TOKENS, SEQ_STARTS)

    def write_block(self, name: str) -> int:
        """The unit one writer must own: a chunk, or a whole shard object with sharding."""
        return self.chunk(name) * (self.chunks_per_shard or 1)

    def checksums(self) -> str:
        """The checksum scheme of the chunks (flat_tokens/format/chunk_checksums.py)."""
        return chunk_checksums.scheme(self.zarr_format, self.codec)

    def describe(self) -> dict:
        return {"zarr_format": self.zarr_format, "codec": self.codec,
                "chunks": {TOKENS: self.tokens_chunk, SEQ_STARTS: self.seq_starts_chunk},
                "chunks_per_shard": self.chunks_per_shard, "checksums": self.checksums()}


def _is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def array_length(name: str, tokens: int, sequences: int) -> int:
    """The length of a split's array `name`, for a split of `tokens` tokens in `sequences` sequences."""
    return {TOKENS: tokens, SEQ_STARTS: sequences + 1, SEQ_SOURCES: sequences}[name]


def child_url(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def make_store(url: str, storage_options: dict | None = None, read_only: bool = False):
    if _is_remote(url):
        return zarr.storage.FsspecStore.from_url(url, storage_options=storage_options or {}, read_only=read_only)
    path = url[len("file://"):] if url.startswith("file://") else url
    # `~` as fsspec (and so the ownership checks) reads it, not a directory named "~".
    return zarr.storage.LocalStore(os.path.expanduser(path), read_only=read_only)


def filesystem(url: str, storage_options: dict | None = None):
    return url_to_fs(url, **(storage_options or {}))


# Zstd level 1: on GPT-2 tokens of real text 6% larger than level 3 (1.083 vs 1.019
# bytes/token) but 1.6x faster to write (320 vs 196 MB/s) and faster to read; writing was
# the largest cost the pipeline adds to tokenizing (docs/design.md, 'Chunks and codecs').
ZSTD_LEVEL = 1


def _codecs(target: StoreTarget, dtype_size: int) -> dict:
    """create_array's `compressors` and `filters`: the codec, and the checksum every chunk
    carries (flat_tokens/format/chunk_checksums.py). zarr 2 with zstd: the plain zstd codec in
    the metadata, readable by every numcodecs; the chunks, written by ChunkWriter, carry
    their CRC-32C in a zstd skippable frame after the zstd frame."""
    cname, clevel = {"blosc-zstd": ("zstd", 3), "blosc-lz4": ("lz4", 5)}.get(target.codec, (None, None))
    if target.codec == "zstd":
        if target.zarr_format == 2:
            return {"compressors": numcodecs.Zstd(level=ZSTD_LEVEL)}
        return {"compressors": [zarr.codecs.ZstdCodec(level=ZSTD_LEVEL), zarr.codecs.Crc32cCodec()]}
    if cname is None:
        raise OutputError(f"--codec {target.codec}: unknown; use blosc-zstd, blosc-lz4 or zstd")
    if target.zarr_format == 2:
        # Blosc 1 frames carry no checksum: the crc32 filter after Blosc sums the stored bytes.
        return {"compressors": None, "filters": [numcodecs.Blosc(cname=cname, clevel=clevel,
                                                                 shuffle=numcodecs.Blosc.BITSHUFFLE),
                                                 numcodecs.CRC32()]}
    return {"compressors": [zarr.codecs.BloscCodec(cname=cname, clevel=clevel, shuffle="bitshuffle",
                                                   typesize=dtype_size), zarr.codecs.Crc32cCodec()]}


def refuse_occupied(url: str, overwrite: bool, storage_options: dict | None = None,
                    resumable: bool = False, also_ours: tuple = (), other_command: list | None = None
                    ) -> ownership.OutputState:
    """The launcher's check, before any data is read: what is at the output, or OutputError
    when this run may not use it (see transforms/write/ownership.py for the rule)."""
    return ownership.refuse_for_run(url, overwrite, storage_options, resumable, also_ours, other_command)


def prepare_output(target: StoreTarget, overwrite: bool, expected_owner: tuple = (0, "", False),
                   keep_splits: bool = False, before_removing=None, resumable: bool = False,
                   also_ours: tuple = ()) -> list[str]:
    """Claims the output for this run and removes what it replaces, or refuses.

    `expected_owner` is what the launcher found: (claim generation, run id, committed). If
    another run claimed the output since, or the run found there committed it since, this
    run stops without deleting anything: a committed dataset is deleted only by a run whose
    launcher saw it committed. After claiming, it waits for the replaced run's writes in
    flight (ownership.wait_for_writers), so an old run still writing cannot race it.
    `resumable`: an unfinished output may be taken without `overwrite` (the launcher found
    none, or one this command made). `keep_splits`: a resumed run keeps the arrays;
    `before_removing()` runs once the claim is this run's and the old writes have landed,
    before anything is deleted (the staging area forgets the arrays' chunks there).
    `also_ours`: top-level files this run writes there itself (ownership.inspect_output).
    Returns the run ids whose output was replaced (their rejected-line reports go too)."""
    so = target.storage_options
    ownership.refuse_root(target.url, so)
    state = ownership.inspect_output(target.url, so, own_run_id=target.run_id, also_ours=also_ours)
    found = (*state.owner, state.committed)
    if state.owner[1] != target.run_id:  # else: a retry of this step; the claim is this run's already
        if not state.replaceable:
            raise OutputError(ownership.refusal(target.url, state))
        if found != tuple(expected_owner):
            raise _appeared(target, state, expected_owner)
        if (state.kind == "dataset" and not overwrite and (state.committed or not resumable)
                and not ownership.holds_no_work(state)):
            raise OutputError(f"--output {target.url}: exists and is not empty; pass --overwrite to replace it, "
                              f"or choose another path")
        generation = state.owner[0] + 1
        ownership.claim(target.url, target.run_id, generation, so)
        ownership.wait_for_writers(target.url, target.run_id, so)
        now = ownership.inspect_output(target.url, so, own_run_id=target.run_id, also_ours=also_ours)
        if now.committed != state.committed:  # the run found there committed while this one claimed
            ownership.release_claim(target.url, target.run_id, generation, so)
            raise _appeared(target, now, expected_owner)
        if state.kind == "dataset" and state.committed:
            logging.getLogger("flat_tokens").warning("flat-tokens: --overwrite: replacing %s at %s",
                                                     ownership.describe_owner(state), target.url)
    else:
        ownership.wait_for_writers(target.url, target.run_id, so)
    if before_removing is not None:
        before_removing()
    replaced = ownership.remove_replaced(target.url, target.run_id, so,
                                         keep=frozenset(SPLITS) if keep_splits else frozenset())
    if state.owner[0] == 0 and state.owner[1] and state.owner[1] != target.run_id:
        replaced.append(state.owner[1])  # a dataset of an earlier version: its run id is in its attributes
    return replaced


def _appeared(target: StoreTarget, state: ownership.OutputState, expected: tuple) -> OutputTaken:
    return OutputTaken(f"--output {target.url}: {ownership.describe_owner(state)} appeared there after this run was "
                       f"launched (it found {_describe_expected(expected)}); this run stops and deletes nothing")


def _describe_expected(owner: tuple) -> str:
    generation, run_id, committed = (tuple(owner) + (False,))[:3]
    if not run_id:
        return "no flat-tokens output"
    what = "the committed dataset" if committed else "the unfinished output"
    return f"{what} of run {run_id}" + (f" (claim {generation})" if generation else "")


def check_writable(target: StoreTarget) -> None:
    """Writes and deletes a probe object next to the output, so a path that cannot be
    written fails before any data is read, not after hours of tokenizing."""
    fs, path = filesystem(target.url, target.storage_options)
    parent = posixpath.dirname(path.rstrip("/"))
    probe = f"{path.rstrip('/')}.write-check-{target.run_id}"
    try:
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe(probe, b"")
        fs.rm(probe)
    except (OSError, ValueError) as e:
        raise OutputError(f"--output {target.url}: cannot write there ({type(e).__name__}: {e}); "
                          f"choose a writable location") from None


def _objects_of(build) -> dict[str, bytes]:
    """The objects zarr writes for what `build(store)` creates, built in memory: each is then
    stored create-only (transforms/create_only.py), which zarr's own stores cannot do."""
    built = {}
    build(zarr.storage.MemoryStore(store_dict=built))
    return {key: value.to_bytes() for key, value in sorted(built.items())}


def put_objects(target: StoreTarget, objects: dict[str, bytes], lease: ownership.Lease | None) -> None:
    """Stores objects (paths relative to the output) create-only, in order, in the write's lease."""
    fs, root = filesystem(target.url, target.storage_options)
    for relative, data in objects.items():
        create_only.put_new(fs, f"{root.rstrip('/')}/{relative}", data, lease.ledger if lease else None)


def create_split(target: StoreTarget, split: str, tokens: int, sequences: int,
                 lease: ownership.Lease | None = None) -> None:
    """Creates one split's arrays at their final shapes, before any data is written. The
    split's group metadata is written by the commit (with its attributes, create-only), so
    nothing made here is ever updated."""
    def build(store):
        group = zarr.create_group(store=store, zarr_format=target.zarr_format)
        dtypes = {TOKENS: "uint32", SEQ_STARTS: "uint64", SEQ_SOURCES: "uint16"}
        for name in target.arrays():
            length, dtype = array_length(name, tokens, sequences), dtypes[name]
            size = np.dtype(dtype).itemsize
            chunk = target.chunk(name)
            group.create_array(
                name, shape=(length,), dtype=dtype, fill_value=0,
                chunks=(chunk,),
                shards=(target.write_block(name),) if target.chunks_per_shard and target.zarr_format == 3 else None,
                **_codecs(target, size),
                # Every chunk is written, even all-zero ones: the commit counts written chunks.
                config={"write_empty_chunks": True},
            )
    arrays = {f"{split}/{key}": data for key, data in _objects_of(build).items() if "/" in key}
    put_objects(target, arrays, lease)


def keep_split(target: StoreTarget, split: str, tokens: int, sequences: int,
               lease: ownership.Lease | None = None) -> None:
    """A resumed run's split: the arrays an earlier attempt of the same job created, and the
    chunks it wrote, stay; their shapes are checked."""
    for name in target.arrays():
        length = array_length(name, tokens, sequences)
        shape = open_array(target, split, name).shape
        if shape != (length,):
            raise RuntimeError(f"{target.url}/{split}/{name}: has shape {shape}, this job lays out ({length},); "
                               f"the staging area does not describe these arrays: rerun with --restart")


def unfinished_commit(target: StoreTarget) -> list[tuple[str, tuple]]:
    """The split group metadata (and manifest) an earlier attempt's commit left when it was
    killed midway, as listed (path, identity): a resumed run deletes them before the commit
    writes its own."""
    fs, root = filesystem(target.url, target.storage_options)
    root = root.rstrip("/")
    paths = [f"{root}/{split}/{name}" for split in SPLITS for name in ROOT_METADATA] + [f"{root}/{manifest.MANIFEST}"]
    found = []
    for path in paths:
        ident = create_only.identity(fs, path)
        if ident is not None:
            found.append((path, ident))
    return found


def metadata_document(target: StoreTarget, split: str, name: str) -> bytes:
    """The bytes of an output array's metadata document, read with the store's patience and
    read again while they are no JSON (flat_tokens/format/storage_faults.py): a read cut short in
    transit must not fail the run with a JSONDecodeError, as zarr's own read of it did."""
    fs, _ = filesystem(child_url(target.url, split), target.storage_options)
    path = metadata_path(target, split, name)
    what = f"{target.url.rstrip('/')}/{split}/{name}/{posixpath.basename(path)}"
    return storage_faults.cat_file(fs, path, what, storage_faults.not_json)


def open_array(target: StoreTarget, split: str, name: str):
    """An output array, for its metadata (shape, chunks, codecs): opened from its metadata
    document alone (metadata_document), in memory; the writers store chunks themselves."""
    document = posixpath.basename(metadata_path(target, split, name))
    memory = zarr.storage.MemoryStore(store_dict={
        f"{name}/{document}": default_buffer_prototype().buffer.from_bytes(metadata_document(target, split, name))})
    # Every chunk is stored, even all-zero ones: a missing chunk is an error for verify and
    # the reader, never zeros. zarr does not store this setting, and zarr 3.1's open_array
    # ignores its `config` for an existing array, so it is set on the opened array.
    array = zarr.open_array(store=memory, path=name, mode="r+", zarr_format=target.zarr_format)
    return array.with_config({"write_empty_chunks": True})


def metadata_path(target: StoreTarget, split: str, name: str) -> str:
    """Where an array's metadata object is: its identity tells whether the array was replaced."""
    _, root = filesystem(child_url(target.url, split), target.storage_options)
    return posixpath.join(root, name, ".zarray" if target.zarr_format == 2 else "zarr.json")


class ChunkWriter:
    """Writes whole chunks of one zarr v2 array straight to storage: each chunk is encoded
    with the array's own filters and compressor, sealed with its checksum
    (flat_tokens/format/chunk_checksums.py: with zstd, a skippable frame holding the frame's
    CRC-32C after it), and stored under the array's own key, chunks in parallel on a
    thread pool, each create-only (transforms/create_only.py) in the lease of the write.
    Any zarr and numcodecs decodes the bytes to the values zarr's own write would give (a
    test compares them), without zarr's per-chunk path (selection, merge, emptiness check,
    event loop), which measured about a third of the cost of writing. Encoding a chunk
    depends only on its values, so a retried write stores the same bytes."""

    def __init__(self, target: StoreTarget, split: str, name: str, pool):
        self._fs, root = filesystem(child_url(target.url, split), target.storage_options)
        self.metadata = metadata_path(target, split, name)
        self.identity = create_only.identity(self._fs, self.metadata)  # before the array is opened
        array = open_array(target, split, name)
        meta = array.metadata
        if target.zarr_format != 2 or meta.order != "C" or len(meta.shape) != 1:
            raise ValueError(f"{split}/{name}: not a plain 1-D zarr v2 array")
        self._name = name
        self._prefix = posixpath.join(root, name)
        self._meta = meta
        self._dtype = meta.dtype.to_native_dtype()
        self._chunk = meta.chunks[0]
        self._length = meta.shape[0]
        self._filters = tuple(meta.filters or ())
        self._compressor = meta.compressor
        self._scheme = target.checksums()
        if self._scheme == chunk_checksums.ZSTD_FRAME and (self._filters or not isinstance(self._compressor,
                                                                                           numcodecs.Zstd)):
            raise ValueError(f"{split}/{name}: not a plain zstd zarr v2 array")
        self._pool = pool

    def write(self, start: int, values, lease: ownership.Lease | None = None) -> list[tuple[str, Sum]]:
        """Writes `values` at [start, start + len(values)): whole chunks, or the array's last
        chunk up to the array's end. `values`: an array, or anything that slices into parts
        numpy can turn into arrays (records.EncodedTokens). Returns each chunk object written
        (its key under the split, as `_write_chunk` gives it) with its Sum."""
        submitted = self.submit(start, values, lease)
        wait(submitted)  # every chunk settled before any error is raised: none lands later
        return [written.result() for written in submitted]

    def submit(self, start: int, values, lease: ownership.Lease | None = None) -> list[Future]:
        """As `write`, but returns at once: each chunk's write is a future on the pool, whose
        result is (key, Sum)."""
        stop = start + values.size
        if start % self._chunk or (stop % self._chunk and stop != self._length):
            raise ValueError(f"[{start}, {stop}) is not made of whole chunks of {self._chunk}")
        ledger = lease.ledger if lease is not None else None
        if ledger is not None:
            ledger.wrote_into(self.metadata, self.identity)
        first, last = start // self._chunk, -(-stop // self._chunk)
        submitted = []
        try:
            for i in range(first, last):
                submitted.append(self._pool.submit(self._write_chunk, i,
                                                   values[i * self._chunk - start:(i + 1) * self._chunk - start],
                                                   ledger))
        except BaseException:  # the pool was shut down (a teardown): what it took lands before this raises
            wait(submitted)
            raise
        return submitted

    def _write_chunk(self, index: int, values, ledger) -> tuple[str, Sum]:
        data = np.ascontiguousarray(values, dtype=self._dtype)
        if data.size < self._chunk:  # zarr v2 stores the last chunk at full size, padded with the fill value
            fill = 0 if self._meta.fill_value is None else self._meta.fill_value
            data = np.concatenate([data, np.full(self._chunk - data.size, fill, self._dtype)])
        encoded = data
        for codec in self._filters:
            encoded = codec.encode(encoded)
        if self._compressor is not None:
            encoded = self._compressor.encode(encoded)
        if self._scheme == chunk_checksums.ZSTD_FRAME:
            encoded, summed = chunk_checksums.sealed_zstd_frame(encoded)
        else:
            encoded = bytes(encoded)
            summed = Sum.of(encoded)
        key = self._meta.encode_chunk_key((index,))
        create_only.put_new(self._fs, posixpath.join(self._prefix, key), encoded, ledger)
        return f"{self._name}/{key}", summed


class ZarrWriter:
    """Writes through zarr's own array[a:b] = ... (zarr v3: sharding and its codec pipeline),
    into an in-memory copy of the array; the objects it makes are then stored create-only."""

    def __init__(self, target: StoreTarget, split: str, name: str):
        self._fs, root = filesystem(child_url(target.url, split), target.storage_options)
        self.metadata = metadata_path(target, split, name)
        self.identity = create_only.identity(self._fs, self.metadata)
        self._name = name
        self._prefix = posixpath.join(root, name)
        self._format = target.zarr_format
        self._document = metadata_document(target, split, name)

    def write(self, start: int, values, lease: ownership.Lease | None = None) -> list[tuple[str, Sum]]:
        """As ChunkWriter.write: whole write blocks (chunks, or shard objects). Each object's
        Sum is taken from the very bytes stored create-only."""
        ledger = lease.ledger if lease is not None else None
        if ledger is not None:
            ledger.wrote_into(self.metadata, self.identity)
        made = {}
        memory = zarr.storage.MemoryStore(store_dict=made)
        document = posixpath.basename(self.metadata)
        made[document] = default_buffer_prototype().buffer.from_bytes(self._document)
        array = zarr.open_array(store=memory, mode="r+", zarr_format=self._format)
        array = array.with_config({"write_empty_chunks": True})
        array[start:start + values.size] = np.asarray(values)
        written = []
        for key, value in sorted(made.items()):
            if posixpath.basename(key) not in ownership.ARRAY_METADATA:
                data = value.to_bytes()
                create_only.put_new(self._fs, posixpath.join(self._prefix, key), data, ledger)
                written.append((f"{self._name}/{key}", Sum.of(data)))
        return written

    def submit(self, start: int, values, lease: ownership.Lease | None = None) -> list[Future]:
        """As ChunkWriter.submit, but zarr's own path: done when it returns."""
        futures = []
        for written in self.write(start, values, lease):
            futures.append(Future())
            futures[-1].set_result(written)
        return futures


def array_writer(target: StoreTarget, split: str, name: str, pool):
    """The fastest writer of whole write blocks for one output array."""
    if target.zarr_format == 2:
        return ChunkWriter(target, split, name, pool)
    return ZarrWriter(target, split, name)


def commit(target: StoreTarget, root_attributes: dict, split_attributes: dict[str, dict]) -> None:
    """Writes each split's group metadata (with its attributes), then the root group's: the
    dataset exists from here. Every object is created, never updated (create-only: a run
    that lost the output cannot replace them, nor they another run's).

    Only while this run holds the output's claim, and never over a conflict record (another
    run may have written into the output). Retry-safe: a retried commit of the same run finds
    its own objects; another run's commit there is a conflict."""
    so = target.storage_options
    _refuse_conflicts(target)
    lease = ownership.begin_write(target.url, target.run_id, "the commit", so)
    try:
        fs, root = filesystem(target.url, so)
        for split in SPLITS:  # a killed writer's temporary files (local disks only): every write has landed
            create_only.remove_partials(fs, f"{root.rstrip('/')}/{split}")
        put_objects(target, commit_objects(target, root_attributes, split_attributes), lease)
    except create_only.ObjectConflict:
        pass  # recorded in the lease: confirm_written says what it means
    except BaseException:
        ownership.confirm_written(target.url, target.run_id, "the commit", so, lease)
        raise
    try:
        ownership.confirm_written(target.url, target.run_id, "the commit", so, lease)
    except OutputTaken as e:
        if not e.landed_first:
            raise
        # The run that claimed the output waited for this commit to land: the dataset is
        # committed, whole. That run replaces it only if its launcher saw it committed.
        logging.getLogger("flat_tokens").warning("flat-tokens: %s; this run's commit had landed first", e)
    except OutputError as e:
        fs, path = filesystem(target.url, so)
        root = [p for p in lease.ledger.conflicts if posixpath.dirname(p) == path.rstrip("/")]
        if not root:
            raise
        other = (_read_attributes(fs, path.rstrip("/"), target.zarr_format) or {}).get("run_id")
        raise OutputError(f"--output {target.url}: another run (run_id {other}) committed there while this one ran; "
                          f"this run's data is not committed. {e}") from None
    try:
        _refuse_conflicts(target)
    except OutputError:
        fs, _ = filesystem(target.url, so)
        for path, created in sorted(lease.ledger.created.items(), reverse=True):  # the root's last object first
            create_only.take_back(fs, path, created)  # this run's own commit, just written: taken back
        raise


def commit_objects(target: StoreTarget, root_attributes: dict, split_attributes: dict[str, dict]) -> dict:
    """The commit's objects, in the order they are written: each split's group metadata, then
    the root's (`.zattrs` before `.zgroup`: zarr opens the group only once it is there)."""
    objects = {}
    for split, attrs in split_attributes.items():
        made = _objects_of(lambda store, attrs=attrs: zarr.create_group(
            store=store, zarr_format=target.zarr_format, attributes={RUN_ATTRIBUTE: target.run_id, **attrs}))
        objects.update({f"{split}/{key}": data for key, data in made.items()})

    def root_objects(attributes):
        return _objects_of(lambda store: zarr.create_group(store=store, zarr_format=target.zarr_format,
                                                           attributes=attributes))

    # The manifest (issue 37): every object but the root attributes, summed as stored, then
    # sealed in the root attributes, which are written last.
    bound = {k: v for k, v in root_objects(root_attributes).items() if k not in (".zattrs", "zarr.json")}
    fs, root = filesystem(target.url, target.storage_options)
    arrays = {f"{split}/{name}": name for split in split_attributes for name in target.arrays()}
    index = index_objects(fs, root)  # the dedup index (--dedup exact/near), bound to its keys too
    listed = stored_sums.dataset_manifest(fs, root, target.run_id, arrays, {**objects, **bound, **index},
                                          target.checksums())
    manifest_bytes = listed.to_bytes()
    objects[manifest.MANIFEST] = manifest_bytes
    objects.update(root_objects({**root_attributes, manifest.ATTRIBUTE: manifest.seal(manifest_bytes,
                                                                                      root_attributes)}))
    return objects  # sorted root objects: .zattrs, then .zgroup


def _refuse_conflicts(target: StoreTarget) -> None:
    found = ownership.conflicts(target.url, target.storage_options)
    if found:
        raise OutputError(f"--output {target.url}: holds {ownership.listing(found)}: another run may have written "
                          f"into this output, so it is not committed; rerun with --overwrite")


def _read_attributes(fs, path: str, zarr_format: int) -> dict | None:
    try:
        document = storage_faults.read_json(fs, f"{path}/{'.zattrs' if zarr_format == 2 else 'zarr.json'}")
    except (FileNotFoundError, ValueError):
        return None
    return document.get("attributes") if zarr_format == 3 else document


def read_root_attributes(url: str, storage_options: dict | None = None) -> dict:
    """The root group's attributes (zarr 3's `zarr.json`, or zarr 2's `.zgroup` and `.zattrs`),
    read with storage_faults: a document cut short is read again, where zarr's own read made the
    launcher take a dataset it built for no dataset at all. FileNotFoundError when there is no
    group; ValueError when its metadata is not a group's on every fresh read."""
    fs, path = ownership.split_url(url, storage_options)
    try:
        document = storage_faults.read_json(fs, f"{path}/zarr.json")
    except FileNotFoundError:
        document = None
    if document is not None:
        if not isinstance(document, dict) or document.get("node_type") != "group":
            raise ValueError(f"{url}/zarr.json: not a zarr group's metadata")
        return dict(document.get("attributes") or {})
    group = storage_faults.read_json(fs, f"{path}/.zgroup")  # FileNotFoundError: no group here
    if not isinstance(group, dict) or group.get("zarr_format") != 2:
        raise ValueError(f"{url}/.zgroup: not a zarr group's metadata")
    try:
        attributes = storage_faults.read_json(fs, f"{path}/.zattrs")
    except FileNotFoundError:
        return {}
    if not isinstance(attributes, dict):
        raise ValueError(f"{url}/.zattrs: not a zarr group's attributes")
    return attributes
