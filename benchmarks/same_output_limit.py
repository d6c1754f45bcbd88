#!/usr/bin/env python3
"""The same-output limit: the raw limit, plus compressing the token ids as the pipeline's
default output stores them and writing them to files. Work any correct tool must do to
write what the pipeline writes, and nothing more.

    python benchmarks/same_output_limit.py CORPUS.jsonl TOKENIZER.json OUT_DIR

A standalone script on purpose (no import from this project). It does what
benchmarks/raw_limit.py does (orjson over `readlines(4 MiB)` blocks, fastokens'
`encode_batch_flat` on batches of 1024 documents without special tokens), then stores the
ids as the pipeline's `encoded_tokens` array does by default: uint32 `2*id + 1` on each
document's first token and `2*id` elsewhere, in chunks of 262,144 tokens, each compressed
with zstd level 1 (numcodecs' Zstd, the codec zarr v2 uses) and written to a file of its
own in OUT_DIR. Chunks compress on a thread per core while the next batch is read and
tokenized, as the pipeline's writer overlaps them (zstd releases the GIL). What it leaves
out, and the pipeline does: the shuffle (documents stay in input order), the validation
split, `seq_starts` (8 bytes a document, ~1% of the output), checks and the commit.

Prints one JSON line: tokens, documents, chunks, bytes written, seconds in the process.
"""
import argparse
import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

STARTED = time.perf_counter()

import numpy as np  # noqa: E402 (the clock starts before the imports)
import orjson  # noqa: E402
from numcodecs import Zstd  # noqa: E402

BLOCK_BYTES = 4 << 20
BATCH_DOCUMENTS = 1024
CHUNK_TOKENS = 1 << 18  # the pipeline's default --tokens_chunk_size
ZSTD_LEVEL = 1  # the pipeline's default codec


def fastokens_encoder(json_text: str):
    import fastokens
    tokenizer = fastokens.Tokenizer.from_json_str(json_text)

    def encode(texts):
        """(ids as uint32, where each document starts in them)"""
        flat, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(flat, dtype=np.uint32), np.frombuffer(offsets, dtype=np.uint64)[:-1].astype(np.int64)
    return encode


def hf_encoder(json_text: str):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_str(json_text)

    def encode(texts):
        id_lists = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint32, count=int(lengths.sum()))
        return ids, np.cumsum(lengths) - lengths
    return encode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("tokenizer")
    ap.add_argument("out_dir", help="a directory to create; one file per chunk")
    ap.add_argument("--text_key", default="text")
    ap.add_argument("--backend", choices=("fastokens", "hf"), default="fastokens",
                    help="the tokenizer: fastokens, or HF tokenizers' encode_batch_fast (as raw_limit.py)")
    args = ap.parse_args()
    with open(args.tokenizer, encoding="utf-8") as f:
        tokenize = (fastokens_encoder if args.backend == "fastokens" else hf_encoder)(f.read())
    os.makedirs(args.out_dir)
    codec = Zstd(level=ZSTD_LEVEL)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pool = ThreadPoolExecutor(threads)
    pending = []
    written = 0
    chunk = np.empty(CHUNK_TOKENS, dtype=np.uint32)
    filled = chunks = tokens = documents = 0

    def store(index: int, values: np.ndarray) -> int:
        data = codec.encode(values)
        with open(os.path.join(args.out_dir, str(index)), "wb") as out:
            out.write(data)
        return len(data)

    def flush(values: np.ndarray) -> None:
        nonlocal chunks, written, pending
        pending.append(pool.submit(store, chunks, values))
        chunks += 1
        if len(pending) > 2 * threads:  # bounded memory: wait for the oldest
            written += pending.pop(0).result()

    def encode(texts) -> None:
        nonlocal filled, tokens, documents, chunk
        ids, starts = tokenize(texts)
        encoded = ids << np.uint32(1)
        encoded[starts[starts < ids.size]] |= np.uint32(1)  # empty documents start nothing
        tokens, documents = tokens + ids.size, documents + starts.size
        at = 0
        while at < encoded.size:
            take = min(CHUNK_TOKENS - filled, encoded.size - at)
            chunk[filled:filled + take] = encoded[at:at + take]
            filled, at = filled + take, at + take
            if filled == CHUNK_TOKENS:
                flush(chunk)
                chunk, filled = np.empty(CHUNK_TOKENS, dtype=np.uint32), 0

    texts = []
    with open(args.input, "rb") as f:
        while True:
            lines = f.readlines(BLOCK_BYTES)
            if not lines:
                break
            for line in lines:
                if line.strip():
                    texts.append(orjson.loads(line)[args.text_key])
                    if len(texts) == BATCH_DOCUMENTS:
                        encode(texts)
                        texts = []
    if texts:
        encode(texts)
    if filled:
        flush(chunk[:filled].copy())
    written += sum(p.result() for p in pending)
    pool.shutdown()
    print(json.dumps({"tokens": tokens, "documents": documents, "chunks": chunks, "bytes_written": written,
                      "seconds_in_process": round(time.perf_counter() - STARTED, 3)}))


if __name__ == "__main__":
    main()
