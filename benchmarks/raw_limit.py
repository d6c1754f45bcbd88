#!/usr/bin/env python3
"""The raw limit: the least work that turns a JSONL corpus into token ids, and nothing more.

    python benchmarks/raw_limit.py CORPUS.jsonl TOKENIZER.json [--backend fastokens|hf] [--processes N]

A standalone script on purpose (no import from this project): it reads the file in
blocks of lines (`readlines(4 MiB)`), parses each line with orjson, tokenizes batches of
1024 documents without special tokens, and views the ids as numpy arrays (fastokens'
flat buffer through `np.frombuffer`, zero-copy). It writes nothing and keeps nothing but
counts. The pipeline does all of this and more (shuffle, compress, write, commit), so its
whole-process wall time and CPU time over this script's are its overhead.

`--backend hf` encodes with HF tokenizers' `encode_batch_fast` instead (the reference the
pipeline's guard checks fastokens against; ~20x slower). `--processes N` is the raw limit
on N cores: N processes of this script at once, each on 1/N of the file's bytes (the lines
that start in its byte range) with one tokenizer thread, started and waited for by this one;
the counts are summed. Prints one JSON line: tokens, documents, seconds to load the
tokenizer, seconds in the process.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import time

STARTED = time.perf_counter()

import numpy as np  # noqa: E402 (the clock starts before the imports)
import orjson  # noqa: E402

BLOCK_BYTES = 4 << 20
BATCH_DOCUMENTS = 1024


def fastokens_encoder(json_text: str):
    import fastokens
    tokenizer = fastokens.Tokenizer.from_json_str(json_text)

    def encode(texts):
        flat = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        ids = np.frombuffer(flat[0], dtype=np.uint32)
        offsets = np.frombuffer(flat[1], dtype=np.uint64)
        return ids.size, offsets.size - 1
    return encode


def hf_encoder(json_text: str):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_str(json_text)

    def encode(texts):
        id_lists = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint32)
        return ids.size, len(id_lists)
    return encode


def in_processes(args) -> None:
    """--processes N: N copies of this script on N byte ranges, all at once, one core each."""
    size = os.path.getsize(args.input)
    bounds = [size * i // args.processes for i in range(args.processes + 1)]
    one_thread = {**os.environ, "RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, args.input, args.tokenizer, "--backend", args.backend,
                               "--text_key", args.text_key, "--byte_range", str(a), str(b)],
                              stdout=subprocess.PIPE, env=one_thread) for a, b in zip(bounds, bounds[1:])]
    found = [json.loads(p.communicate()[0]) for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"raw_limit: a process of --processes {args.processes} failed")
    print(json.dumps({"backend": args.backend, "processes": args.processes,
                      "tokens": sum(r["tokens"] for r in found), "documents": sum(r["documents"] for r in found),
                      "load_seconds": max(r["load_seconds"] for r in found),
                      "seconds_in_process": round(time.perf_counter() - STARTED, 3)}))


def blocks(path: str, byte_range):
    """Blocks of lines of the file; with byte_range (a, b), of the lines that start in [a, b)."""
    with open(path, "rb") as f:
        end = None
        if byte_range:
            start, end = byte_range
            if start > 0:
                f.seek(start - 1)
                f.readline()  # the line that started before `start` belongs to the range before
        while True:
            if end is not None and f.tell() >= end:
                return
            lines = f.readlines(BLOCK_BYTES)
            if not lines:
                return
            if end is not None:
                at = f.tell() - sum(map(len, lines))
                kept = []
                for line in lines:
                    if at >= end:
                        break
                    kept.append(line)
                    at += len(line)
                lines = kept
            yield lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("tokenizer")
    ap.add_argument("--backend", choices=("fastokens", "hf"), default="fastokens")
    ap.add_argument("--text_key", default="text")
    ap.add_argument("--processes", type=int, default=1, help="the raw limit on this many cores (default 1)")
    ap.add_argument("--byte_range", type=int, nargs=2, help=argparse.SUPPRESS)  # one of --processes' parts
    args = ap.parse_args()
    if args.processes > 1:
        return in_processes(args)
    with open(args.tokenizer, encoding="utf-8") as f:
        encode = (fastokens_encoder if args.backend == "fastokens" else hf_encoder)(f.read())
    loaded = time.perf_counter()
    tokens = documents = 0
    texts = []
    for lines in blocks(args.input, args.byte_range):
        for line in lines:
            if line.strip():
                texts.append(orjson.loads(line)[args.text_key])
                if len(texts) == BATCH_DOCUMENTS:
                    n, d = encode(texts)
                    tokens, documents = tokens + n, documents + d
                    texts = []
    if texts:
        n, d = encode(texts)
        tokens, documents = tokens + n, documents + d
    print(json.dumps({"backend": args.backend, "tokens": tokens, "documents": documents,
                      "load_seconds": round(loaded - STARTED, 3),
                      "seconds_in_process": round(time.perf_counter() - STARTED, 3)}))


if __name__ == "__main__":
    main()
