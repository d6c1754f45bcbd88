"""The commit's account of what was written: the manifest's entries (flat_tokens/format/manifest.py)
taken from the stored objects themselves.

At commit time every writer has landed and reported; what is stored is what the dataset is.
Each array's metadata is read (a few hundred bytes), and each of its data objects is read
once, on 16 threads, and summed (manifest.Entry). GCS's listed CRC-32C of a whole object is
not enough (a zarr 3 object ends with its own CRC-32C, which makes the whole object's CRC-32C
a constant: see manifest.Entry), so on GCS too the commit reads what was written: at 1 TB,
~256 GB read by the worker that commits (docs/design.md, "Checksums"). A chunk that does not
match the checksum it carries stops the commit (it was damaged after it was written: rerun
the job), and so does a data object the layout implies that is not stored.

Imports no Beam.
"""
from __future__ import annotations

import json
import posixpath
from concurrent.futures import ThreadPoolExecutor

from flat_tokens.format import chunk_checksums, manifest, storage_faults
from flat_tokens.format.checksums import crc32c
from flat_tokens.format.chunk_objects import chunk_objects

ARRAY_METADATA = (".zarray", ".zattrs", "zarr.json")
THREADS = 16


def _read(fs, path: str, judge=None) -> bytes | None:
    """The object's bytes, or None when there is none; read again while `judge` names a problem
    (flat_tokens/format/storage_faults.py: a body cut short in transit is not damage)."""
    try:
        return storage_faults.cat_file(fs, path, path, judge)
    except FileNotFoundError:
        return None


def array_entries(fs, array_path: str, array_key: str, scheme: str | None
                  ) -> tuple[dict[str, manifest.Entry], manifest.ArrayObjects]:
    """One array's metadata entries ({key under the dataset: Entry}) and its data objects'."""
    metadata, document = {}, None
    for name in ARRAY_METADATA:
        data = _read(fs, f"{array_path}/{name}", storage_faults.not_json)
        if data is not None:
            metadata[f"{array_key}/{name}"] = manifest.Entry.of(data)
            if name != ".zattrs":
                document = json.loads(data)
    layout = chunk_objects(document or {})
    if layout is None:
        raise RuntimeError(f"{array_key}: its metadata is missing or not a 1-D array's; the dataset is not committed")
    sharded = any(c.get("name") == "sharding_indexed" for c in (document or {}).get("codecs", []) or [])
    shard_judge = shard_index_problem(document) if sharded else None
    sums: list[manifest.Entry | None] = [None] * layout.count
    fs.invalidate_cache(array_path)

    def read(index: int) -> tuple[int, manifest.Entry | None]:
        judge = shard_judge if sharded else (lambda d: chunk_checksums.problem(d, scheme))
        data = _read(fs, f"{array_path}/{layout.key(index)}", judge)
        if data is None:
            return index, None
        why = None if sharded else chunk_checksums.problem(data, scheme)
        if why:
            raise RuntimeError(f"{array_key}/{layout.key(index)}: the chunk {why}: it was damaged after it was "
                               f"written; the dataset is not committed (rerun the job)")
        return index, manifest.Entry.of(data)

    if layout.count:
        with ThreadPoolExecutor(max(1, min(THREADS, layout.count))) as pool:
            for index, summed in pool.map(read, range(layout.count)):
                sums[index] = summed
    missing = [layout.key(i) for i, s in enumerate(sums) if s is None]
    if missing:
        raise RuntimeError(f"{array_key}: {len(missing)} data objects are missing ({', '.join(missing[:5])}); the "
                           f"dataset is not committed")
    return metadata, manifest.array_objects(layout.prefix, sums)


def shard_index_problem(document: dict):
    """A judge of one stored shard object of a 1-D zarr 3 array with `document` as metadata:
    why its shard index (at its end: an entry of offset and size per inner chunk, then the
    index's CRC-32C) is not whole, or None. A read cut short loses it. None (no judge) where
    the index carries no CRC-32C or does not sit at the end."""
    try:
        sharding = next(c for c in document["codecs"] if c.get("name") == "sharding_indexed")["configuration"]
        inner = int(sharding["chunk_shape"][0])
        outer = int(document["chunk_grid"]["configuration"]["chunk_shape"][0])
        index_codecs = [c.get("name") for c in sharding.get("index_codecs") or []]
    except (KeyError, TypeError, ValueError, IndexError, StopIteration):
        return None
    if sharding.get("index_location", "end") != "end" or index_codecs != ["bytes", "crc32c"] or inner <= 0:
        return None
    index_size = 16 * -(-outer // inner) + 4

    def problem(data) -> str | None:
        view = memoryview(data).cast("B")
        if view.nbytes < index_size:
            return f"holds {view.nbytes} bytes, fewer than its shard index's {index_size}"
        index = view[view.nbytes - index_size:]
        if crc32c(index[:-4]) != int.from_bytes(bytes(index[-4:]), "little"):
            return "its shard index does not match the CRC-32C stored after it (cut short?)"
        return None
    return problem


def dataset_manifest(fs, root: str, run_id: str, arrays: dict[str, str], objects: dict[str, bytes],
                     scheme: str | None) -> manifest.Manifest:
    """The manifest of the dataset at `root` (a path `fs` names): `arrays` {key under the
    root ("train/encoded_tokens"): anything}, whose stored objects are summed; `objects`
    {key: bytes} the commit is about to write (split group metadata, the root's `.zgroup`)."""
    entries = {key: manifest.Entry.of(data) for key, data in objects.items()}
    packed = {}
    for key in sorted(arrays):
        metadata, data = array_entries(fs, posixpath.join(root.rstrip("/"), key), key, scheme)
        entries.update(metadata)
        packed[key] = data
    return manifest.Manifest(run_id, entries, packed)
