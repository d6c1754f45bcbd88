"""Tokenize: batches of documents -> flat arrays of token ids with each document's length, no
special tokens added; then, with --dedup exact, each distinct text once (with --dedup near,
one text of each cluster of near-copies too: MinHash signatures made where it tokenizes).

Keeps: the ids are the reference's (HF tokenizers): a fast backend is checked before the
run and on a seeded sample during it. Dedup keeps the copy at the smallest place, so the
result does not depend on the order in which copies arrive.
"""
from transforms import stage_exports

__getattr__, __all__ = stage_exports(__name__, {
    "TokenizeBatches": "tokenizer",  # tokenize it
    "DropDuplicates": "dedup",  # [drop duplicate texts]
    "LimitLengths": "lengths",  # [limit document lengths]
    "resolve_tokenizer": "tokenizer",
})
