"""Which storage objects hold a 1-D zarr array's data, by its metadata alone, and which of
them are missing, by one listing.

zarr reads an absent chunk as its fill value (0 here): a lost chunk object would be served
as zeros, silently. So whoever must not serve or accept corrupt data (`verify`, the
trainer-side reader, the ownership check before `--overwrite` deletes) needs the list of
objects the array's layout implies: one per chunk, or, with zarr v3 sharding, one per shard
object (the chunk grid of a sharded array's metadata is its shard grid). Counting them by
listing, not with zarr's `nchunks_initialized`, which in zarr 3.1 counts the inner chunks of
every stored shard and so overcounts a partial last shard.

Pure key arithmetic on the metadata's JSON (`.zarray` or `zarr.json`, or zarr's
`array.metadata.to_dict()`) plus an fsspec listing: no zarr import, no Beam.
"""
from dataclasses import dataclass

from flat_tokens.format.object_trees import walk_tree


@dataclass(frozen=True)
class ChunkObjects:
    """The data objects of one 1-D array: `count` objects named `prefix + str(index)`,
    relative to the array's own directory (`0`, `1`, ... in zarr v2; `c/0`, `c/1`, ... with
    zarr v3's default key encoding); each holds `block` elements (a chunk or a shard)."""

    prefix: str
    count: int
    block: int

    def key(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def index(self, key: str) -> int | None:
        """The index of the object named `key`, or None when the layout names no such object."""
        digits = key[len(self.prefix):] if key.startswith(self.prefix) else ""
        if not (digits.isascii() and digits.isdigit()) or str(int(digits)) != digits or int(digits) >= self.count:
            return None
        return int(digits)

    @property
    def directories(self) -> tuple[str, ...]:
        """Subdirectories the keys live in (`c` for `c/0`), relative to the array."""
        return (self.prefix.rstrip("/"),) if self.prefix.endswith("/") else ()


def chunk_objects(meta: dict) -> ChunkObjects | None:
    """The data objects that a 1-D array's metadata implies; None for metadata this code
    does not know (not 1-D, an irregular chunk grid, an unknown key encoding)."""
    try:
        (length,) = meta["shape"]
        if "chunk_grid" in meta:  # zarr v3 (a sharded array's grid is its shard grid)
            grid = meta["chunk_grid"]
            if grid.get("name") != "regular":
                return None
            (block,) = grid["configuration"]["chunk_shape"]
            encoding = meta.get("chunk_key_encoding") or {"name": "default"}
            if encoding.get("name") == "default":
                prefix = "c" + (encoding.get("configuration") or {}).get("separator", "/")
            elif encoding.get("name") == "v2":
                prefix = ""
            else:
                return None
        else:  # zarr v2: the key of a 1-D array's chunk is its index, whatever the separator
            (block,) = meta["chunks"]
            prefix = ""
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (length, block)) or length < 0 or block < 1:
        return None
    return ChunkObjects(prefix, -(-length // block), block)


def missing_objects(fs, array_path: str, objects: ChunkObjects) -> list[int]:
    """The indices of the data objects `objects` names that are not stored under `array_path`
    (one listing of the array's directory, read page by page: at 1 TB an array holds
    ~890,000 objects, which a whole listing would hold in ~3 GB on GCS)."""
    array_path = array_path.rstrip("/")
    fs.invalidate_cache(array_path)  # gcsfs caches listings
    present = bytearray(objects.count)
    for entries in walk_tree(fs, array_path):
        for key, is_dir in entries:
            index = None if is_dir else objects.index(key)
            if index is not None:
                present[index] = 1
    return [i for i, stored in enumerate(present) if not stored]
