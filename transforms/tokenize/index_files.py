"""The dedup index's files (transforms/tokenize/dedup_index.py writes them): their names and
format, and reading them back, without Beam (verify checks them).

An index file is sealed as staged files are (transforms/checksums.py): the payload is
`INDEX_MAGIC`, the document count n (uint64 LE), the n 128-bit content digests sorted (16
bytes each) and the n splits (1 byte each: 0 train, 1 validation).
"""
import posixpath
import re
import struct

import numpy as np

from transforms import storage_faults
from transforms.checksums import Damaged, seal, unseal

INDEX_DIRECTORY = "dedup_index"  # inside the dataset (transforms/write/ownership.py knows it as the layout's)
INDEX_MAGIC = b"FTx1"  # "flat-tokens, exact-text index, version 1"
BYTES_PER_DOCUMENT = 17
_HEADER = len(INDEX_MAGIC) + 8
_FILE = re.compile(r"exact-[0-9]{5}-of-[0-9]{5}\.bin")


class MissingIndex(ValueError):
    """An earlier dataset given to --dedup_against cannot be used: uncommitted, no index, or a
    damaged one."""


def index_file_name(shard: int, shards: int) -> str:
    return f"exact-{shard:05d}-of-{shards:05d}.bin"


def is_index_file(name: str) -> bool:
    return bool(_FILE.fullmatch(posixpath.basename(name)))


def encode_index(digests: np.ndarray, splits: np.ndarray) -> bytes:
    """Sealed index bytes for texts (their (n, 2) uint64 digests, int8 splits), sorted by digest:
    the same texts give the same bytes whatever order they arrived in."""
    order = np.lexsort((digests[:, 1], digests[:, 0]))
    payload = (INDEX_MAGIC + struct.pack("<Q", order.size) + digests[order].astype("<u8").tobytes()
               + splits[order].astype(np.int8).tobytes())
    return seal(payload)


def decode_index(data, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(digests (n, 2) uint64, splits int8) of a sealed index file; checksums.Damaged, naming
    `name`, when it is not whole."""
    payload = unseal(data, name)
    if payload.nbytes < _HEADER or bytes(payload[:len(INDEX_MAGIC)]) != INDEX_MAGIC:
        raise MissingIndex(f"{name}: not a dedup index file of this version (no {INDEX_MAGIC!r} header)")
    n = struct.unpack("<Q", payload[len(INDEX_MAGIC):_HEADER])[0]
    if payload.nbytes != _HEADER + BYTES_PER_DOCUMENT * n:
        raise MissingIndex(f"{name}: holds {payload.nbytes} bytes, {_HEADER + BYTES_PER_DOCUMENT * n} for its {n} "
                           f"documents")
    body = np.frombuffer(payload, dtype=np.uint8, offset=_HEADER)
    digests = body[:16 * n].view("<u8").astype(np.uint64).reshape(-1, 2)
    splits = body[16 * n:].view(np.int8).copy()
    return digests, splits


def index_key(name: str) -> str:
    """The key of an index file (a path or URL ending in its name) under the dataset's root:
    what the dataset's manifest lists it by (transforms/write/manifest.py)."""
    return f"{INDEX_DIRECTORY}/{posixpath.basename(name)}"


def index_objects(fs, base: str) -> dict[str, bytes]:
    """{key under the dataset's root: bytes} of every index file of the dataset at `base`:
    what the commit lists in the manifest, so that a file moved to another shard's name or
    copied from another dataset fails its own key's entry."""
    directory = posixpath.join(base.rstrip("/"), INDEX_DIRECTORY)
    names = sorted(p for p in (fs.ls(directory, detail=False) if fs.exists(directory) else []) if is_index_file(p))
    # Each read again while its seal fails (a body cut short): the manifest must list the stored
    # bytes, not one response's (transforms/storage_faults.py).
    return {index_key(name): storage_faults.cat_file(fs, name, name,
                                                     storage_faults.judged_by(lambda d, n=name: unseal(d, n)))
            for name in names}


def index_problems(fs, base: str, described: dict, listed=None) -> list[str]:
    """What is wrong with a committed dataset's dedup index (at `base` on `fs`), as its
    stats["dedup_index"] (`described`) records it: files missing or extra, damaged, not the
    ones the dataset's manifest `listed` (when it has one) names, or documents that do not add
    up."""
    directory = posixpath.join(base.rstrip("/"), INDEX_DIRECTORY)
    names = sorted(p for p in (fs.ls(directory, detail=False) if fs.exists(directory) else []) if is_index_file(p))
    if len(names) != described.get("files"):
        return [f"dedup index: {len(names)} files in {INDEX_DIRECTORY}/, the commit recorded {described.get('files')}"]
    documents, problems = 0, []
    for name in names:
        data = fs.cat_file(name)
        why = None if listed is None else listed.problem(index_key(name), data)
        if why:
            problems.append(f"dedup index: {index_key(name)} {why}")
            continue
        try:
            documents += decode_index(data, name)[0].shape[0]
        except (Damaged, MissingIndex) as e:
            problems.append(f"dedup index: {e}")
    if not problems and documents != described.get("documents"):
        problems.append(f"dedup index: its files list {documents} documents, the commit recorded "
                        f"{described.get('documents')}")
    return problems
