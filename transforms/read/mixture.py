"""Mixtures: several sources in chosen proportions of the train split's tokens.

A mixture file (YAML or JSON, local or any fsspec URL) lists sources:

    sources:
      - name: web
        input: ["gs://bucket/web/*.jsonl.zst"]
        weight: 0.7
      - name: code
        input: ["gs://bucket/code/*.jsonl.zst"]
        weight: 0.3
        max_epochs: 4

`weight` is the source's share of the train tokens (weights are normalised); `max_epochs`
(default 1) bounds how many times its train documents are used on average. The train size
T is the largest for which no source exceeds its max_epochs:

    T = min over sources of max_epochs_s * tokens_s / share_s

where tokens_s is the source's train tokens (after deduplication). Each source's
multiplier is m_s = share_s * T / tokens_s: a document is used floor(m_s) times, plus once
more when a seeded hash of it falls below m_s - floor(m_s). The binding source is used
exactly max_epochs times; the others are subsampled (or repeated less).

Everything here is exact: weights and epochs are turned into Fractions (a float is a
dyadic rational, so this loses nothing), and the Bernoulli threshold is an integer out of
2**64, so every runner computes the same copies.
"""
import json
import math
import os
import posixpath
from dataclasses import dataclass
from fractions import Fraction

import fsspec

from flat_tokens.format.mixture_table import DOCUMENTS, DUPLICATES, TOKENS_AVAILABLE, TRAIN_TOKENS, VALIDATION_TOKENS
from transforms.read.inputs import InputError

SOURCE_KEYS = ("name", "input", "validation_input", "weight", "max_epochs", "text_key")
MIXTURE_KEYS = ("sources",)


class MixtureError(InputError):
    """A bad mixture file (the message names the file and the field), or a source that
    cannot be sampled (the message names the source)."""


@dataclass(frozen=True)
class Source:
    name: str
    inputs: tuple[str, ...]
    validation_inputs: tuple[str, ...]  # empty: --validation_fraction of `inputs` is held out
    weight: float
    max_epochs: float
    text_key: str | None  # None: --text_key


@dataclass(frozen=True)
class Mixture:
    url: str
    sources: tuple[Source, ...]

    def shares(self) -> list[Fraction]:
        total = sum(Fraction(s.weight) for s in self.sources)
        return [Fraction(s.weight) / total for s in self.sources]

    def describe(self) -> dict:
        """The static part of the provenance (what was asked for)."""
        return {"file": self.url, "sources": [
            {"name": s.name, "inputs": list(s.inputs), "validation_inputs": list(s.validation_inputs),
             "text_key": s.text_key, "weight": s.weight, "share": float(share), "max_epochs": s.max_epochs}
            for s, share in zip(self.sources, self.shares())]}


# ---------------------------------------------------------------------------------------------
# Reading and checking the file


def load_mixture(url: str, storage_options: dict | None = None) -> Mixture:
    """Reads and fully checks a mixture file; raises MixtureError naming the file and field."""
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            raw = f.read()
    except FileNotFoundError:
        raise MixtureError(f"--mixture {url}: no such file") from None
    except (OSError, ValueError, ImportError) as e:
        raise MixtureError(f"--mixture {url}: cannot be read ({type(e).__name__}: {e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MixtureError(f"--mixture {url}: not UTF-8 text ({e})") from None
    return parse_mixture(text, url)


def parse_mixture(text: str, url: str) -> Mixture:
    document = _parse_document(text, url)

    def bad(where: str, message: str):
        return MixtureError(f"--mixture {url}: {where}: {message}")

    if not isinstance(document, dict):
        raise MixtureError(f"--mixture {url}: expected a mapping with a 'sources' list at the top, "
                           f"got {type(document).__name__}")
    for key in document:
        if key not in MIXTURE_KEYS:
            raise bad(str(key), f"unknown key (allowed: {', '.join(MIXTURE_KEYS)})")
    sources = document.get("sources")
    if not isinstance(sources, list) or not sources:
        raise bad("sources", "must be a non-empty list of sources")
    parsed, names = [], set()
    for i, entry in enumerate(sources):
        where = f"sources[{i}]"
        if not isinstance(entry, dict):
            raise bad(where, f"must be a mapping (name, input, weight, ...), got {type(entry).__name__}")
        for key in entry:
            if key not in SOURCE_KEYS:
                raise bad(f"{where}.{key}", f"unknown key (allowed: {', '.join(SOURCE_KEYS)})")
        for key in ("name", "input", "weight"):
            if key not in entry:
                raise bad(f"{where}.{key}", "missing")
        name = entry["name"]
        if not isinstance(name, str) or not name.strip():
            raise bad(f"{where}.name", f"must be a non-empty string, got {name!r}")
        if name in names:
            raise bad(f"{where}.name", f"duplicate source name {name!r}")
        names.add(name)
        text_key = entry.get("text_key")
        if text_key is not None and (not isinstance(text_key, str) or not text_key):
            raise bad(f"{where}.text_key", f"must be a non-empty string, got {text_key!r}")
        parsed.append(Source(
            name=name,
            inputs=_patterns(entry["input"], url, f"{where}.input", bad, required=True),
            validation_inputs=_patterns(entry.get("validation_input", []), url, f"{where}.validation_input", bad),
            weight=_positive_number(entry["weight"], f"{where}.weight", bad),
            max_epochs=_positive_number(entry.get("max_epochs", 1), f"{where}.max_epochs", bad),
            text_key=text_key,
        ))
    return Mixture(url, tuple(parsed))


def _parse_document(text: str, url: str):
    if url.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise MixtureError(f"--mixture {url}: not valid JSON: {e}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())
        raise MixtureError(f"--mixture {url}: not valid YAML: {detail}") from None


def _positive_number(value, where: str, bad) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " (YAML reads 1e-1 as a string: write 0.1)" if isinstance(value, str) else ""
        raise bad(where, f"must be a number > 0, got {value!r}{hint}")
    if not math.isfinite(value) or value <= 0:
        raise bad(where, f"must be > 0, got {value!r}")
    return float(value)


def _patterns(value, url: str, where: str, bad, required: bool = False) -> tuple[str, ...]:
    """A pattern or a list of them; relative paths are relative to the mixture file."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
        raise bad(where, f"must be a path, URL or glob, or a list of them, got {value!r}")
    if required and not values:
        raise bad(where, "must name at least one file, directory or glob")
    return tuple(resolve_relative(v, url) for v in values)


def resolve_relative(pattern: str, mixture_url: str) -> str:
    if "://" in pattern or pattern.startswith("/"):
        return pattern
    if "://" in mixture_url:
        return posixpath.join(posixpath.dirname(mixture_url), pattern)
    return os.path.join(os.path.dirname(os.path.abspath(mixture_url)), pattern)


# ---------------------------------------------------------------------------------------------
# Multipliers


@dataclass(frozen=True)
class SourceSampling:
    """How often a source's train documents are used: `whole` times, plus once more when a
    document's sample hash is below `threshold` (out of 2**64)."""

    multiplier: Fraction
    whole: int
    threshold: int


def train_total(mixture: Mixture, amounts) -> Fraction:
    """T: the largest train size for which no source is used more than its max_epochs times,
    from each source's train amount (tokens after deduplication; or, to plan shards before
    the run, bytes of text), in the same unit."""
    return min(Fraction(s.max_epochs) * Fraction(amount) / share
               for s, amount, share in zip(mixture.sources, amounts, mixture.shares()))


def sampling_plan(mixture: Mixture, train_tokens: list[int]) -> tuple[Fraction, list[SourceSampling]]:
    """(T, per-source sampling) from each source's train tokens after deduplication."""
    shares = mixture.shares()
    for source, tokens in zip(mixture.sources, train_tokens):
        if tokens <= 0:
            raise MixtureError(f"mixture source {source.name!r} has no train tokens: every document of it was "
                               f"empty, a duplicate, rejected or held out for validation; remove the source "
                               f"or give it more input")
    total = train_total(mixture, train_tokens)
    plan = []
    for tokens, share in zip(train_tokens, shares):
        m = share * total / tokens
        whole = math.floor(m)
        plan.append(SourceSampling(m, whole, math.floor((m - whole) * 2**64)))
    return total, plan


# ---------------------------------------------------------------------------------------------
# Counts per source: keys of the job's count dicts (transforms.write.commit.SumCounts); those a
# reader shows are the provenance's field names (flat_tokens/format/mixture_table.py)

EMPTY = "empty"  # documents that tokenized to nothing
NEAR_DUPLICATES = "near_duplicates"  # texts removed by --dedup near as near-copies of a kept text
DEDUP_AGAINST = "dedup_against"  # texts removed by --dedup_against as held by earlier datasets
TRAIN_DOCUMENTS = "train_documents"  # distinct documents available to train
TRAIN_SEQUENCES = "train_sequences"  # copies written to train
VALIDATION_SEQUENCES = "validation_sequences"
# --min_tokens, --max_tokens (transforms/tokenize/lengths.py): documents dropped as too short,
# and the pieces of split documents beyond one each (train documents and validation sequences
# count every piece).
TOO_SHORT = "too_short"
EXTRA_SEQUENCES = "extra_sequences"
SOURCE_COUNTS = (DOCUMENTS, EMPTY, DUPLICATES, TRAIN_DOCUMENTS, TOKENS_AVAILABLE, TRAIN_SEQUENCES, TRAIN_TOKENS,
                 VALIDATION_SEQUENCES, VALIDATION_TOKENS, TOO_SHORT, EXTRA_SEQUENCES)


def source_key(index: int, what: str) -> str:
    return f"source:{index}:{what}"


def source_counts(counts: dict, index: int) -> dict:
    return {what: counts.get(source_key(index, what), 0) for what in SOURCE_COUNTS}


def train_tokens_of(mixture: Mixture, counts: dict) -> list[int]:
    return [counts.get(source_key(i, TOKENS_AVAILABLE), 0) for i in range(len(mixture.sources))]


def check_source_accounts(mixture: Mixture, counts: dict) -> None:
    """Raises when a source's documents do not add up, or its copies disagree with its multiplier."""
    _, plan = sampling_plan(mixture, train_tokens_of(mixture, counts))
    for i, (source, sampling) in enumerate(zip(mixture.sources, plan)):
        c = source_counts(counts, i)
        near = counts.get(source_key(i, NEAR_DUPLICATES), 0)
        against = counts.get(source_key(i, DEDUP_AGAINST), 0)
        used = (c[EMPTY] + c[DUPLICATES] + near + against + c[TOO_SHORT] + c[TRAIN_DOCUMENTS]
                + c[VALIDATION_SEQUENCES] - c[EXTRA_SEQUENCES])
        if used != c[DOCUMENTS]:
            raise RuntimeError(f"source {source.name!r}: {c[DOCUMENTS]} documents read, but {c[EMPTY]} empty + "
                               f"{c[DUPLICATES]} duplicates + {near} near-duplicates + {against} held by earlier "
                               f"datasets + {c[TOO_SHORT]} too short + "
                               f"{c[TRAIN_DOCUMENTS]} train + {c[VALIDATION_SEQUENCES]} validation - "
                               f"{c[EXTRA_SEQUENCES]} extra pieces = {used}")
        low, high = sampling.whole * c[TRAIN_DOCUMENTS], math.ceil(sampling.multiplier) * c[TRAIN_DOCUMENTS]
        if not low <= c[TRAIN_SEQUENCES] <= high:
            raise RuntimeError(f"source {source.name!r}: {c[TRAIN_SEQUENCES]} train copies of "
                               f"{c[TRAIN_DOCUMENTS]} documents, outside [{low}, {high}] for multiplier "
                               f"{float(sampling.multiplier):.6g}")


def report(mixture: Mixture, counts: dict) -> dict:
    """The `mixture` root attribute: what was asked for, and what was written, per source."""
    total, plan = sampling_plan(mixture, train_tokens_of(mixture, counts))
    described = mixture.describe()
    train_total = sum(counts.get(source_key(i, TRAIN_TOKENS), 0) for i in range(len(mixture.sources)))
    for i, (entry, sampling) in enumerate(zip(described["sources"], plan)):
        c = source_counts(counts, i)
        entry.update(c)
        if source_key(i, NEAR_DUPLICATES) in counts:  # --dedup near
            entry[NEAR_DUPLICATES] = counts[source_key(i, NEAR_DUPLICATES)]
        if source_key(i, DEDUP_AGAINST) in counts:  # --dedup_against
            entry[DEDUP_AGAINST] = counts[source_key(i, DEDUP_AGAINST)]
        entry["multiplier"] = float(sampling.multiplier)
        entry["train_share"] = c[TRAIN_TOKENS] / train_total if train_total else 0.0
    described["train_tokens_target"] = float(total)
    return described
