"""The dedup index's files (transforms/tokenize/dedup_index.py writes them): their names and
format, and reading them back, without Beam (verify checks them).

An index file is sealed as staged files are (flat_tokens/format/checksums.py): the payload is
`INDEX_MAGIC`, the document count n (uint64 LE), the n 128-bit content digests sorted (16
bytes each) and the n splits (1 byte each: 0 train, 1 validation).

With --dedup near, each exact file has a near file beside it (`near-<shard>-of-<shards>.bin`,
sealed alike): `NEAR_MAGIC`, n (uint64 LE, the exact file's), then for the same n texts in
the same order (by digest) their near keys (transforms/tokenize/near_index.py): NEAR_BANDS
band keys (uint32 LE each; 0: a text without a signature) and a SKETCH_BYTES-byte sketch.
"""
import posixpath
import re
import struct

import numpy as np
from fsspec.core import url_to_fs

from flat_tokens.format import storage_faults
from flat_tokens.format.checksums import Damaged, object_entry, seal, unseal

INDEX_DIRECTORY = "dedup_index"  # inside the dataset (transforms/write/ownership.py knows it as the layout's)
INDEX_MAGIC = b"FTx1"  # "flat-tokens, exact-text index, version 1"
BYTES_PER_DOCUMENT = 17
_HEADER = len(INDEX_MAGIC) + 8
_FILE = re.compile(r"exact-[0-9]{5}-of-[0-9]{5}\.bin")
NEAR_MAGIC = b"FTn1"  # "flat-tokens, near-copy index, version 1"
NEAR_BANDS = 8  # band keys a text (near_index.py says why 8 of 4 bins)
SKETCH_BYTES = 15  # one bit of each of 120 bins
NEAR_BYTES_PER_DOCUMENT = 4 * NEAR_BANDS + SKETCH_BYTES  # 47: with the exact file's 17, 64 a text
_NEAR_FILE = re.compile(r"near-[0-9]{5}-of-[0-9]{5}\.bin")


class MissingIndex(ValueError):
    """An earlier dataset given to --dedup_against cannot be used: uncommitted, no index, or a
    damaged one."""


def index_file_name(shard: int, shards: int) -> str:
    return f"exact-{shard:05d}-of-{shards:05d}.bin"


def is_index_file(name: str) -> bool:
    """An exact index file (digests and splits)."""
    return bool(_FILE.fullmatch(posixpath.basename(name)))


def near_file_name(shard: int, shards: int) -> str:
    return f"near-{shard:05d}-of-{shards:05d}.bin"


def is_near_file(name: str) -> bool:
    return bool(_NEAR_FILE.fullmatch(posixpath.basename(name)))


def near_file_of(exact_name: str) -> str:
    """The near file beside an exact index file (a path or URL)."""
    head, base = posixpath.split(exact_name)
    return posixpath.join(head, "near-" + base[len("exact-"):])


def digest_order(digests: np.ndarray) -> np.ndarray:
    """The order of an index file's rows: by digest (the exact and the near file alike)."""
    return np.lexsort((digests[:, 1], digests[:, 0]))


def encode_index(digests: np.ndarray, splits: np.ndarray) -> bytes:
    """Sealed index bytes for texts (their (n, 2) uint64 digests, int8 splits), sorted by digest:
    the same texts give the same bytes whatever order they arrived in."""
    order = digest_order(digests)
    payload = (INDEX_MAGIC + struct.pack("<Q", order.size) + digests[order].astype("<u8").tobytes()
               + splits[order].astype(np.int8).tobytes())
    return seal(payload)


def counted_body(data, name: str, magic: bytes, per_document: int, what: str) -> tuple[int, np.ndarray]:
    """(documents, the bytes after the header) of a sealed index file of either part: its seal,
    its `magic` and its size (the header's count times `per_document`) checked; checksums.Damaged
    or MissingIndex, naming `name`, otherwise. Both magics are as long as INDEX_MAGIC."""
    payload = unseal(data, name)
    if payload.nbytes < _HEADER or bytes(payload[:len(magic)]) != magic:
        raise MissingIndex(f"{name}: not {what} of this version (no {magic!r} header)")
    n = struct.unpack("<Q", payload[len(magic):_HEADER])[0]
    if payload.nbytes != _HEADER + per_document * n:
        raise MissingIndex(f"{name}: holds {payload.nbytes} bytes, {_HEADER + per_document * n} for its {n} "
                           f"documents")
    return n, np.frombuffer(payload, dtype=np.uint8, offset=_HEADER)


def decode_index(data, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(digests (n, 2) uint64, splits int8) of a sealed index file; checksums.Damaged, naming
    `name`, when it is not whole."""
    n, body = counted_body(data, name, INDEX_MAGIC, BYTES_PER_DOCUMENT, "a dedup index file")
    digests = body[:16 * n].view("<u8").astype(np.uint64).reshape(-1, 2)
    splits = body[16 * n:].view(np.int8).copy()
    return digests, splits


def encode_near(keys: np.ndarray, sketches: np.ndarray) -> bytes:
    """Sealed near file bytes: the (n, NEAR_BANDS) uint32 band keys and (n, SKETCH_BYTES) uint8
    sketches of an exact file's texts, already in its order (digest_order)."""
    payload = (NEAR_MAGIC + struct.pack("<Q", keys.shape[0]) + np.ascontiguousarray(keys, dtype="<u4").tobytes()
               + np.ascontiguousarray(sketches, dtype=np.uint8).tobytes())
    return seal(payload)


def decode_near(data, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(band keys (n, NEAR_BANDS) uint32, sketches (n, SKETCH_BYTES) uint8) of a sealed near
    file; checksums.Damaged, naming `name`, when it is not whole."""
    n, body = counted_body(data, name, NEAR_MAGIC, NEAR_BYTES_PER_DOCUMENT, "a near-copy index file")
    keys = body[:4 * NEAR_BANDS * n].view("<u4").astype(np.uint32).reshape(-1, NEAR_BANDS)
    sketches = body[4 * NEAR_BANDS * n:].reshape(-1, SKETCH_BYTES).copy()
    return keys, sketches


def index_key(name: str) -> str:
    """The key of an index file (a path or URL ending in its name) under the dataset's root:
    what the dataset's manifest lists it by (flat_tokens/format/manifest.py)."""
    return f"{INDEX_DIRECTORY}/{posixpath.basename(name)}"


def index_objects(fs, base: str) -> dict[str, bytes]:
    """{key under the dataset's root: bytes} of every index file of the dataset at `base`:
    what the commit lists in the manifest, so that a file moved to another shard's name or
    copied from another dataset fails its own key's entry."""
    directory = posixpath.join(base.rstrip("/"), INDEX_DIRECTORY)
    names = sorted(p for p in (fs.ls(directory, detail=False) if fs.exists(directory) else [])
                   if is_index_file(p) or is_near_file(p))
    # Each read again while its seal fails (a body cut short): the manifest must list the stored
    # bytes, not one response's (flat_tokens/format/storage_faults.py).
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
    near = described.get("near")
    near_names = sorted(p for p in (fs.ls(directory, detail=False) if fs.exists(directory) else []) if is_near_file(p))
    if near and sorted(map(near_file_of, names)) != near_names:
        return [f"dedup index: {len(near_names)} near files in {INDEX_DIRECTORY}/ for its {len(names)} exact files: "
                f"each exact file has one beside it"]
    if not near and near_names:
        return [f"dedup index: near files in {INDEX_DIRECTORY}/ that its commit does not record"]
    documents, problems = 0, []
    for name in names:
        data = _read_listed(fs, name, listed)
        why = None if listed is None else listed.problem(index_key(name), data)
        if why:
            problems.append(f"dedup index: {index_key(name)} {why}")
            continue
        try:
            n = decode_index(data, name)[0].shape[0]
            documents += n
            if near:
                problems += _near_problems(fs, near_file_of(name), n, listed)
        except (Damaged, MissingIndex) as e:
            problems.append(f"dedup index: {e}")
    if not problems and documents != described.get("documents"):
        problems.append(f"dedup index: its files list {documents} documents, the commit recorded "
                        f"{described.get('documents')}")
    return problems


def _read_listed(fs, name: str, listed) -> bytes:
    """An index file's bytes, read again while they are not what the manifest lists there (a
    body cut short in transit: storage_faults); the caller judges the last read."""
    judge = None if listed is None else (lambda data: listed.problem(index_key(name), data))
    return storage_faults.cat_file(fs, name, name, judge)


def read_listed(url: str, expected: tuple | None, storage_options: dict | None = None) -> bytes:
    """An earlier dataset's index file (--dedup_against), read again while it is not the object
    its manifest lists (`expected`, its object_entry: a body cut short in transit); the caller
    judges the last read."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    judge = None if expected is None else (lambda data: None if object_entry(data) == tuple(expected)
                                           else "not the object its manifest lists")
    return storage_faults.cat_file(fs, path, url, judge)


def _near_problems(fs, name: str, documents: int, listed) -> list[str]:
    """What is wrong with the near file `name`, beside an exact file of `documents` texts."""
    data = _read_listed(fs, name, listed)
    why = None if listed is None else listed.problem(index_key(name), data)
    if why:
        return [f"dedup index: {index_key(name)} {why}"]
    try:
        n = decode_near(data, name)[0].shape[0]
    except (Damaged, MissingIndex) as e:
        return [f"dedup index: {e}"]
    return [] if n == documents else [f"dedup index: {index_key(name)} lists {n} texts, its exact file {documents}"]
