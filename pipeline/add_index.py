"""`flat-tokens index DATASET`: gives a committed dataset built without a dedup index (with
--dedup none, or by a version before indexes) its exact index, so that later builds can be
deduplicated against it (--dedup_against), without changing its arrays.

    flat-tokens index gs://b/flat-tokens/2024-06-01.zarr [--tokenizer tokenizer.json]

A text's identity is the digest of its UTF-8 bytes, and a dataset holds token ids: each
sequence is decoded with the dataset's own tokenizer (the one its provenance records, checked
by sha256; --tokenizer names where it is when the recorded path is not reachable from here)
and encoded again. Only tokenizers that give back the text read are accepted: `bytes`, and
byte-level BPEs (decoder ByteLevel) without a normalizer; every sequence must also encode
back to its ids. Others (a normalizer that lowercases, a pre-tokenizer that drops spaces)
map several texts to the same ids, and the decoded text's digest would match nothing.
Refused too: a dataset that fails `flat-tokens verify`, one that already has an index, and
one whose documents were truncated or split into pieces by --max_tokens (a piece is not a
document). Texts dropped as too short were never stored: a later build keeps their
copies. Copies stored twice (a dataset built without dedup, or a mixture's repeated train
documents) are indexed once, with the split they are in (validation when they are in both).

With --dedup near (and --near_shingle, --near_shingle_size, --near_hashes as the pipeline's)
the near part too, from each decoded text's signature (transforms/tokenize/near_index.py).

Written: the index files (create-only, as a build writes them; dedup shards by the dataset's
seed and one shard per million texts), then the manifest with their entries added, then the
root attributes with stats.dedup_index (and `added_by`) and the manifest's new seal. The last
two are two objects: a process killed between them leaves a dataset whose seal does not match
(refused by readers and verify, nothing served wrong); an error while writing the attributes
puts the previous manifest back.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import posixpath
import sys

import numpy as np
import zarr
from fsspec.core import url_to_fs

from flat_tokens import read_guard
from flat_tokens.format import manifest
from flat_tokens.format.index_files import (INDEX_DIRECTORY, NEAR_BANDS, SKETCH_BYTES, digest_order, encode_index,
                                             encode_near, index_file_name, index_key, near_file_name)
from flat_tokens.tools.verify import CannotOpen, verify_dataset
from transforms import create_only, hashing
from transforms.tokenize import dedup_index
from transforms.tokenize.characters import BatchText
from transforms.tokenize.dedup import digests_of
from transforms.tokenize.minhash import SHINGLES, MinHashSettings, batch_signatures
from transforms.tokenize.near_index import near_keys
from transforms.tokenize.tokenizer import TokenizerInfo, load_encoders
from transforms.write.zarr_store import make_store, read_root_attributes

SEQUENCES_AT_ONCE = 65536  # decoded and re-encoded together: memory is one block's texts
TEXTS_PER_SHARD = 1 << 20


class IndexRefused(ValueError):
    """The dataset cannot be given an index; the message says why and what to do."""


def _tokenizer(attrs: dict, override: str | None) -> tuple[object, object]:
    """(decode(ids) -> str, encode(texts) -> (ids, lengths)) of the dataset's tokenizer."""
    recorded = attrs.get("tokenizer") or {}
    if recorded.get("kind") == "bytes":
        info = TokenizerInfo("bytes", "bytes", recorded["sha256"], 257)
        return (lambda ids: (np.asarray(ids) - 1).astype(np.uint8).tobytes().decode("utf-8")), load_encoders(info)[0]
    spec = override or recorded.get("spec")
    try:
        fs, path = url_to_fs(spec)
        text = fs.cat_file(path).decode("utf-8")
    except Exception as e:  # noqa: BLE001 - any reason it cannot be read is the same answer
        raise IndexRefused(f"the dataset's tokenizer {spec} cannot be read from here ({type(e).__name__}: {e}); "
                           f"pass --tokenizer PATH (a copy of it)") from None
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != recorded.get("sha256"):
        raise IndexRefused(f"--tokenizer {spec}: not the tokenizer the dataset was built with (its sha256 differs "
                           f"from the recorded {recorded.get('sha256')})")
    described = json.loads(text)
    if described.get("normalizer") is not None or (described.get("decoder") or {}).get("type") != "ByteLevel":
        raise IndexRefused(f"the dataset's tokenizer {spec} is not a byte-level BPE without a normalizer, so its "
                           f"ids may not give back the texts read (a lowercased or re-spaced text encodes to the "
                           f"same ids); rebuild the dataset with --dedup exact (and --overwrite) to give it an index")
    from tokenizers import Tokenizer
    decoder = Tokenizer.from_str(text)
    info = TokenizerInfo(spec, "file", recorded["sha256"], int(recorded.get("vocab_size", 0)),
                         split_special_tokens=bool(recorded.get("split_special_tokens")))
    return (lambda ids: decoder.decode(np.asarray(ids).tolist(), skip_special_tokens=False)), load_encoders(info)[0]


def split_digests(group, decode, encode, split: str, near: MinHashSettings | None = None):
    """(n, 2) uint64 digests of a split's sequences, each decoded and checked to encode back,
    and with `near` their near keys (near_index.near_keys: (keys, sketches)), else None."""
    starts = group["seq_starts"][:].astype(np.int64)
    found = [np.empty((0, 2), np.uint64)]
    keys = [np.empty((0, NEAR_BANDS), np.uint32)]
    sketches = [np.empty((0, SKETCH_BYTES), np.uint8)]
    for first in range(0, starts.size - 1, SEQUENCES_AT_ONCE):
        last = min(first + SEQUENCES_AT_ONCE, starts.size - 1)
        ids = group["encoded_tokens"][starts[first]:starts[last]].astype(np.int64) >> 1
        bounds = starts[first:last + 1] - starts[first]
        texts = [decode(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        again, lengths = encode(texts)
        if not np.array_equal(np.asarray(lengths), np.diff(bounds)) or not np.array_equal(
                np.asarray(again, dtype=np.int64), ids):
            raise IndexRefused(f"{split}: a sequence among {first}-{last - 1} does not encode back to its ids once "
                               f"decoded: the tokenizer loses text, so the texts the dataset was built from cannot "
                               f"be recovered; rebuild it with --dedup exact (and --overwrite) to give it an index")
        text = BatchText.of(texts)
        found.append(digests_of(text.encoded))
        if near is not None:
            signatures = batch_signatures(near, text, ids.astype(np.uint32), np.diff(bounds))
            k, sk = near_keys(signatures)
            keys.append(k)
            sketches.append(sk)
    return np.concatenate(found), (np.concatenate(keys), np.concatenate(sketches)) if near is not None else None


def add_index(url: str, tokenizer: str | None = None, storage_options: dict | None = None,
              near: MinHashSettings | None = None) -> dict:
    """Adds the dedup index to the committed dataset at `url` (with `near`, its near part too,
    for --dedup near builds with those signature settings); returns stats.dedup_index."""
    try:
        problems = verify_dataset(url, storage_options=storage_options)
    except CannotOpen as e:
        raise IndexRefused(f"{url}: cannot be opened as a flat-tokens dataset ({e})") from None
    if problems:
        raise IndexRefused(f"{url} fails verification ({problems[0]}); a dataset that is not whole is not indexed")
    attrs = read_root_attributes(url, storage_options)
    stats = attrs.get("stats") or {}
    if stats.get("dedup_index"):
        raise IndexRefused(f"{url} already has a dedup index")
    if stats.get("truncated", 0) or stats.get("extra_sequences", 0):
        raise IndexRefused(f"{url}: documents were truncated or split into pieces by --max_tokens, so its sequences "
                           f"are not the texts read; rebuild it with --dedup exact (and --overwrite) instead")
    listed = read_guard.load_manifest(url, storage_options)
    decode, encode = _tokenizer(attrs, tokenizer)
    root = zarr.open_group(make_store(url, storage_options, read_only=True), mode="r")
    digests, splits, keys, sketches = [], [], [], []
    for number, split in enumerate(("train", "validation")):
        found, near_rows = split_digests(root[split], decode, encode, split, near)
        digests.append(found)
        splits.append(np.full(found.shape[0], number, dtype=np.int8))
        if near_rows is not None:
            keys.append(near_rows[0])
            sketches.append(near_rows[1])
    digests, splits = np.concatenate(digests), np.concatenate(splits)
    # Each text once, validation when it is in both (a train copy is repeated by a mixture).
    order = np.lexsort((-splits, digests[:, 1], digests[:, 0]))
    first = np.ones(order.size, dtype=bool)
    first[1:] = np.any(digests[order][1:] != digests[order][:-1], axis=1)
    kept = order[first]
    digests, splits = digests[kept], splits[kept]
    if near is not None:
        keys, sketches = np.concatenate(keys)[kept], np.concatenate(sketches)[kept]

    fs, path = url_to_fs(url, **(storage_options or {}))
    directory = posixpath.join(path.rstrip("/"), INDEX_DIRECTORY)
    fs.makedirs(directory, exist_ok=True)
    shards = max(1, -(-digests.shape[0] // TEXTS_PER_SHARD))
    counts, written = {}, {}
    by_shard = hashing.content_shards(digests, int(attrs.get("seed", 0)), shards)
    for shard in np.unique(by_shard).tolist():
        chosen = by_shard == shard
        data = encode_index(digests[chosen], splits[chosen])
        name = posixpath.join(directory, index_file_name(shard, shards))
        if near is not None:  # in the exact file's order (digest_order), as a build writes it
            rows = np.flatnonzero(chosen)[digest_order(digests[chosen])]
            near_data = encode_near(keys[rows], sketches[rows])
            near_name = posixpath.join(directory, near_file_name(shard, shards))
            create_only.put_new(fs, near_name, near_data)
            written[index_key(near_name)] = near_data
            counts[dedup_index.NEAR_BYTES] = counts.get(dedup_index.NEAR_BYTES, 0) + len(near_data)
            counts[dedup_index.NEAR_FILES] = counts.get(dedup_index.NEAR_FILES, 0) + 1
        create_only.put_new(fs, name, data)
        written[index_key(name)] = data
        for key, n in ((dedup_index.INDEX_DOCUMENTS, int(chosen.sum())), (dedup_index.INDEX_BYTES, len(data)),
                       (dedup_index.INDEX_FILES, 1)):
            counts[key] = counts.get(key, 0) + n
    described = {**dedup_index.index_stats(counts), "added_by": "flat-tokens index"}
    if near is not None:
        dedup_index.near_index_stats(described, {"shingle": near.shingle, "shingle_size": near.shingle_size,
                                                 "hashes": near.hashes})
    new_attrs = {k: v for k, v in attrs.items() if k != manifest.ATTRIBUTE}
    new_attrs["stats"] = {**stats, "dedup_index": described}
    if listed is not None:
        previous = listed.to_bytes()
        listed.objects.update({key: manifest.Entry.of(data) for key, data in written.items()})
        manifest_bytes = listed.to_bytes()
        new_attrs[manifest.ATTRIBUTE] = manifest.seal(manifest_bytes, new_attrs)
        where = posixpath.join(path.rstrip("/"), manifest.MANIFEST)
        fs.pipe_file(where, manifest_bytes)
        try:
            _write_attributes(fs, path.rstrip("/"), new_attrs)
        except BaseException:
            fs.pipe_file(where, previous)
            raise
    else:
        _write_attributes(fs, path.rstrip("/"), new_attrs)
    return described


def _write_attributes(fs, path: str, attrs: dict) -> None:
    """The root attributes, in place: `.zattrs` (zarr 2) or the attributes of `zarr.json` (zarr 3)."""
    if fs.exists(f"{path}/zarr.json"):
        document = json.loads(fs.cat_file(f"{path}/zarr.json"))
        document["attributes"] = attrs
        fs.pipe_file(f"{path}/zarr.json", json.dumps(document, indent=2).encode())
    else:
        fs.pipe_file(f"{path}/.zattrs", json.dumps(attrs, indent=2).encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flat-tokens index", description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a committed flat-tokens dataset (local path or gs://)")
    ap.add_argument("--tokenizer", help="where the dataset's tokenizer.json is, when its recorded path is not "
                                        "reachable from here (checked by sha256)")
    ap.add_argument("--dedup", choices=("exact", "near"), default="exact",
                    help="near: also the near part, for later --dedup near builds with the same signature options")
    ap.add_argument("--near_shingle", choices=SHINGLES, default=MinHashSettings.shingle)
    ap.add_argument("--near_shingle_size", type=int, default=MinHashSettings.shingle_size)
    ap.add_argument("--near_hashes", type=int, choices=(64, 128, 256, 512, 1024), default=MinHashSettings.hashes)
    a = ap.parse_args(argv)
    near = MinHashSettings(a.near_shingle, a.near_shingle_size, a.near_hashes) if a.dedup == "near" else None
    try:
        described = add_index(a.dataset, a.tokenizer, near=near)
    except (IndexRefused, read_guard.DatasetError, create_only.ObjectConflict) as e:
        print(f"flat-tokens index: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.dataset}: dedup index added: {described['documents']:,} texts in {described['files']} files, "
          f"{described['bytes']:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
