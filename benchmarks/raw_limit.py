#!/usr/bin/env python3
"""The raw limit: the least work that turns a JSONL corpus into token ids, and nothing more.

    python benchmarks/raw_limit.py CORPUS.jsonl TOKENIZER.json [--backend fastokens|hf]

A standalone script on purpose (no import from this project): it reads the file in
blocks of lines (`readlines(4 MiB)`), parses each line with orjson, tokenizes batches of
1024 documents without special tokens, and views the ids as numpy arrays (fastokens'
flat buffer through `np.frombuffer`, zero-copy). It writes nothing and keeps nothing but
counts. The pipeline does all of this and more (shuffle, compress, write, commit), so its
whole-process wall time and CPU time over this script's are its overhead.

`--backend hf` encodes with HF tokenizers' `encode_batch_fast` instead (the reference the
pipeline's guard checks fastokens against; ~20x slower). Prints one JSON line: tokens,
documents, seconds to load the tokenizer, seconds in the process.
"""
import argparse
import itertools
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("tokenizer")
    ap.add_argument("--backend", choices=("fastokens", "hf"), default="fastokens")
    ap.add_argument("--text_key", default="text")
    args = ap.parse_args()
    with open(args.tokenizer, encoding="utf-8") as f:
        encode = (fastokens_encoder if args.backend == "fastokens" else hf_encoder)(f.read())
    loaded = time.perf_counter()
    tokens = documents = 0
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
