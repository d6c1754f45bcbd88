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

Fenced like a run's writes (transforms/write/ownership.py), as the run that committed the
dataset: the writes hold a lease and check that run's claim is still the newest before and
after, so a `run --overwrite` that takes the output over meanwhile waits for them, or they
take back what they did. The manifest and the attributes are replaced only while each is
still the object found before the dataset was read (create_only.replace_if): one rewritten
meanwhile (another `index`, a run) is left as it is, and the command says so (exit 2).
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
from flat_tokens.format import manifest, storage_faults
from flat_tokens.format.object_trees import identity
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
from transforms.write import ownership
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
    fs, path = url_to_fs(url, **(storage_options or {}))
    path = path.rstrip("/")
    # The two objects this command replaces, as they are before anything is read: each is
    # replaced only while it is still that object (create_only.replace_if), so a run that
    # replaced the dataset meanwhile, or another `index`, is never overwritten.
    as_found = {name: _read_object(fs, f"{path}/{name}") for name in (manifest.MANIFEST, "zarr.json", ".zattrs")}
    try:
        problems = verify_dataset(url, storage_options=storage_options)
    except CannotOpen as e:
        raise IndexRefused(f"{url}: cannot be opened as a flat-tokens dataset ({e})") from None
    if problems:
        raise IndexRefused(f"{url} fails verification ({problems[0]}); a dataset that is not whole is not indexed")
    attrs = read_root_attributes(url, storage_options)
    owner = _committing_run(fs, path, url, attrs)
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

    directory = posixpath.join(path, INDEX_DIRECTORY)
    shards = max(1, -(-digests.shape[0] // TEXTS_PER_SHARD))
    counts, files = {}, {}
    by_shard = hashing.content_shards(digests, int(attrs.get("seed", 0)), shards)
    for shard in np.unique(by_shard).tolist():
        chosen = by_shard == shard
        data = encode_index(digests[chosen], splits[chosen])
        if near is not None:  # in the exact file's order (digest_order), as a build writes it
            rows = np.flatnonzero(chosen)[digest_order(digests[chosen])]
            near_data = encode_near(keys[rows], sketches[rows])
            files[posixpath.join(directory, near_file_name(shard, shards))] = near_data
            counts[dedup_index.NEAR_BYTES] = counts.get(dedup_index.NEAR_BYTES, 0) + len(near_data)
            counts[dedup_index.NEAR_FILES] = counts.get(dedup_index.NEAR_FILES, 0) + 1
        files[posixpath.join(directory, index_file_name(shard, shards))] = data
        for key, n in ((dedup_index.INDEX_DOCUMENTS, int(chosen.sum())), (dedup_index.INDEX_BYTES, len(data)),
                       (dedup_index.INDEX_FILES, 1)):
            counts[key] = counts.get(key, 0) + n
    described = {**dedup_index.index_stats(counts), "added_by": "flat-tokens index"}
    if near is not None:
        dedup_index.near_index_stats(described, {"shingle": near.shingle, "shingle_size": near.shingle_size,
                                                 "hashes": near.hashes})
    new_attrs = {k: v for k, v in attrs.items() if k != manifest.ATTRIBUTE}
    new_attrs["stats"] = {**stats, "dedup_index": described}
    manifest_bytes = None
    if listed is not None:
        listed.objects.update({index_key(name): manifest.Entry.of(data) for name, data in files.items()})
        manifest_bytes = listed.to_bytes()
        new_attrs[manifest.ATTRIBUTE] = manifest.seal(manifest_bytes, new_attrs)
    # As the run that committed the dataset, fenced like its writes (transforms/write/ownership.py):
    # a run that takes the output over waits for this write, or this write takes back what it did.
    with ownership.fenced(url, owner, "its dedup index (flat-tokens index)", storage_options) as lease:
        for name, (was, _) in as_found.items():  # before writing anything: most such races end here
            if identity(fs, f"{path}/{name}") != was:
                raise _changed(url, name)
        try:
            fs.makedirs(directory, exist_ok=True)
            for name, data in files.items():
                create_only.put_new(fs, name, data, lease.ledger)
            attributes = (_attributes_file(as_found), _attributes_bytes(as_found, new_attrs))
            if manifest_bytes is None:
                _replace(fs, url, path, as_found, *attributes, lease)
            else:
                replaced = _replace(fs, url, path, as_found, manifest.MANIFEST, manifest_bytes, lease)
                try:
                    _replace(fs, url, path, as_found, *attributes, lease)
                except BaseException:  # the previous manifest back, while the one there is still this write's
                    create_only.replace_if(fs, f"{path}/{manifest.MANIFEST}", as_found[manifest.MANIFEST][1],
                                           replaced)
                    raise
        except IndexRefused:  # the index files it created go too: the dataset is left as it was found
            for name, created in list(lease.ledger.created.items()):
                create_only.take_back(fs, name, created)
            lease.ledger.created.clear()
            raise
    return described


def _read_object(fs, where: str) -> tuple[tuple | None, bytes | None]:
    """(identity, bytes) of the object at `where`, or (None, None) when there is none. An object
    replaced between the two is caught later: its identity is no longer the one found."""
    ident = identity(fs, where)
    if ident is None:
        return None, None
    try:
        return ident, storage_faults.cat_file(fs, where, where)
    except FileNotFoundError:
        return None, None


def _committing_run(fs, path: str, url: str, attrs: dict) -> str:
    """The run id this command writes as: the one that committed the dataset and holds the
    output's newest claim (none for a dataset of a version before claims)."""
    generation, holder = ownership.current_owner(fs, path)
    if generation == 0:
        return ""
    committed_by = attrs.get("run_id", "")
    if holder != committed_by:
        raise IndexRefused(f"{url}: run {holder} holds the output's newest claim, not run {committed_by}, which "
                           f"committed the dataset: another run is replacing it; nothing was written")
    return holder


def _changed(url: str, name: str) -> IndexRefused:
    return IndexRefused(f"{url}/{name}: changed while this command read the dataset (another run or `flat-tokens "
                        f"index` wrote it); nothing was replaced: run the same command again")


def _attributes_file(found: dict) -> str:
    return "zarr.json" if found["zarr.json"][0] is not None else ".zattrs"


def _attributes_bytes(found: dict, attrs: dict) -> bytes:
    """The root attributes' object with `attrs`: `.zattrs` (zarr 2), or zarr 3's `zarr.json`
    as found with its attributes replaced."""
    if found["zarr.json"][0] is None:
        return json.dumps(attrs, indent=2).encode()
    document = json.loads(found["zarr.json"][1])
    document["attributes"] = attrs
    return json.dumps(document, indent=2).encode()


def _replace(fs, url: str, path: str, found: dict, name: str, data: bytes, lease) -> tuple:
    """Replaces the dataset's object `name` with `data` while it is the object `found` at the
    start; its new identity, in the write's ledger (taken back should this run lose the output)."""
    was = found[name][0]
    replaced = create_only.replace_if(fs, f"{path}/{name}", data, was) if was is not None else None
    if replaced is None:
        raise _changed(url, name)
    lease.ledger.created_object(f"{path}/{name}", replaced)
    return replaced


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
    except (IndexRefused, read_guard.DatasetError, create_only.ObjectConflict, ownership.OutputError) as e:
        print(f"flat-tokens index: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.dataset}: dedup index added: {described['documents']:,} texts in {described['files']} files, "
          f"{described['bytes']:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
