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

from pipeline import verify  # noqa: E402
from pipeline.read_guard import DatasetError  # noqa: E402
from pipeline.reader import SPLITS, FlatTokensSplit  # noqa: E402

ARRAYS = ("encoded_tokens", "seq_starts", "seq_sources")


def write_dataset(out: Path, args) -> None:
    cmd = [sys.executable, "-m", "pipeline.run", "--input", str(REPO / "pipeline" / "sample" / "*.jsonl"),
           "--tokenizer", "bytes", "--output", str(out), "--overwrite", "--quiet", "--record_sources",
           "--validation_fraction", "0.05", "--tokens_chunk_size", str(args.tokens_chunk_size),
           "--seq_starts_chunk_size", str(args.seq_starts_chunk_size), "--zarr_format", str(args.zarr_format),
           "--codec", args.codec, "--rejected_output", str(out) + ".rejected"]
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
    (root / ".zattrs").write_text(json.dumps(attrs))


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
        problems = verify.verify_dataset(str(root))
        try:
            served = read_all(root)
            reader = "silent-same" if same(served, expected) else "silent-DIFFERENT"
            reader_message = None
        except DatasetError as e:
            reader, reader_message = "error", str(e)
        return {"object": str(path.relative_to(root)), "byte": byte, "bit": bit, "size": len(data),
                "verify": "error" if problems else ("silent-same" if reader != "silent-DIFFERENT"
                                                    else "silent-DIFFERENT"),
                "reader": reader, "verify_message": problems[0] if problems else None,
                "reader_message": reader_message}
    finally:
        data[byte] ^= 1 << bit
        path.write_bytes(bytes(data))


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
              "flips": flips + headers}
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
    missed = [f for f in flips + headers if f["verify"] != "error" or f["reader"] != "error"]
    print(f"  every flip found by both: {'yes' if not missed else f'NO ({len(missed)} missed)'}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
