"""Tokenization backends, and the guard that keeps a fast one honest.

HuggingFace `tokenizers` defines what a tokenizer.json means: it is the reference. A
faster re-implementation (fastokens) is used only after it agrees with the reference on
built-in tricky strings and on the corpus's first documents, and while the job runs a
deterministic sample of documents (chosen by a hash of their place) is re-encoded with the
reference; any disagreement fails the job. Re-implementations do disagree in the wild
(tokie differed on 6 of 26,548 documents with GPT-2).

A backend is a callable texts -> (flat ids, lengths), built from the tokenizer.json text.
With `split_special` (--split_special_tokens), the text of a special token inside a document
(`<|endoftext|>`) is encoded as ordinary text, as transformers' `split_special_tokens` does;
otherwise it becomes the special token's id.
"""
import hashlib
import importlib
import importlib.metadata
import itertools
import threading
from dataclasses import dataclass

import numpy as np

from transforms import hashing
from transforms.read.inputs import place_name

HF = "hf"
FASTOKENS = "fastokens"
AUTO = "auto"

# Strings where tokenizer re-implementations tend to differ: whitespace runs, contractions,
# tabs and newlines, CJK, emoji and ZWJ sequences, combining marks, control characters,
# special-token text, numbers, very long words, mixed scripts.
TRICKY_STRINGS = [
    "", " ", "  ", "\t", "\n", "\r\n", " \n \n\n  \t\t x", "a  b   c    d",
    "Hello world", " Hello", "hello   world  ", "I'm you're it's we'll they've she'd don't I'M",
    "tabs\tand\ttabs\t\t\tand\nnew\n\n\nlines\r\n", "trailing spaces     ", "    leading",
    "日本語のテキスト、中文文本，한국어 텍스트", "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "accents: café naïve façade résumé Ça coûte déjà Größe año", "control \x00 \x01 \x07 \x1b[0m \x7f",
    "<|endoftext|> special <s></s> [CLS] [SEP]", "numbers 1234567890 3.14159 1,000,000 0x1F",
    "supercalifragilisticexpialidocious" * 4, "mixed Ελληνικά русский עברית العربية ไทย",
    "code: def f(x):\n    return x**2  # comment\n", "URL https://example.com/a?b=c&d=e#f",
    "\u2028\u2029\u0085\ufeff\u200b\u00a0", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "ǅ ß ẞ İ ı ﬁ",
]


# The reference is slow and memory-hungry on huge documents (per-token Python objects), so
# a checked document longer than this is compared on its first GUARD_MAX_CHARS characters,
# encoded by both backends: the same question, at a bounded cost.
GUARD_MAX_CHARS = 1 << 16


GUARD_FIRST_DOCUMENTS_CHARS = 1 << 18


def bounded(text: str) -> str:
    return text if len(text) <= GUARD_MAX_CHARS else text[:GUARD_MAX_CHARS]


class BackendMismatch(RuntimeError):
    """A backend gave other ids than the reference: the message says where and how."""


# Loading a large tokenizer.json takes ~0.5 s per backend. The launcher's guard and an
# in-process worker load the same ones: keep them per process, keyed by content, so the
# cache can never hand out another tokenizer than the one asked for. One lock per key, so
# that a prefetch (below) and the run never build the same tokenizer twice.
_ENCODERS = {}
_LOCKS = {}
_LOCKS_GUARD = threading.Lock()


def _cached(key, build):
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key not in _ENCODERS:
            _ENCODERS[key] = build()
        return _ENCODERS[key]


def hf_tokenizer(json_text: str):
    """The reference tokenizers.Tokenizer for a tokenizer.json, parsed once per process."""
    from tokenizers import Tokenizer
    key = ("tokenizers.Tokenizer", hashlib.sha256(json_text.encode("utf-8")).hexdigest())
    return _cached(key, lambda: Tokenizer.from_str(json_text))


def _hf(json_text: str, split_special: bool = False):
    tokenizer = hf_tokenizer(json_text)
    if split_special:  # a Tokenizer of its own: the setting is the object's, not the call's
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_str(json_text)
        tokenizer.encode_special_tokens = True

    def encode(texts):
        id_lists = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.fromiter((len(ids) for ids in id_lists), dtype=np.int64, count=len(id_lists))
        flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths
    return encode


def _fastokens(json_text: str, split_special: bool = False):
    import fastokens
    tokenizer = fastokens.Tokenizer.from_json_str(json_text)

    def encode(texts):
        ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=split_special)
        offsets = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        return np.frombuffer(ids, dtype=np.uint32), np.diff(offsets)
    return encode


BUILTIN = {HF: _hf, FASTOKENS: _fastokens}


def _factory(name: str):
    """A built-in backend by name, or a plugin as "module:attribute" (a factory json -> encode)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" in name:
        module, attr = name.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    raise ValueError(f"--tokenizer_backend {name}: unknown; use auto, hf, fastokens or module:factory")


def version_of(name: str) -> str:
    dist = {HF: "tokenizers", FASTOKENS: "fastokens"}.get(name)
    if dist is None:
        return "plugin" if ":" in name else "builtin"
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def installed(name: str) -> bool:
    try:
        importlib.import_module({FASTOKENS: "fastokens", HF: "tokenizers"}.get(name, name.split(":")[0]))
        return True
    except ImportError:
        return False


def make_encoder(name: str, json_text: str, split_special: bool = False):
    key = (name, hashlib.sha256(json_text.encode("utf-8")).hexdigest(), split_special)
    if not split_special:
        return _cached(key, lambda: _factory(name)(json_text))
    if name not in BUILTIN:  # a plugin's factory takes the tokenizer.json text only
        raise ValueError(f"a plugin backend cannot encode special-token text as text (--split_special_tokens); "
                         f"use {HF} or {FASTOKENS}")
    return _cached(key, lambda: _factory(name)(json_text, split_special=True))


def prefetch(json_text: str, requested: str = AUTO, split_special: bool = False) -> threading.Thread:
    """Starts building, on a background thread, the encoders a run with this tokenizer and
    --tokenizer_backend will ask for. Parsing a tokenizer.json is native code that releases
    the GIL (fastokens: 0.4 s for GPT-2), so the launcher's own imports (Beam: ~0.8 s) go
    on meanwhile. Only a head start: any error is left for the run to meet and report."""
    names = [HF] + ([FASTOKENS] if requested in (AUTO, FASTOKENS) else [])

    def build():
        for name in names:
            try:
                make_encoder(name, json_text, split_special)
            except Exception:  # noqa: BLE001 - the run loads it again and reports the error
                pass
    thread = threading.Thread(target=build, name="flat-tokens-prefetch", daemon=True)
    thread.start()
    return thread


def first_mismatch(reference, candidate, texts: list[str]):
    """(index, reference ids, candidate ids) of the first text encoded differently, or None."""
    if not texts:
        return None
    ref_ids, ref_lengths = reference(texts)
    got_ids, got_lengths = candidate(texts)
    if np.array_equal(ref_lengths, got_lengths) and np.array_equal(ref_ids.astype(np.int64), got_ids.astype(np.int64)):
        return None
    ref_starts, got_starts = np.cumsum(ref_lengths) - ref_lengths, np.cumsum(got_lengths) - got_lengths
    for i in range(len(texts)):
        a = ref_ids[ref_starts[i]:ref_starts[i] + ref_lengths[i]].astype(np.int64)
        b = got_ids[got_starts[i]:got_starts[i] + got_lengths[i]].astype(np.int64)
        if not np.array_equal(a, b):
            return i, a, b
    return None


def describe_mismatch(backend: str, text: str, ref_ids, got_ids, where: str) -> str:
    diff = next((k for k, (x, y) in enumerate(zip(ref_ids, got_ids)) if x != y), min(len(ref_ids), len(got_ids)))
    return (f"--tokenizer_backend {backend} disagrees with HuggingFace tokenizers on {where} "
            f"(text {text[:80]!r}): from token {diff}, tokenizers gives {ref_ids[diff:diff + 8].tolist()}, "
            f"{backend} gives {got_ids[diff:diff + 8].tolist()}; use --tokenizer_backend hf")


@dataclass(frozen=True)
class GuardResult:
    backend: str
    problem: str | None


def pre_run_guard(name: str, json_text: str, first_documents: list[str], split_special: bool = False) -> GuardResult:
    """Compares a backend with the reference on tricky strings and the first documents."""
    if name == HF:
        return GuardResult(HF, None)
    reference, candidate = make_encoder(HF, json_text, split_special), make_encoder(name, json_text, split_special)
    first_documents = [bounded(t) for t in first_documents]
    while sum(map(len, first_documents)) > GUARD_FIRST_DOCUMENTS_CHARS and len(first_documents) > 1:
        first_documents = first_documents[: len(first_documents) // 2]
    for label, texts in (("a built-in tricky string", TRICKY_STRINGS), ("one of the first documents", first_documents)):
        found = first_mismatch(reference, candidate, texts)
        if found:
            i, a, b = found
            return GuardResult(name, describe_mismatch(name, texts[i], a, b, label))
    return GuardResult(name, None)


def choose_backend(requested: str, json_text: str, first_documents: list[str],
                   split_special: bool = False) -> tuple[str, str | None]:
    """(backend to use, note or None). Raises BackendMismatch when an explicitly requested
    backend fails the guard; `auto` falls back to the reference instead, also when the fast
    backend is missing or cannot load this tokenizer (fastokens refuses some pre-tokenizers)."""
    if requested != AUTO:
        result = pre_run_guard(requested, json_text, first_documents, split_special)
        if result.problem:
            raise BackendMismatch(result.problem)
        return requested, None
    if not installed(FASTOKENS):
        return HF, None
    try:
        result = pre_run_guard(FASTOKENS, json_text, first_documents, split_special)
    except Exception as e:  # a fast backend that cannot load this tokenizer.json: use the reference
        return HF, f"fastokens cannot load this tokenizer ({str(e)[:160]}); using hf"
    if result.problem:
        return HF, f"{result.problem}; falling back to hf"
    return FASTOKENS, None


def guard_sample(file_key: str, offsets: np.ndarray, fraction: float) -> np.ndarray:
    """The documents re-encoded with the reference while the job runs: a hash of each
    document's place below `fraction` of the hash range (deterministic, seed-independent)."""
    salt = hashing.file_salt(0, "tokenizer-guard", place_name(file_key))
    return hashing.below_fraction(hashing.place_hashes(salt, offsets), fraction)
