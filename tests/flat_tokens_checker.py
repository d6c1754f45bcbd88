#!/usr/bin/env python3
"""The tests' own checker of the flat-tokens format, written from the format's text alone.

    python tests/flat_tokens_checker.py OUT.zarr
    python tests/flat_tokens_checker.py OUT.zarr --input 'corpus/*.jsonl' --tokenizer tok.json
    python tests/flat_tokens_checker.py OUT.zarr --compare OTHER.zarr

It shares no code with the pipeline or with `flat-tokens verify` (a bug copied into both
would pass both), and it needs nothing outside this repository, so the tests run in a clone
with nothing beside it. What it checks, per split (docs/flat-tokens-format.md):

1. `encoded_tokens` is 1-D uint32, `seq_starts` 1-D uint64, `max_token_id` an integer;
2. `seq_starts` starts at 0, ends at the token count and strictly increases;
3. the start bit is set exactly at the positions `seq_starts[:-1]` lists;
4. every decoded id is at most `max_token_id` and at most 2**31 - 1;
5. every stored object the array's shape implies exists: a missing chunk (or, with zarr 3
   sharding, a missing shard) would read back as zeros, which pass 1-4 inside a long
   document. Counted from the directory listing, not from zarr's own chunk counts;
6. with --input and --tokenizer: the sequences are the non-empty input documents, each
   exactly once, tokenized with no special tokens added.

Prints one line per problem, then a summary line starting with OK or FAIL; exits 0 or 1.
"""
import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import sys
from collections import Counter

import numpy as np
import zarr

LARGEST_ID = 2**31 - 1
SPLITS = ("train", "validation")


def digest(ids) -> bytes:
    """A sequence's identity: a hash of its ids as little-endian uint32."""
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).digest()


def stored_objects(array_dir: str) -> tuple[int, int]:
    """(objects present, objects the shape implies) of a local zarr array directory.

    zarr 2 keeps chunk i in a file named "i"; zarr 3 (default encoding) in "c/i". With
    sharding the stored object is the shard, so that is the unit counted."""
    meta_v3 = os.path.join(array_dir, "zarr.json")
    if os.path.exists(meta_v3):
        with open(meta_v3) as f:
            meta = json.load(f)
        (length,) = meta["shape"]
        (unit,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
        encoding = meta.get("chunk_key_encoding", {})
        separator = encoding.get("configuration", {}).get("separator", "/")
        if encoding.get("name", "default") != "default":
            raise SystemExit(f"{array_dir}: chunk key encoding {encoding} is not the default one")
        names = (f"c{separator}{i}" for i in range(math.ceil(length / unit)))
    else:
        with open(os.path.join(array_dir, ".zarray")) as f:
            meta = json.load(f)
        (length,) = meta["shape"]
        (unit,) = meta["chunks"]
        names = (str(i) for i in range(math.ceil(length / unit)))
    expected = [os.path.join(array_dir, *n.split("/")) for n in names]
    return sum(os.path.isfile(p) for p in expected), len(expected)


def check_split(group, name: str, block: int, problems: list, want_sequences: bool, path: str | None = None):
    """Checks one split; returns (stats, the digests of its sequences in order, or None)."""
    def problem(text):
        problems.append(f"{name}: {text}")

    for member in ("encoded_tokens", "seq_starts"):
        if member not in group:
            problem(f"no array {member}")
            return None, None
    tokens, starts_array = group["encoded_tokens"], group["seq_starts"]
    if tokens.dtype != np.dtype("uint32") or tokens.ndim != 1:
        problem(f"encoded_tokens is {tokens.dtype} {tokens.shape}, not 1-D uint32")
    if starts_array.dtype != np.dtype("uint64") or starts_array.ndim != 1:
        problem(f"seq_starts is {starts_array.dtype} {starts_array.shape}, not 1-D uint64")
    if path is not None:
        for member in ("encoded_tokens", "seq_starts"):
            present, expected = stored_objects(os.path.join(path, name, member))
            if present != expected:
                problem(f"{member}: {expected - present} of {expected} stored chunks are missing")
    max_id = group.attrs.get("max_token_id")
    if not isinstance(max_id, int) or isinstance(max_id, bool):
        problem(f"max_token_id is {max_id!r}, not an integer")
        max_id = None

    starts = np.asarray(starts_array[:]).astype(np.int64)
    count = tokens.shape[0]
    if starts.size == 0 or starts[0] != 0 or starts[-1] != count:
        problem(f"seq_starts must run from 0 to the token count {count}; it is {starts[:3]}...{starts[-3:]}")
        return None, None
    steps = np.diff(starts)
    if steps.size and steps.min() < 1:
        problem(f"seq_starts does not strictly increase at sequence {int(np.argmin(steps))}")
        return None, None

    largest = -1
    digests = [] if want_sequences else None
    current = []  # the ids of the sequence that runs into the next block
    for lo in range(0, count, block):
        hi = min(count, lo + block)
        values = np.asarray(tokens[lo:hi])
        marked = starts[(starts >= lo) & (starts < hi)] - lo
        expected_bits = np.zeros(hi - lo, dtype=bool)
        expected_bits[marked] = True
        wrong = np.flatnonzero((values & 1).astype(bool) != expected_bits)
        if wrong.size:
            problem(f"{wrong.size} start bits wrong in [{lo}, {hi}), the first at {lo + int(wrong[0])}")
            return None, None
        ids = values >> 1
        if ids.size:
            largest = max(largest, int(ids.max()))
        if want_sequences:
            pieces = np.split(ids, marked)
            current.append(pieces[0])
            for piece in pieces[1:]:
                whole = np.concatenate(current)
                if whole.size:
                    digests.append(digest(whole))
                current = [piece]
    if want_sequences:
        whole = np.concatenate(current) if current else np.empty(0, np.uint32)
        if whole.size:
            digests.append(digest(whole))
        if len(digests) != starts.size - 1:
            problem(f"found {len(digests)} sequences, seq_starts lists {starts.size - 1}")
    if largest > LARGEST_ID:
        problem(f"token id {largest} is above 2**31 - 1")
    if max_id is not None and largest > max_id:
        problem(f"token id {largest} is above max_token_id {max_id}")
    return {"sequences": int(starts.size - 1), "tokens": int(count), "largest_id": largest}, digests


def input_texts(pattern: str, text_key: str):
    """The text of every line that is a JSON object with a string under text_key."""
    paths = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
    if not paths:
        raise SystemExit(f"no input matches {pattern}")
    for path in paths:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            for line in f:
                line = line.strip().removeprefix(b"\xef\xbb\xbf")
                try:
                    record = json.loads(line.decode("utf-8")) if line else None
                except ValueError:  # UnicodeDecodeError is one
                    continue
                text = record.get(text_key) if isinstance(record, dict) else None
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:  # a lone surrogate: no tokenizer takes it
                        continue
                    yield text


def tokenizer_for(spec: str):
    if spec == "bytes":
        return lambda texts: [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.uint32) + 1 for t in texts]
    from tokenizers import Tokenizer
    model = Tokenizer.from_file(spec)
    return lambda texts: [e.ids for e in model.encode_batch(texts, add_special_tokens=False)]


def expected_sequences(pattern: str, text_key: str, tokenize):
    """(Counter of digests, digests in input order, documents read, documents that tokenize to nothing)."""
    texts = list(input_texts(pattern, text_key))
    digests = [digest(ids) for ids in tokenize(texts) if len(ids)]
    return Counter(digests), digests, len(texts), len(texts) - len(digests)


def shuffle_report(input_order: list, output_order: list) -> str:
    """Rank correlation of output order against input order, over sequences that occur once."""
    once = Counter(input_order)
    rank = {d: i for i, d in enumerate(d for d in input_order if once[d] == 1)}
    ranks = np.array([rank[d] for d in output_order if d in rank], dtype=float)
    if ranks.size < 3:
        return "shuffle: too few distinct sequences"
    correlation = float(np.corrcoef(np.arange(ranks.size), ranks)[0, 1])
    neighbours = int(np.count_nonzero(np.diff(ranks) == 1))
    return (f"shuffle over {ranks.size} distinct: rank corr {correlation:+.4f} "
            f"(1/sqrt(n)={1 / math.sqrt(ranks.size):.4f}), {neighbours} input neighbours kept")


def compare(a_path: str, b_path: str, block: int, problems: list) -> None:
    a, b = zarr.open_group(a_path, mode="r"), zarr.open_group(b_path, mode="r")
    for split in SPLITS:
        if a[split].attrs.get("max_token_id") != b[split].attrs.get("max_token_id"):
            problems.append(f"compare {split}: max_token_id differs")
        for member in ("encoded_tokens", "seq_starts"):
            x, y = a[split][member], b[split][member]
            if x.shape != y.shape:
                problems.append(f"compare {split}/{member}: shapes {x.shape} and {y.shape}")
                continue
            for lo in range(0, x.shape[0], block):
                if not np.array_equal(x[lo:lo + block], y[lo:lo + block]):
                    problems.append(f"compare {split}/{member}: differs in [{lo}, {lo + block})")
                    break


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--input", help="the JSONL input (glob), to check invariant 6")
    parser.add_argument("--text-key", default="text")
    parser.add_argument("--tokenizer", help="a tokenizer.json, or 'bytes'")
    parser.add_argument("--compare", help="another dataset whose arrays must be identical")
    parser.add_argument("--shuffle-report", action="store_true")
    parser.add_argument("--block", type=int, default=1 << 22)
    args = parser.parse_args(argv)
    if args.input and not args.tokenizer:
        parser.error("--input needs --tokenizer")

    problems, summary, found, train_order = [], [], Counter(), []
    root = zarr.open_group(args.dataset, mode="r")
    for split in SPLITS:
        if split not in root:
            problems.append(f"no split {split}")
            continue
        stats, digests = check_split(root[split], split, args.block, problems, bool(args.input), args.dataset)
        if stats:
            summary.append(f"{split}: {stats['sequences']} seqs {stats['tokens']} tokens max_id {stats['largest_id']}")
        if digests:
            found.update(digests)
            train_order = digests if split == "train" else train_order
    if args.input and not problems:
        wanted, input_order, documents, empty = expected_sequences(args.input, args.text_key,
                                                                   tokenizer_for(args.tokenizer))
        missing, unexpected = sum((wanted - found).values()), sum((found - wanted).values())
        if missing or unexpected:
            problems.append(f"sequences differ from the input: {missing} missing, {unexpected} unexpected "
                            f"(of {sum(wanted.values())} expected from {documents} documents, {empty} empty)")
        summary.append(f"input: {documents} documents, {empty} tokenize to nothing")
        if args.shuffle_report:
            summary.append(shuffle_report(input_order, train_order))
    if args.compare:
        compare(args.dataset, args.compare, args.block, problems)
    for p in problems:
        print("PROBLEM", p)
    print(("FAIL" if problems else "OK") + ": " + "; ".join(summary + [f"{len(problems)} problems"]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
