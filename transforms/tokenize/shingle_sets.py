"""Exact shingle sets, for the dedup report's `similarity` of near-copies (--dedup_report with
--dedup near): the Jaccard similarity of two documents' shingle sets, not their signatures'
estimate of it.

Only the dedup group has a document's content after tokenization: its token ids (the texts
are not carried past the tokenizer, and the near-duplicate graph holds signatures only). So
the sets are made there, for the few texts the report needs (those removed as near-copies
and the kept texts of their clusters), only when the report is asked for:

- `--near_shingle tokens`: the token ids are the units, as minhash.batch_signatures takes them;
- `--near_shingle words`: the ids are decoded back to the text, and the text's words taken
  as the signatures take them (minhash.word_hashes: the normalised words, each as its 32-bit
  hash). The decoded text must have the document's content digest: a tokenizer that loses
  text (a lowercasing normalizer, unknown tokens, added special tokens) gives no set, and
  the report's `similarity` stays null for its rows.

A shingle is n consecutive units (n = --near_shingle_size), held as n little-endian uint32
values seen as one opaque value, so two shingles are equal exactly when their units are.
"""
from dataclasses import dataclass

import numpy as np

from transforms.tokenize import minhash


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
        bounds = np.append(0, np.cumsum(lengths))
        if self.settings.shingle == minhash.TOKENS:
            for i in range(lengths.size):
                out[i] = shingle_set(ids[bounds[i]:bounds[i + 1]], self.settings.shingle_size)
            return out
        # Imported here: the tokenizer's module imports dedup's, which imports this one's jaccard.
        from transforms.tokenize.dedup import digests_of
        from transforms.tokenize.tokenizer import load_decoder
        decode = load_decoder(self.tokenizer, self.storage_options)
        encoded = []
        for i in range(lengths.size):
            try:
                encoded.append(decode(ids[bounds[i]:bounds[i + 1]]).encode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                encoded.append(None)
        given_back = [e is not None for e in encoded]
        found = digests_of([e for e in encoded if e is not None])
        back = np.flatnonzero(given_back)
        same = np.all(found == digests[back], axis=1) if back.size else np.zeros(0, dtype=bool)
        texts = back[same]  # given back whole: their words are the signatures' words
        units, per_doc = minhash.word_hashes([encoded[i] for i in texts.tolist()])
        ends = np.cumsum(per_doc)
        for i, start, end in zip(texts.tolist(), (ends - per_doc).tolist(), ends.tolist()):
            out[i] = shingle_set(units[start:end], self.settings.shingle_size)
        return out


def shingle_set(units: np.ndarray, n: int) -> np.ndarray:
    """The distinct n-grams of `units` (uint32 values), sorted, each one opaque value."""
    units = np.ascontiguousarray(units, dtype="<u4")
    if units.size < n:
        return np.empty(0, dtype=np.dtype((np.void, 4 * n)))
    grams = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(units, n))
    return np.unique(grams.view(np.dtype((np.void, 4 * n))).ravel())


def jaccard(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """|a & b| / |a | b| of two shingle sets (shingle_set), NaN when either is unknown."""
    if a is None or b is None or a.size + b.size == 0:
        return float("nan")
    shared = np.intersect1d(a, b, assume_unique=True).size
    return shared / (a.size + b.size - shared)
