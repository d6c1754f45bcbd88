"""What each zstd setting costs on real chunks of a written dataset: bytes per token and
encode speed on one core. Standalone (numpy, numcodecs and zstandard; no project imports).

    python benchmarks/bench_codecs.py DATASET [--chunks 30] [--rounds 3] [--sweep]

DATASET is a flat-tokens dataset written with the default codec (zarr v2, zstd), e.g. one
kept by `bench_pipeline.py --keep`. Every Nth chunk of `train/encoded_tokens` is decoded,
then encoded again with each setting; each setting's time is the best of --rounds passes
(`time.process_time`: CPU of this process, one thread). Every encoded chunk is decoded back
with numcodecs (what zarr readers use) and compared, so no setting is counted that a reader
could not read. docs/performance.md ("The codec") has the results and the arithmetic.
"""

import argparse
import os
import sys
import time

import numcodecs
import zstandard


def sample_chunks(dataset: str, count: int) -> list[bytes]:
    folder = os.path.join(dataset, "train", "encoded_tokens")
    names = sorted((n for n in os.listdir(folder) if n[0].isdigit()), key=int)
    step = max(1, len(names) // count)
    decoder = numcodecs.Zstd()
    chunks = []
    for name in names[::step][:count]:
        with open(os.path.join(folder, name), "rb") as f:
            chunks.append(bytes(decoder.decode(f.read())))
    return chunks


def measure(encode, chunks: list[bytes], rounds: int) -> tuple[float, float]:
    """(bytes of output per 4-byte token, best CPU seconds of one pass over the chunks)."""
    best, encoded = float("inf"), []
    for _ in range(rounds):
        start = time.process_time()
        encoded = [encode(c) for c in chunks]
        best = min(best, time.process_time() - start)
    decoder = numcodecs.Zstd()
    for raw, out in zip(chunks, encoded):
        if bytes(decoder.decode(out)) != raw:
            raise SystemExit("a setting wrote a chunk numcodecs does not decode to the same bytes")
    tokens = sum(len(c) for c in chunks) // 4
    return sum(len(e) for e in encoded) / tokens, best


def settings(sweep: bool):
    for level in (1, 2, 3):
        yield f"zstd level {level} (numcodecs)", numcodecs.Zstd(level=level).encode
    for level in (-1, -2):
        yield f"zstd level {level} (zstandard)", zstandard.ZstdCompressor(level=level).compress
    if sweep:
        for window in (17, 18, 19, 20):
            for hashes in (14, 15, 16, 17):
                for match in (4, 5, 6):
                    params = zstandard.ZstdCompressionParameters(
                        strategy=zstandard.STRATEGY_FAST, window_log=window, hash_log=hashes,
                        min_match=match, search_log=1, target_length=0, chain_log=16)
                    yield (f"zstd fast, window 2^{window}, hash 2^{hashes}, min match {match}",
                           zstandard.ZstdCompressor(compression_params=params).compress)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--chunks", type=int, default=30, help="chunks sampled, spread over the array")
    parser.add_argument("--rounds", type=int, default=3, help="passes per setting; the best is kept")
    parser.add_argument("--sweep", action="store_true", help="also 48 settings of zstd's fast strategy")
    args = parser.parse_args(argv)
    chunks = sample_chunks(args.dataset, args.chunks)
    raw = sum(len(c) for c in chunks)
    print(f"{len(chunks)} chunks of {args.dataset}/train/encoded_tokens: {raw // 4:,} tokens, "
          f"{raw / 1e6:.1f} MB as uint32; one core, best of {args.rounds}")
    print(f"  {'setting':55s} {'bytes/token':>11s} {'encode MB/s':>11s}")
    for name, encode in settings(args.sweep):
        per_token, seconds = measure(encode, chunks, args.rounds)
        print(f"  {name:55s} {per_token:11.4f} {raw / seconds / 1e6:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
