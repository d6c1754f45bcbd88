"""Deliberately wrong tokenizer backends, plugged in with --tokenizer_backend tests.wrong_backends:NAME,
to show that the guard catches a backend that disagrees with HF tokenizers."""
import numpy as np

from transforms.tokenize.backends import make_encoder

RARE_MARKER = "zebra-marker-7"


def _wrong_where(predicate, json_text):
    right = make_encoder("fastokens", json_text)

    def encode(texts):
        ids, lengths = right(texts)
        ids = ids.astype(np.int64)
        starts = np.cumsum(lengths) - lengths
        for i, text in enumerate(texts):
            if predicate(text) and lengths[i]:
                ids[starts[i]] += 1  # one wrong id: the kind of bug a re-implementation has
        return ids, lengths
    return encode


def wrong_on_accents(json_text):
    """Differs on any text with an accented letter: the tricky strings expose it."""
    return _wrong_where(lambda t: any(c in t for c in "éäñ"), json_text)


def wrong_on_rare_documents(json_text):
    """Differs only on documents holding a marker no built-in check contains."""
    return _wrong_where(lambda t: RARE_MARKER in t, json_text)
