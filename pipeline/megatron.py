"""Megatron-LM's IndexedDataset layout (a `.bin`/`.idx` pair), for `flat-tokens export`.

`PREFIX.bin` holds every sequence's token ids back to back, in the index's dtype. `PREFIX.idx`
holds, little-endian:

    b"MMIDIDX\\x00\\x00"        9 bytes, the header
    version                    uint64, 1
    dtype code                 uint8: 8 for uint16, 4 for int32 (Megatron's DType enum)
    sequence count N           uint64
    document count N + 1       uint64
    sequence lengths           N x int32, in tokens
    sequence pointers          N x int64, the byte offset of each sequence in the .bin
    document indices           (N + 1) x int64: 0, 1, ..., N (one sequence per document)

Checked against megatron/core/datasets/indexed_dataset.py (`_IndexWriter`, `_IndexReader`,
`DType`); Megatron picks uint16 below 65,500 ids and int32 otherwise, as `dtype_for` does.
Pure functions: the Beam job is pipeline/export.py.
"""
from __future__ import annotations

import struct

import numpy as np

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
UINT16_BELOW = 65500  # Megatron's DType.optimal_dtype: uint16 for fewer ids than this


def dtype_for(max_id: int) -> np.dtype:
    """The .bin dtype for ids up to max_id: uint16 while max_id + 1 < 65,500 ids, else int32."""
    return np.dtype(np.uint16) if max_id + 1 < UINT16_BELOW else np.dtype(np.int32)


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The .idx of sequences of these lengths (tokens), one document each."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > np.iinfo(np.int32).max):
        raise ValueError("sequence lengths must be in [1, 2**31 - 1] for the int32 lengths of the index")
    n = int(lengths.size)
    pointers = (np.cumsum(lengths) - lengths) * dtype.itemsize
    return b"".join([
        HEADER, struct.pack("<Q", VERSION), struct.pack("<B", DTYPE_CODES[dtype]),
        struct.pack("<Q", n), struct.pack("<Q", n + 1),
        lengths.astype("<i4").tobytes(), pointers.astype("<i8").tobytes(),
        np.arange(n + 1, dtype="<i8").tobytes(),
    ])


def bin_bytes(encoded: np.ndarray, bounds: np.ndarray, dtype: np.dtype, append_eod: int | None) -> bytes:
    """The .bin bytes of whole sequences: `encoded` flat-tokens values, sequence k at
    [bounds[k], bounds[k+1]); each followed by the id `append_eod` when it is given."""
    ids = (np.asarray(encoded, dtype=np.uint32) >> np.uint32(1)).astype(dtype.newbyteorder("<"))
    if append_eod is not None:
        ids = np.insert(ids, np.asarray(bounds[1:], dtype=np.int64), np.array(append_eod, dtype=ids.dtype))
    return ids.tobytes()


def part_name(prefix: str, split: str, index: int) -> str:
    """The path prefix of one part: PREFIX-train-00000 (Megatron adds .bin and .idx)."""
    return f"{prefix}-{split}-{index:05d}"


def data_path(parts: list[tuple[int, str]]) -> str:
    """Megatron's blend list for parts given as (tokens, prefix): `W1 P1 W2 P2 ...`, weighted by
    tokens so that sampling the blend is sampling the split's tokens uniformly."""
    return " ".join(f"{tokens} {prefix}" for tokens, prefix in parts)
