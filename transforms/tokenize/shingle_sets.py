"""Exact shingle sets, for the dedup report's `similarity` of near-copies (--dedup_report with
--dedup near): the Jaccard similarity of two documents' shingle sets, not their signatures'
estimate of it.

Only the dedup group has a document's content after tokenization: its token ids (the texts
are not carried past the tokenizer, and the near-duplicate graph holds signatures only). So
the sets are made there, for the few texts the report needs (those removed as near-copies
and the kept texts of their clusters), only when the report is asked for:

- `--near_shingle tokens`: the token ids are the units, as minhash.batch_signatures takes them;
- `--near_shingle words`: the ids are decoded back to the text, and the text's words taken
  as the signatures take them (words.word_hashes: the normalised words, each as its 32-bit
  hash). The decoded text must have the document's content digest: a tokenizer that loses
  text (a lowercasing normalizer, unknown tokens, added special tokens) gives no set, and
  the report's `similarity` stays null for its rows.

A shingle is n consecutive units (n = --near_shingle_size), held as a 64-bit hash of them:
two different shingles of a pair of texts of m shingles each are taken as one with
probability about m**2 / 2**64 (1e-13 at m = 1,000), and a set costs 8 bytes a shingle.
"""
from dataclasses import dataclass

import numpy as np

from transforms import hashing
from transforms.tokenize import minhash
from transforms.tokenize.characters import BatchText
from transforms.tokenize.dedup import digests_of
from transforms.tokenize.tokenizer import load_decoder
from transforms.tokenize.words import word_hashes


@dataclass(frozen=True)
class ExactShingles:
    """How to make a document's shingle set from its token ids."""

    settings: minhash.MinHashSettings
    tokenizer: object  # tokenizer.TokenizerInfo
    storage_options: dict | None = None

    def sets(self, ids: np.ndarray, lengths: np.ndarray, digests: np.ndarray) -> np.ndarray:
        """Object array: for each document (its ids end to end in `ids`, `lengths` each, its
        content digest in `digests`), its sorted shingle set, or None when it cannot be known
        (words of a text its tokenizer does not give back)."""
        out = np.empty(lengths.size, dtype=object)
        if self.settings.shingle == minhash.TOKENS:
            for i, one in enumerate(shingle_sets(ids, lengths, self.settings.shingle_size)):
                out[i] = one
            return out
        decode = load_decoder(self.tokenizer, self.storage_options)
        bounds = np.append(0, np.cumsum(lengths))
        encoded = []
        for i in range(lengths.size):
            try:
                encoded.append(decode(ids[bounds[i]:bounds[i + 1]]).encode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                encoded.append(None)
        back = np.flatnonzero([e is not None for e in encoded])
        found = digests_of([encoded[i] for i in back.tolist()])
        same = np.all(found == digests[back], axis=1) if back.size else np.zeros(0, dtype=bool)
        texts = back[same]  # given back whole: their words are the signatures' words
        units, per_doc = word_hashes(BatchText([encoded[i] for i in texts.tolist()]))
        sets = shingle_sets(units, per_doc, self.settings.shingle_size)
        for i, one in zip(texts.tolist(), sets):
            out[i] = one
        return out


def shingle_sets(units: np.ndarray, per_doc: np.ndarray, n: int) -> list[np.ndarray]:
    """Each document's set of shingles (n consecutive units: uint32 values, documents end to
    end, `per_doc` each), as the sorted distinct 64-bit hashes of its n-grams (hashed all at
    once, then each document's sorted: one sort of them all, by document and hash, took twice
    as long)."""
    units = np.asarray(units).astype(np.uint64)
    per_doc = np.asarray(per_doc, dtype=np.int64)
    if per_doc.size == 0:
        return []
    starts = np.cumsum(per_doc) - per_doc
    grams = max(units.size - n + 1, 0)
    # An n-gram's units packed two by two into 64-bit words, each word chained into the hash:
    # two different n-grams share a hash with probability about 2**-64.
    h = np.full(grams, n, dtype=np.uint64)
    for j in range(0, n, 2):
        word = units[j:j + grams] << np.uint64(32)
        if j + 1 < n:
            word |= units[j + 1:j + 1 + grams]
        h = hashing.splitmix64(h ^ word)
    # A document's n-grams start at its first per_doc - n + 1 units (none when it is shorter).
    ends = np.maximum(starts, starts + per_doc - n + 1)
    return [np.unique(h[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
