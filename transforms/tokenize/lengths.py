"""LimitLengths (--min_tokens, --max_tokens, --long_documents): tokenized documents shorter
than a minimum are dropped; longer than a maximum, cut into consecutive pieces (split) or to
their first tokens (truncate). After --dedup exact (duplicates are whole texts) and before a
mixture's weighing (its shares are of the tokens actually written).

    a document of 10 tokens, --max_tokens 4:  split -> 4, 4, 2 tokens;  truncate -> 4

The pieces of a split document stay one document everywhere that decides where it goes:
each piece is an entry of the batch with the document's own place (offset and file, or
content digest), so the shuffle gives all of them one hash, one split and one shard, and a
mixture the same number of copies. Entries with equal keys keep their order through the
sort (a stable lexsort, and the pieces lie side by side in one shard part), so the pieces
are written consecutively and in order.

Counts (what the commit checks, transforms/write/commit.py): `too_short` documents dropped,
`truncated` documents cut (`truncated_tokens` dropped), `split` documents cut into pieces
and `extra_sequences`, the pieces beyond one each; so documents = sequences - extra_sequences
+ empty + too_short + duplicates. With a mixture, `too_short` and `extra_sequences` per source too.
"""
from dataclasses import dataclass, replace

import apache_beam as beam
import numpy as np

from transforms.read import mixture
from transforms.read.inputs import input_index
from transforms.records import DistinctBatch, TokenizedBatch
from transforms.segments import take_documents

SPLIT, TRUNCATE = "split", "truncate"
COUNTS = "counts"
TOO_SHORT, TRUNCATED, TRUNCATED_TOKENS, SPLIT_DOCUMENTS, EXTRA_SEQUENCES = (
    "too_short", "truncated", "truncated_tokens", "split", "extra_sequences")
LENGTH_COUNTS = (TOO_SHORT, TRUNCATED, TRUNCATED_TOKENS, SPLIT_DOCUMENTS, EXTRA_SEQUENCES)


@dataclass(frozen=True)
class LengthLimits:
    min_tokens: int = 0  # 0 (or 1): every non-empty document is kept
    max_tokens: int = 0  # 0: no maximum
    long_documents: str = SPLIT

    def active(self) -> bool:
        return self.min_tokens > 1 or self.max_tokens > 0

    def describe(self) -> dict:
        """The provenance's record."""
        return {"min_tokens": self.min_tokens, "max_tokens": self.max_tokens,
                "long_documents": self.long_documents if self.max_tokens else None}


def _document_fields(batch) -> tuple[str, ...]:
    """The fields of a batch that hold one value per document."""
    if isinstance(batch, DistinctBatch):
        return "digests", "splits", "sources", "lengths"
    return ("offsets", "lengths") + tuple(name for name in ("digests", "signatures", "defects")
                                          if getattr(batch, name) is not None)


def _take(batch, index: np.ndarray, **changed):
    """The batch with its documents `index` (in that order, repeats allowed), and `changed`."""
    fields = {name: getattr(batch, name)[index] for name in _document_fields(batch)}
    fields.update(changed)
    if isinstance(batch, TokenizedBatch) and "ids" in changed:
        fields["ids_file"] = None  # not the staged file's ids any more
    if isinstance(batch, TokenizedBatch):
        fields["signatures_file"] = None  # nor its signatures
    return replace(batch, **fields)


def limit_lengths(batch, limits: LengthLimits):
    """(the batch with its documents dropped, cut or split by `limits`, the counts dict)."""
    lengths = batch.lengths
    counts = dict.fromkeys(LENGTH_COUNTS, 0)
    if limits.min_tokens > 1:
        kept = np.flatnonzero(lengths >= limits.min_tokens)
        counts[TOO_SHORT] = int(lengths.size - kept.size)
        if kept.size < lengths.size:
            starts = np.cumsum(lengths) - lengths
            batch = _take(batch, kept, ids=take_documents(batch.ids, starts[kept], lengths[kept]))
            lengths = batch.lengths
    top = limits.max_tokens
    if top and lengths.size and int(lengths.max()) > top:
        long = lengths > top
        if limits.long_documents == TRUNCATE:
            cut = np.minimum(lengths, top)
            counts[TRUNCATED] = int(np.count_nonzero(long))
            counts[TRUNCATED_TOKENS] = int((lengths - cut).sum())
            starts = np.cumsum(lengths) - lengths
            batch = _take(batch, np.arange(lengths.size), lengths=cut, ids=take_documents(batch.ids, starts, cut))
        else:
            pieces = -(-lengths // top)
            of = np.repeat(np.arange(lengths.size), pieces)
            k = np.arange(of.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
            counts[SPLIT_DOCUMENTS] = int(np.count_nonzero(long))
            counts[EXTRA_SEQUENCES] = int(of.size - lengths.size)
            batch = _take(batch, of, lengths=np.minimum(lengths[of] - k * top, top))  # the ids stay as they are
    return batch, counts


def _sources(batch, source_of_input: list[int]) -> np.ndarray:
    if isinstance(batch, DistinctBatch):
        return batch.sources
    return np.full(batch.lengths.shape, source_of_input[input_index(batch.file_key)], dtype=np.int64)


def source_counts(batch, limits: LengthLimits, source_of_input: list[int]) -> dict:
    """With a mixture: each source's documents too short, and its split documents' extra
    sequences (the mixture's accounts add up with them)."""
    sources, lengths = _sources(batch, source_of_input), batch.lengths
    size = max(source_of_input) + 1
    short = lengths < limits.min_tokens if limits.min_tokens > 1 else np.zeros(lengths.shape, bool)
    extra = np.zeros(lengths.shape, np.int64)
    if limits.max_tokens and limits.long_documents == SPLIT:
        extra = np.where(short, 0, -(-lengths // limits.max_tokens) - 1)
    out = {}
    for s, (n, e) in enumerate(zip(np.bincount(sources[short], minlength=size).tolist(),
                                   np.bincount(sources, weights=extra, minlength=size).astype(np.int64).tolist())):
        out[mixture.source_key(s, mixture.TOO_SHORT)] = n
        out[mixture.source_key(s, mixture.EXTRA_SEQUENCES)] = e
    return out


def _limited(batch, limits: LengthLimits, source_of_input: list[int] | None):
    limited, counts = limit_lengths(batch, limits)
    if source_of_input is not None:
        counts.update(source_counts(batch, limits, source_of_input))
    if limited.lengths.size:
        yield limited
    yield beam.pvalue.TaggedOutput(COUNTS, counts)


class LimitLengths(beam.PTransform):
    """TokenizedBatches (or DistinctBatches) -> the same, their documents limited in length
    (main output `batches`), and count dicts (`counts`). `source_of_input`: with a mixture,
    the source of each input index (counts per source)."""

    def __init__(self, limits: LengthLimits, source_of_input: list[int] | None = None):
        super().__init__()
        self._limits = limits
        self._source_of_input = source_of_input

    def expand(self, batches):
        return batches | "DropShortCutLong" >> beam.FlatMap(
            _limited, self._limits, self._source_of_input).with_outputs(COUNTS, main="batches")
