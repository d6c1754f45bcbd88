"""The checksum every array chunk carries (issue 27), and the check of a stored chunk.

One scheme per zarr format and codec, recorded in the dataset's provenance (root attribute
`storage.checksums`); docs/design.md ("Chunks and codecs") has the measurements behind it:

* `zstd+crc32c-frame` (zarr 2, `--codec zstd`, the default): each chunk is the zstd frame
  zarr would write, followed by a zstd *skippable frame* holding the CRC-32C of the zstd
  frame's bytes. Every zstd decoder skips such a frame (the format reserves them for user
  data), so the chunk stays readable by any zarr and numcodecs, and `.zarray` keeps the plain
  `{"id": "zstd", "level": 1}`. Not zstd's own content checksum (XXH64 of the values): every
  zstd decoder checks it, but checking it cost the reader ~8% of its instructions, it misses
  flips that decode to the same values (the frame header's window and unused bits, entropy
  tables), and `"checksum": true` in `.zarray` makes numcodecs before 0.13 refuse the array
  (`Zstd() got an unexpected keyword argument 'checksum'`). The CRC-32C of the stored bytes
  costs ~0.4% and catches every flip (docs/design.md, "Checksums").
* `crc32c` (zarr 3, any codec): zarr 3's standard `crc32c` codec after the compressor; with
  sharding it follows each inner chunk, and zarr's shard index carries its own.
* `crc32` (zarr 2, `--codec blosc-*`): Blosc 1 frames carry no checksum, so the chunk is the
  Blosc frame behind numcodecs' `crc32` filter (zlib's CRC-32 of it, in 4 bytes before it):
  `.zarray` has `"compressor": null, "filters": [blosc, crc32]`, which every numcodecs reads
  (its `crc32c` filter came only with 0.14).

The stored bytes of a chunk are checked here, where they are read (flat_tokens/read_guard.py);
zarr itself also checks the `crc32c` and `crc32` codecs as it decodes.
Datasets written before this had no scheme (None): they are read as ever, unchecked, and
`flat-tokens verify` says so.

Imports no Beam: the reader uses it.
"""
from __future__ import annotations

import struct
import zlib

from flat_tokens.format.checksums import Sum, crc32c

ZSTD_FRAME = "zstd+crc32c-frame"
CRC32C = "crc32c"
CRC32 = "crc32"
SCHEMES = (ZSTD_FRAME, CRC32C, CRC32)

# A skippable frame: magic 0x184D2A50-0x184D2A5F, then its payload's size (4), then the
# payload: the CRC-32C of the zstd frame before it. All little-endian, as zstd's fields are.
SKIPPABLE_MAGIC = 0x184D2A5C
_TRAILER = struct.Struct("<III")
TRAILER_SIZE = _TRAILER.size


def scheme(zarr_format: int, codec: str) -> str:
    """The checksum scheme of the chunks this version writes with `--zarr_format`/`--codec`."""
    if zarr_format == 3:
        return CRC32C
    return ZSTD_FRAME if codec == "zstd" else CRC32


def seal_zstd_frame(frame) -> bytes:
    """A ZSTD_FRAME chunk: the zstd frame, then the skippable frame holding its CRC-32C."""
    return sealed_zstd_frame(frame)[0]


def sealed_zstd_frame(frame) -> tuple[bytes, Sum]:
    """seal_zstd_frame's chunk, and its Sum (size and CRC-32C of the whole object: the frame's
    CRC-32C extended over the 12 bytes after it, so the frame is summed once)."""
    frame_crc = crc32c(frame)
    trailer = _TRAILER.pack(SKIPPABLE_MAGIC, 4, frame_crc)
    return bytes(frame) + trailer, Sum(len(frame) + len(trailer), crc32c(trailer, frame_crc))


def problem(data, scheme_name: str | None) -> str | None:
    """Why the stored bytes of one whole chunk (not a shard) do not match the checksum they
    carry under `scheme_name` (a phrase: "the chunk ..."), or None when they do (or when the
    scheme is None: unchecked)."""
    if scheme_name is None:
        return None
    view = memoryview(data).cast("B")
    n = view.nbytes
    if scheme_name == ZSTD_FRAME:
        if n < TRAILER_SIZE:
            return f"holds {n} bytes, too few for a zstd frame and its checksum frame (truncated?)"
        magic, size, stored = _TRAILER.unpack(view[n - TRAILER_SIZE:])
        if magic != SKIPPABLE_MAGIC or size != 4:
            return "does not end with its checksum frame (truncated, or damaged at its end)"
        return _mismatch("CRC-32C", crc32c(view[:n - TRAILER_SIZE]), stored)
    if scheme_name == CRC32C:
        if n < 4:
            return f"holds {n} bytes, too few for its CRC-32C (truncated?)"
        stored = struct.unpack("<I", view[n - 4:])[0]
        return _mismatch("CRC-32C", crc32c(view[:n - 4]), stored)
    if scheme_name == CRC32:
        if n < 4:
            return f"holds {n} bytes, too few for its CRC-32 (truncated?)"
        stored = struct.unpack("<I", view[:4])[0]
        return _mismatch("CRC-32", zlib.crc32(view[4:]), stored)
    return f"carries an unknown checksum scheme {scheme_name!r} (written by a newer version?)"


def check_zstd_frame(data) -> tuple[int | None, str | None]:
    """A ZSTD_FRAME chunk's frame CRC-32C (None when it has no checksum frame) and why it does
    not match (None when it does): `problem`, keeping the CRC for the manifest's check."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    if n < TRAILER_SIZE:
        return None, problem(view, ZSTD_FRAME)
    magic, size, stored = _TRAILER.unpack(view[n - TRAILER_SIZE:])
    if magic != SKIPPABLE_MAGIC or size != 4:
        return None, problem(view, ZSTD_FRAME)
    got = crc32c(view[:n - TRAILER_SIZE])
    return got, _mismatch("CRC-32C", got, stored)


def carried(data) -> str | None:
    """The scheme a whole chunk's bytes show they carry whatever the attributes say: ZSTD_FRAME
    when they end with its checksum frame (so removing `storage.checksums` from the root
    attributes does not turn the check off), else None (zarr checks the crc32c and crc32
    codecs it finds in the array's metadata itself)."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    if n < TRAILER_SIZE:
        return None
    magic, size, _ = _TRAILER.unpack(view[n - TRAILER_SIZE:])
    return ZSTD_FRAME if magic == SKIPPABLE_MAGIC and size == 4 else None


def _mismatch(name: str, got: int, stored: int) -> str | None:
    return None if got == stored else f"does not match its {name}: its bytes give {got:08x}, it carries {stored:08x}"


def of_dataset(attrs: dict) -> str | None:
    """The scheme a dataset's root attributes record (None: written before chunks carried one)."""
    storage = attrs.get("storage")
    value = storage.get("checksums") if isinstance(storage, dict) else None
    return value if isinstance(value, str) else None
