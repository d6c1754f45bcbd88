#!/usr/bin/env python3
"""Single-bit flips in a written dataset's chunks: does `verify` find each, and does the
reader raise instead of serving wrong data? (issue 27: every flip must be found.)

    python benchmarks/bit_flips.py --places 300
    python benchmarks/bit_flips.py --places 300 --zarr_format 3 --chunks_per_shard 4
    python benchmarks/bit_flips.py --places 300 --strip_checksums   # the format before issue 27

It writes a dataset with the pipeline (the bundled sample, the `bytes` tokenizer, small
chunks and --record_sources, so that every array has many chunks: encoded_tokens,
seq_starts, seq_sources of both splits), then, --places times: picks one bit uniformly among
all the bits of all chunk objects (seeded), flips it, runs `verify` (in process) and reads
the whole dataset with the reader (every sequence, every source id), compares what was
served with what was written, and puts the bit back. Each flip ends as:

  error            verify reported a problem / the reader raised a DatasetError
  silent-same      nothing was reported and the values served are the written ones
                   (the flip changed bytes that decode to the same values)
  silent-DIFFERENT nothing was reported and the reader served other values

A flip is *found* when it ends as `error`. `--strip_checksums` rewrites the dataset as this
tool wrote it before chunks carried checksums (plain zstd frames, no `storage.checksums`),
to compare; zarr 2 and `--codec zstd` only. With `--zstd_headers`, it also flips every bit
of the frame header, the first block header and the checksum frame of one chunk (an
exhaustive look at the places zstd's own content checksum would not cover).

With `--placements N` (issue 37) it also tries faults a chunk's own checksum cannot see, each
on a fresh copy of the dataset: N swaps of two chunk objects of one array, N chunk objects
replaced by the same key's object of a second build (`--seed 1`), each split replaced by the
other build's, and a list of metadata edits (shapes, chunk sizes, `max_token_id`, the root's
stats and `storage.checksums`, the manifest and its seal). Every one must end as `error` for
both verify and the reader.
Prints a table; `--json PATH` writes the counts and every flip.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numcodecs  # noqa: E402
import numpy as np  # noqa: E402

from flat_tokens.tools import verify  # noqa: E402
from flat_tokens.read_guard import DatasetError  # noqa: E402
from flat_tokens.reader import SPLITS, FlatTokensSplit  # noqa: E402

ARRAYS = ("encoded_tokens", "seq_starts", "seq_sources")


def write_dataset(out: Path, args, seed: int = 0) -> None:
    cmd = [sys.executable, "-m", "pipeline.run", "--input", str(REPO / "pipeline" / "sample" / "*.jsonl"),
           "--tokenizer", "bytes", "--output", str(out), "--overwrite", "--quiet", "--record_sources",
           "--validation_fraction", "0.05", "--tokens_chunk_size", str(args.tokens_chunk_size),
           "--seq_starts_chunk_size", str(args.seq_starts_chunk_size), "--zarr_format", str(args.zarr_format),
           "--codec", args.codec, "--rejected_output", str(out) + ".rejected", "--seed", str(seed)]
    if args.chunks_per_shard:
        cmd += ["--chunks_per_shard", str(args.chunks_per_shard)]
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def chunk_objects(root: Path) -> list[Path]:
    """Every chunk (or shard) object of every array, in a stable order."""
    found = []
    for split in SPLITS:
        for name in ARRAYS:
            base = root / split / name
            for dirpath, _, files in os.walk(base):
                found += [Path(dirpath) / f for f in files if not f.startswith(".") and f != "zarr.json"]
    return sorted(found)


def strip_checksums(root: Path) -> None:
    """The dataset as written before issue 27: plain zstd frames, no checksum frame, and no
    `storage.checksums` in the provenance."""
    plain, reader = numcodecs.Zstd(level=1), numcodecs.Zstd()
    for path in chunk_objects(root):
        path.write_bytes(plain.encode(np.frombuffer(reader.decode(path.read_bytes()), np.uint8)))
    attrs = json.loads((root / ".zattrs").read_text())
    attrs["storage"].pop("checksums", None)
    attrs.pop("manifest", None)  # nor a manifest (issue 37)
    (root / ".zattrs").write_text(json.dumps(attrs))
    (root / "flat-tokens-manifest.json").unlink(missing_ok=True)


def read_all(root: Path) -> dict:
    """Everything the reader serves: each split's sequences (encoded), and their sources."""
    served = {}
    for split in SPLITS:
        s = FlatTokensSplit(str(root), split)
        served[split] = (list(s.iter_encoded()), s.sources(slice(0, len(s))) if s.source_names else None)
    return served


def same(a: dict, b: dict) -> bool:
    for split in SPLITS:
        (seqs_a, src_a), (seqs_b, src_b) = a[split], b[split]
        if len(seqs_a) != len(seqs_b) or not all(np.array_equal(x, y) for x, y in zip(seqs_a, seqs_b)):
            return False
        if (src_a is None) != (src_b is None) or (src_a is not None and not np.array_equal(src_a, src_b)):
            return False
    return True


def try_flip(root: Path, path: Path, byte: int, bit: int, expected: dict) -> dict:
    data = bytearray(path.read_bytes())
    data[byte] ^= 1 << bit
    path.write_bytes(bytes(data))
    try:
        return {"object": str(path.relative_to(root)), "byte": byte, "bit": bit, "size": len(data),
                **outcome(root, expected)}
    finally:
        data[byte] ^= 1 << bit
        path.write_bytes(bytes(data))


def outcome(root: Path, expected: dict) -> dict:
    """verify's and the reader's answers on the dataset at `root` as it is now."""
    try:
        problems = verify.verify_dataset(str(root))
    except verify.CannotOpen as e:
        problems = [f"cannot open: {e}"]
    try:
        served = read_all(root)
        reader = "silent-same" if same(served, expected) else "silent-DIFFERENT"
        reader_message = None
    except DatasetError as e:
        reader, reader_message = "error", str(e)
    return {"verify": "error" if problems else ("silent-same" if reader != "silent-DIFFERENT" else "silent-DIFFERENT"),
            "reader": reader, "verify_message": problems[0] if problems else None, "reader_message": reader_message}


def _json_edit(path: Path, edit) -> None:
    document = json.loads(path.read_text())
    edit(document.get("attributes", document) if path.name == "zarr.json" and "attributes" in document
         and "shape" not in document else document)
    path.write_text(json.dumps(document))


def placements(root: Path, other: Path, count: int, rng: random.Random) -> list[tuple[str, str, object]]:
    """The faults a chunk's own checksum cannot see: (kind, what, edit(copy of the dataset))."""
    faults = []
    objects = chunk_objects(root)
    by_array = {}
    for path in objects:
        rel = path.relative_to(root)
        by_array.setdefault(rel.parts[:2], []).append(rel)
    arrays = [a for a, keys in by_array.items() if len(keys) >= 2]
    for _ in range(count * 10):
        if len([f for f in faults if f[0] == "swap"]) == count:
            break
        keys = by_array[rng.choice(arrays)]
        a, b = rng.sample(keys, 2)
        if (root / a).read_bytes() == (root / b).read_bytes():
            continue  # the same bytes (e.g. two chunks of zeros): swapping them changes nothing

        def swap(copy, a=a, b=b):
            x, y = (copy / a).read_bytes(), (copy / b).read_bytes()
            (copy / a).write_bytes(y)
            (copy / b).write_bytes(x)
        faults.append(("swap", f"{a} <-> {b}", swap))
    foreign = [p.relative_to(root) for p in objects
               if (other / p.relative_to(root)).exists()
               and (other / p.relative_to(root)).read_bytes() != p.read_bytes()]
    for rel in rng.sample(foreign, min(count, len(foreign))):
        faults.append(("foreign chunk", str(rel), lambda copy, rel=rel: shutil.copyfile(other / rel, copy / rel)))
    for split in SPLITS:
        def copy_split(copy, split=split):
            shutil.rmtree(copy / split)
            shutil.copytree(other / split, copy / split)
        faults.append(("split copy", split, copy_split))
    meta = "zarr.json" if (root / "zarr.json").exists() else ".zarray"
    group_attrs = "zarr.json" if meta == "zarr.json" else ".zattrs"

    def shape_plus(document):
        document["shape"] = [document["shape"][0] + 1]

    def chunks_double(document):
        if "chunks" in document:
            document["chunks"] = [document["chunks"][0] * 2]
        else:
            grid = document["chunk_grid"]["configuration"]
            grid["chunk_shape"] = [grid["chunk_shape"][0] * 2]
    edits = [(f"train/encoded_tokens/{meta}", "shape + 1", shape_plus),
             (f"train/seq_starts/{meta}", "shape + 1", shape_plus),
             (f"validation/encoded_tokens/{meta}", "chunks x 2", chunks_double),
             (f"train/{group_attrs}", "max_token_id + 1", lambda a: a.update(max_token_id=a["max_token_id"] + 1)),
             (group_attrs, "stats.train.tokens + 1",
              lambda a: a["stats"]["train"].update(tokens=a["stats"]["train"]["tokens"] + 1)),
             (group_attrs, "storage.checksums removed", lambda a: a["storage"].pop("checksums")),
             (group_attrs, "manifest seal removed", lambda a: a.pop("manifest"))]
    for key, what, edit in edits:
        faults.append(("metadata edit", f"{key}: {what}", lambda copy, key=key, edit=edit: _json_edit(copy / key, edit)))
    faults.append(("metadata edit", "flat-tokens-manifest.json deleted",
                   lambda copy: (copy / "flat-tokens-manifest.json").unlink()))
    faults.append(("metadata edit", "the manifest of the other build",
                   lambda copy: shutil.copyfile(other / "flat-tokens-manifest.json", copy / "flat-tokens-manifest.json")))
    return faults


def try_placement(root: Path, scratch: Path, kind: str, what: str, edit, expected: dict) -> dict:
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(root, scratch)
    edit(scratch)
    return {"kind": kind, "what": what, **outcome(scratch, expected)}


def zstd_header_places(path: Path) -> list[tuple[int, int]]:
    """Every bit of one zstd chunk's frame header, first block header and last 16 bytes (the end
    of its last block and the CRC-32C frame)."""
    data = path.read_bytes()
    fhd = data[4]
    single, fcs = (fhd >> 5) & 1, fhd >> 6
    header = 4 + 1 + (0 if single else 1) + ((1 if single else 0), 2, 4, 8)[fcs] + (0, 1, 2, 4)[fhd & 3]
    places = list(range(header + 3)) + list(range(len(data) - 16, len(data)))
    return [(byte, bit) for byte in places for bit in range(8)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--places", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zarr_format", type=int, default=2, choices=(2, 3))
    ap.add_argument("--codec", default="zstd")
    ap.add_argument("--chunks_per_shard", type=int, default=0)
    ap.add_argument("--tokens_chunk_size", type=int, default=16384)
    ap.add_argument("--seq_starts_chunk_size", type=int, default=128)
    ap.add_argument("--strip_checksums", action="store_true")
    ap.add_argument("--zstd_headers", action="store_true")
    ap.add_argument("--placements", type=int, default=0,
                    help="also N swaps and N foreign chunks, split copies and metadata edits (issue 37)")
    ap.add_argument("--workdir", help="where the dataset is written (default: a temporary directory)")
    ap.add_argument("--json", help="write the counts and every flip here")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bit-flips-"))
    root = work / "flips.zarr"
    try:
        write_dataset(root, args)
        if args.strip_checksums:
            strip_checksums(root)
        expected = read_all(root)
        assert not verify.verify_dataset(str(root)), "the dataset must verify before any flip"
        objects = chunk_objects(root)
        sizes = [p.stat().st_size for p in objects]
        rng = random.Random(args.seed)
        flips = []
        for _ in range(args.places):
            offset = rng.randrange(sum(sizes) * 8)
            for path, size in zip(objects, sizes):
                if offset < size * 8:
                    break
                offset -= size * 8
            flips.append(try_flip(root, path, offset // 8, offset % 8, expected))
        placed = []
        if args.placements:
            other = work / "other.zarr"
            write_dataset(other, args, seed=1)
            faults = placements(root, other, args.placements, rng)
            placed = [try_placement(root, work / "scratch.zarr", *fault, expected) for fault in faults]
        headers = []
        if args.zstd_headers:
            target = next(p for p in objects if "encoded_tokens" in str(p))
            headers = [try_flip(root, target, byte, bit, expected) for byte, bit in zstd_header_places(target)]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report = {"settings": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
              "objects": len(objects), "bytes": sum(sizes),
              "random": {who: dict(Counter(f[who] for f in flips)) for who in ("verify", "reader")},
              "random_by_array": {name: dict(Counter(f["reader"] for f in flips if f"/{name}/" in f"/{f['object']}"))
                                  for name in ARRAYS},
              "zstd_headers": {who: dict(Counter(f[who] for f in headers)) for who in ("verify", "reader")}
              if headers else None,
              "placements": {kind: {who: dict(Counter(f[who] for f in placed if f["kind"] == kind))
                                    for who in ("verify", "reader")} for kind in dict.fromkeys(f["kind"] for f in placed)},
              "flips": flips + headers, "placed": placed}
    print(f"{args.places} random single-bit flips in {len(objects)} chunk objects ({sum(sizes):,} bytes), "
          f"zarr {args.zarr_format}, --codec {args.codec}"
          + (f", --chunks_per_shard {args.chunks_per_shard}" if args.chunks_per_shard else "")
          + (", checksums stripped (the format before issue 27)" if args.strip_checksums else ""))
    for who in ("verify", "reader"):
        counts = report["random"][who]
        print(f"  {who:7} found {counts.get('error', 0)} of {len(flips)}; silent-same {counts.get('silent-same', 0)}, "
              f"silent-DIFFERENT {counts.get('silent-DIFFERENT', 0)}")
    for name, counts in report["random_by_array"].items():
        if counts:
            print(f"  {name:15} {dict(counts)}")
    if headers:
        for who in ("verify", "reader"):
            counts = report["zstd_headers"][who]
            print(f"  zstd header and checksum bits of one chunk ({len(headers)} flips): {who} found "
                  f"{counts.get('error', 0)}, silent-same {counts.get('silent-same', 0)}, "
                  f"silent-DIFFERENT {counts.get('silent-DIFFERENT', 0)}")
    for kind, by in report["placements"].items():
        n = sum(by["reader"].values())
        print(f"  {kind:15} ({n}): verify found {by['verify'].get('error', 0)}, reader found "
              f"{by['reader'].get('error', 0)}")
    for f in placed:
        if f["verify"] != "error" or f["reader"] != "error":
            print(f"    MISSED {f['kind']} {f['what']}: verify {f['verify']}, reader {f['reader']}")
    missed = [f for f in flips + headers + placed if f["verify"] != "error" or f["reader"] != "error"]
    print(f"  every flip found by both: {'yes' if not missed else f'NO ({len(missed)} missed)'}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
