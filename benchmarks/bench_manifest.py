#!/usr/bin/env python3
"""What the manifest (flat_tokens/format/manifest.py) costs at scale: its size per chunk, and the
time a reader takes to load and check it, for a dataset of --chunks data objects (default
250,000: ~1 TB of text at the default 1 MiB chunks), split as the pipeline splits them.

    python benchmarks/bench_manifest.py [--chunks 250000]

Prints one line per measure. The entries are random (a manifest's size and load time do
not depend on what the chunks hold); the lookup measure is one `expected(key)` per chunk,
what a reader does once per chunk it reads.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from flat_tokens.format import manifest


def build(chunks: int) -> tuple[manifest.Manifest, dict]:
    rng = np.random.default_rng(0)
    parts = {"train/encoded_tokens": int(chunks * 0.99), "validation/encoded_tokens": chunks - int(chunks * 0.99),
             "train/seq_starts": max(1, chunks // 60), "validation/seq_starts": 1}
    arrays = {path: manifest.ArrayObjects("", rng.integers(900_000, 1_200_000, n, dtype=np.uint64),
                                          rng.integers(0, 2 ** 32, n, dtype=np.uint32),
                                          rng.integers(0, 2 ** 32, n, dtype=np.uint32)) for path, n in parts.items()}
    objects = {f"{split}/{name}": manifest.Entry(300, 1, 2) for split in ("train", "validation")
               for name in (".zgroup", ".zattrs", "encoded_tokens/.zarray", "seq_starts/.zarray")}
    return manifest.Manifest("0" * 32, objects, arrays), parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=250_000)
    args = ap.parse_args()
    listed, parts = build(args.chunks)
    total = sum(parts.values())
    started = time.perf_counter()
    data = listed.to_bytes()
    write_s = time.perf_counter() - started
    attrs = {"run_id": listed.run_id, "stats": {}}
    seal = manifest.seal(data, attrs)
    started = time.perf_counter()
    loaded = manifest.open_sealed(data, {**attrs, manifest.ATTRIBUTE: seal})
    load_s = time.perf_counter() - started
    keys = [f"{path}/{i}" for path, n in parts.items() for i in range(n)]
    started = time.perf_counter()
    for key in keys:
        loaded.expected(key)
    lookup_s = time.perf_counter() - started
    plain = dict.fromkeys(keys)
    started = time.perf_counter()
    for key in keys:
        plain.get(key)
    dict_s = time.perf_counter() - started
    print(f"data objects: {total:,}")
    print(f"manifest: {len(data):,} bytes, {len(data) / total:.1f} bytes per data object")
    print(f"write (to_bytes): {write_s * 1e3:.1f} ms")
    print(f"load and check its seal (SHA-256, JSON, base64): {load_s * 1e3:.1f} ms")
    print(f"lookup of each object's entry: {lookup_s / total * 1e6:.2f} us per object "
          f"(a plain dict lookup of its key here: {dict_s / total * 1e6:.2f} us)")


if __name__ == "__main__":
    main()
