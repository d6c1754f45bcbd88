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
Pure functions (and the lookup of a dataset's end-of-text id): the Beam job is pipeline/export.py.
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
from fsspec.core import url_to_fs

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


# A tokenizer's end-of-text token, by the names tokenizers give it (GPT-2 and most BPEs, Llama 3,
# Llama 2 / T5 / Mistral, Gemma), the first found among its special added tokens.
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def end_of_text(tokenizer_json: str) -> tuple[int, str] | None:
    """(id, token) of a tokenizer.json's end-of-text token, or None when it defines none: the
    first of END_OF_TEXT_TOKENS that is one of its special added tokens."""
    added = json.loads(tokenizer_json).get("added_tokens") or []
    special = {t.get("content"): t.get("id") for t in added if isinstance(t, dict) and t.get("special")}
    for token in END_OF_TEXT_TOKENS:
        if isinstance(special.get(token), int):
            return special[token], token
    return None


class NoEndOfText(ValueError):
    """The dataset's end-of-text id cannot be known (the message says why, and what to pass)."""


def dataset_end_of_text(tokenizer: dict | None, storage_options: dict | None = None) -> tuple[int, str] | None:
    """(id, token) of the end-of-text token of the tokenizer a dataset records in its provenance
    (root attribute `tokenizer`: spec, kind, sha256), or None when that tokenizer defines none
    (the built-in `bytes` tokenizer, a tokenizer.json with no such special token). The file is
    read again from its spec and must still have the recorded sha256; NoEndOfText when it
    cannot be read, has changed, or the dataset records no tokenizer."""
    fix = "pass --append_eod ID, or --append_eod none to write no end-of-document id"
    if not isinstance(tokenizer, dict) or not tokenizer.get("spec"):
        raise NoEndOfText(f"the dataset records no tokenizer, so its end-of-text id is unknown: {fix}")
    spec, kind = tokenizer["spec"], tokenizer.get("kind")
    if kind == "bytes":
        return None
    if kind != "file":
        raise NoEndOfText(f"the dataset's tokenizer {spec} is a {kind} tokenizer, not a file this export can "
                          f"read to find its end-of-text id: {fix}")
    try:
        fs, path = url_to_fs(spec, **(storage_options or {}))
        with fs.open(path, "rb") as f:
            data = f.read()
    except (OSError, ValueError) as e:
        raise NoEndOfText(f"cannot read the dataset's tokenizer {spec} to find its end-of-text id ({e}): {fix}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != tokenizer.get("sha256"):
        raise NoEndOfText(f"the dataset's tokenizer {spec} has changed since the dataset was written (sha256 "
                          f"{digest}, recorded {tokenizer.get('sha256')}): {fix}")
    try:
        return end_of_text(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NoEndOfText(f"the dataset's tokenizer {spec} is not a tokenizer.json ({e}): {fix}") from None
