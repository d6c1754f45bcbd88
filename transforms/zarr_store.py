"""The output zarr group: where it lives, how its arrays are created, and how it is committed.

The commit protocol: each split (`OUTPUT/train`, `OUTPUT/validation`) is created as the root
of its own store, so creating its arrays writes no metadata at `OUTPUT` itself. The root
group's metadata (`.zgroup`/`.zattrs`, or `zarr.json`) is written last, with the provenance
and `"complete": true`. Until then zarr cannot open `OUTPUT` as a group and
`pipeline.verify` reports an unfinished run.
"""
import posixpath
from dataclasses import dataclass, field

import numcodecs
import numpy as np
import zarr
from fsspec.core import url_to_fs

from transforms.inputs import close_gcs_sessions_at_exit

# After `import zarr`: gcsfs sessions on zarr's event loop must close before zarr stops it.
close_gcs_sessions_at_exit()

# Multi-threaded Blosc writes blocks in the order threads finish: the same chunk would
# compress to different bytes on a retry. Single-threaded, a rewrite is byte-identical.
numcodecs.blosc.use_threads = False

SPLITS = ("train", "validation")
TOKENS = "encoded_tokens"
SEQ_STARTS = "seq_starts"
ROOT_METADATA = (".zgroup", ".zattrs", "zarr.json")
RUN_ATTRIBUTE = "flat_tokens_run"


class OutputError(ValueError):
    """The output path cannot be used; the message names it and says what to do."""


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

    def chunk(self, name: str) -> int:
        return self.tokens_chunk if name == TOKENS else self.seq_starts_chunk

    def write_block(self, name: str) -> int:
        """The unit one writer must own: a chunk, or a whole shard object with sharding."""
        return self.chunk(name) * (self.chunks_per_shard or 1)

    def describe(self) -> dict:
        return {"zarr_format": self.zarr_format, "codec": self.codec,
                "chunks": {TOKENS: self.tokens_chunk, SEQ_STARTS: self.seq_starts_chunk},
                "chunks_per_shard": self.chunks_per_shard}


def _is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def child_url(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def make_store(url: str, storage_options: dict | None = None, read_only: bool = False):
    if _is_remote(url):
        return zarr.storage.FsspecStore.from_url(url, storage_options=storage_options or {}, read_only=read_only)
    path = url[len("file://"):] if url.startswith("file://") else url
    return zarr.storage.LocalStore(path, read_only=read_only)


def filesystem(url: str, storage_options: dict | None = None):
    return url_to_fs(url, **(storage_options or {}))


def _compressors(target: StoreTarget, dtype_size: int):
    cname, clevel = {"blosc-zstd": ("zstd", 3), "blosc-lz4": ("lz4", 5)}.get(target.codec, (None, None))
    if target.codec == "zstd":
        return numcodecs.Zstd(level=3) if target.zarr_format == 2 else zarr.codecs.ZstdCodec(level=3)
    if cname is None:
        raise OutputError(f"--codec {target.codec}: unknown; use blosc-zstd, blosc-lz4 or zstd")
    if target.zarr_format == 2:
        return numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=numcodecs.Blosc.BITSHUFFLE)
    return zarr.codecs.BloscCodec(cname=cname, clevel=clevel, shuffle="bitshuffle", typesize=dtype_size)


def output_state(target: StoreTarget) -> str:
    """"absent", "empty", "ours" (an unfinished run with this run id) or "occupied"."""
    fs, path = filesystem(target.url, target.storage_options)
    if not fs.exists(path):
        return "absent"
    if not fs.isdir(path):
        return "occupied"
    entries = {posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}
    if not entries:
        return "empty"
    if entries <= set(SPLITS) and not entries & set(ROOT_METADATA):
        try:
            runs = {zarr.open_group(make_store(child_url(target.url, s), target.storage_options, True),
                                    mode="r").attrs.get(RUN_ATTRIBUTE) for s in entries}
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError):
            return "occupied"
        if runs == {target.run_id} and target.run_id:
            return "ours"
    return "occupied"


def remove_output(target: StoreTarget) -> None:
    """Deletes the output, uncommitting it first so no reader sees a half-deleted dataset."""
    fs, path = filesystem(target.url, target.storage_options)
    for name in ROOT_METADATA:
        p = posixpath.join(path, name)
        if fs.exists(p):
            fs.rm(p)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.invalidate_cache()


def refuse_occupied(target: StoreTarget, overwrite: bool) -> str:
    """The output's state; raises when something that is not ours is there and may not go."""
    state = output_state(target)
    if state == "occupied" and not overwrite:
        raise OutputError(f"--output {target.url}: exists and is not empty; pass --overwrite to replace it, "
                          f"or choose another path")
    return state


def prepare_output(target: StoreTarget, overwrite: bool) -> None:
    """Makes the output path empty, or refuses: a finished dataset is never clobbered by accident."""
    if refuse_occupied(target, overwrite) in ("ours", "occupied"):
        remove_output(target)


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


def create_split(target: StoreTarget, split: str, tokens: int, sequences: int) -> None:
    """Creates one split's group and arrays at their final shapes, before any data is written."""
    store = make_store(child_url(target.url, split), target.storage_options)
    group = zarr.create_group(store=store, zarr_format=target.zarr_format, overwrite=True,
                              attributes={RUN_ATTRIBUTE: target.run_id})
    for name, length, dtype in ((TOKENS, tokens, "uint32"), (SEQ_STARTS, sequences + 1, "uint64")):
        size = 4 if dtype == "uint32" else 8
        chunk = target.chunk(name)
        group.create_array(
            name, shape=(length,), dtype=dtype, fill_value=0,
            chunks=(chunk,),
            shards=(target.write_block(name),) if target.chunks_per_shard and target.zarr_format == 3 else None,
            compressors=_compressors(target, size),
            # Every chunk is written, even all-zero ones: the commit counts written chunks.
            config={"write_empty_chunks": True},
        )


def open_array(target: StoreTarget, split: str, name: str):
    store = make_store(child_url(target.url, split), target.storage_options)
    # Every chunk is written, even all-zero ones (the commit counts written chunks); zarr
    # does not store this setting, so it is given again on each open.
    return zarr.open_array(store=store, path=name, mode="r+", zarr_format=target.zarr_format,
                           config={"write_empty_chunks": True})


class ChunkWriter:
    """Writes whole chunks of one zarr v2 array straight to storage: each chunk is encoded
    with the array's own compressor and stored under the array's own key, chunks in
    parallel on a thread pool. The bytes are those zarr would write (a test compares them),
    without zarr's per-chunk path (selection, merge, emptiness check, event loop), which
    measured about a third of the cost of writing. Encoding a chunk depends only on its
    values, so a retried write stores the same bytes."""

    def __init__(self, target: StoreTarget, split: str, name: str, pool):
        array = open_array(target, split, name)
        meta = array.metadata
        if target.zarr_format != 2 or meta.filters or meta.order != "C" or len(meta.shape) != 1:
            raise ValueError(f"{split}/{name}: not a plain 1-D zarr v2 array")
        self._fs, root = filesystem(child_url(target.url, split), target.storage_options)
        self._prefix = posixpath.join(root, name)
        self._meta = meta
        self._dtype = meta.dtype.to_native_dtype()
        self._chunk = meta.chunks[0]
        self._length = meta.shape[0]
        self._compressor = meta.compressor
        self._pool = pool

    def write(self, start: int, values: np.ndarray) -> None:
        """Writes `values` at [start, start + len(values)): whole chunks, or the array's last
        chunk up to the array's end."""
        stop = start + values.size
        if start % self._chunk or (stop % self._chunk and stop != self._length):
            raise ValueError(f"[{start}, {stop}) is not made of whole chunks of {self._chunk}")
        first, last = start // self._chunk, -(-stop // self._chunk)
        list(self._pool.map(lambda i: self._write_chunk(i, values[i * self._chunk - start:
                                                                   (i + 1) * self._chunk - start]),
                            range(first, last)))

    def _write_chunk(self, index: int, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self._dtype)
        if data.size < self._chunk:  # zarr v2 stores the last chunk at full size, padded with the fill value
            fill = 0 if self._meta.fill_value is None else self._meta.fill_value
            data = np.concatenate([data, np.full(self._chunk - data.size, fill, self._dtype)])
        encoded = self._compressor.encode(data) if self._compressor is not None else data.tobytes()
        self._fs.pipe_file(posixpath.join(self._prefix, self._meta.encode_chunk_key((index,))), bytes(encoded))


class ZarrWriter:
    """Writes through zarr's own array[a:b] = ... (zarr v3: sharding and its codec pipeline)."""

    def __init__(self, target: StoreTarget, split: str, name: str):
        self._array = open_array(target, split, name)

    def write(self, start: int, values: np.ndarray) -> None:
        self._array[start:start + values.size] = values


def array_writer(target: StoreTarget, split: str, name: str, pool):
    """The fastest writer of whole write blocks for one output array."""
    if target.zarr_format == 2:
        return ChunkWriter(target, split, name, pool)
    return ZarrWriter(target, split, name)


def commit(target: StoreTarget, root_attributes: dict, split_attributes: dict[str, dict]) -> None:
    """Writes the split attributes, then the root group metadata: the dataset exists from here.

    Retry-safe: a retried commit of the same run rewrites the same attributes. (zarr's
    create_group(overwrite=True) would delete the children, so it is never used here.)"""
    for split, attrs in split_attributes.items():
        group = zarr.open_group(make_store(child_url(target.url, split), target.storage_options),
                                mode="r+", zarr_format=target.zarr_format)
        group.attrs.update(attrs)
    root_store = make_store(target.url, target.storage_options)
    try:
        root = zarr.open_group(root_store, mode="r+", zarr_format=target.zarr_format)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        zarr.create_group(store=root_store, zarr_format=target.zarr_format, attributes=root_attributes)
        return
    if root.attrs.get("run_id") != target.run_id:
        raise OutputError(f"--output {target.url}: another run (run_id {root.attrs.get('run_id')}) committed "
                          f"there while this one ran; this run's data is not committed")
    root.attrs.update(root_attributes)


def read_root_attributes(url: str, storage_options: dict | None = None) -> dict:
    group = zarr.open_group(make_store(url, storage_options, read_only=True), mode="r")
    return dict(group.attrs)
