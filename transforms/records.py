"""The elements that flow between stages: batches of documents, never single documents.

Batching keeps Beam's per-element cost (pickling, a GroupByKey entry) off every document,
and numpy arrays pickle as flat buffers. RecordCoder (below) is registered for each type.
"""
import pickle
from dataclasses import dataclass, field, fields

import apache_beam as beam
import numcodecs
import numpy as np

from transforms.local_files import LocalFile, mapped
from transforms.segments import take_documents

# The two splits of a dataset, in the order every stage numbers them.
SPLITS = ("train", "validation")


@dataclass
class DocumentBatch:
    """Documents read from one range of one file, in file order."""

    file_key: str  # InputFile.key: the stable identity the shuffle hashes
    split: str  # "train", "validation" or "auto"
    offsets: np.ndarray  # uint64 byte offset of each document's line
    texts: list[str]


@dataclass
class TokenizedBatch:
    """Non-empty documents of a DocumentBatch, tokenized."""

    file_key: str
    split: str
    offsets: np.ndarray  # uint64, one per non-empty document
    lengths: np.ndarray  # int64 token count of each document
    ids: np.ndarray  # token ids, documents concatenated, in the narrowest type (narrowest_ids)
    empty: int  # documents that tokenized to nothing (dropped)
    digests: np.ndarray | None = None  # (n, 2) uint64 content digests, with --dedup exact only
    signatures: np.ndarray | None = None  # (n, K) uint16 MinHash signatures, with --dedup near only
    # Where these ids lie on local disk as they are, when a run staged them there
    # (transforms/staging.py): the shuffle's spill then maps that file instead of writing one,
    # and a batch that crosses from one stage to another (a resumed run's replayed batches
    # meet the freshly tokenized ones in a Flatten) carries the file's name and Sum, not its ids.
    ids_file: LocalFile | None = None
    # (n,) uint16 copy_defects (capitals, whitespace anomalies), with --dedup near only: which
    # near-copy a cluster keeps
    defects: np.ndarray | None = None
    # Where these signatures lie on local disk as they are, when a run staged them there: near
    # dedup's node parts then name that file instead of writing one (as ids_file for ids).
    signatures_file: LocalFile | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        if state["ids_file"] is not None:
            state["ids"] = (state["ids"].dtype.name, int(state["ids"].size))
        if state.get("signatures_file") is not None:
            state["signatures"] = tuple(state["signatures"].shape)
        return state

    def __setstate__(self, state):
        if state["ids_file"] is not None:
            state["ids"] = mapped(state["ids_file"], *state["ids"], kind="staged file")
        if state.get("signatures_file") is not None:
            rows, hashes = state["signatures"]
            state["signatures"] = mapped(state["signatures_file"], "uint16", rows * hashes,
                                         kind="staged file").reshape(rows, hashes)
        self.__dict__.update(state)


def signature_rows(file: LocalFile, hashes: int, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of a local file of uint16 signatures, `hashes` a row (as many rows as were
    written to it), mapped and checked; refused when it does not hold them."""
    file_rows, rest = divmod(file.sum.size, 2 * hashes)
    if rest:
        raise RuntimeError(f"signature file {file.path}: {rest} bytes past its last whole row")
    if rows.size and int(rows.max()) >= file_rows:
        raise RuntimeError(f"signature file {file.path} does not hold the rows asked for: it holds {file_rows}")
    return mapped(file, "uint16", file_rows * hashes, kind="signature file").reshape(file_rows, hashes)[rows]


def narrowest_ids(ids: np.ndarray, top: int | None = None) -> np.ndarray:
    """Token ids as uint16 when they fit (vocabularies up to 65,536), else uint32. `top`:
    their largest, when the caller knows it already."""
    if ids.size == 0 or (int(ids.max()) if top is None else top) < 1 << 16:
        return ids.astype(np.uint16)
    return ids.astype(np.uint32)


# Ids cross a runner's shuffle in their narrowest type, LZ4-compressed, without start bits
# (the lengths imply them): 1.2 bytes per token on real GPT-2 text instead of 1.96 for the
# encoded uint32 tokens under Blosc lz4 + bit-shuffle, and faster to pack and unpack. The
# runner copies and holds these bytes (on Dataflow, bills them as shuffle volume), so they
# set both the shuffle's time and its memory. LZ4 is single-threaded and deterministic.
_SHUFFLE_CODEC = numcodecs.LZ4(acceleration=1)

# A part's four 8-byte keys per document cross the runner byte-planed (every value's first
# byte, then every second byte, ...) and LZ4'd: salts repeat, lengths and offsets are small
# or grow slowly, so their high planes vanish (~12.5 bytes a document instead of 32). The
# in-process runner holds a GroupByKey's whole encoded output several times while it feeds
# the next stage, and parts (batches x shards) grow faster than the corpus (issue 21).
_KEYS = ("order_hashes", "salts", "offsets", "lengths")


def _pack_keys(keys: list[np.ndarray]) -> bytes:
    flat = np.concatenate([np.ascontiguousarray(k).view(np.uint64) for k in keys])
    return _SHUFFLE_CODEC.encode(np.ascontiguousarray(flat.view(np.uint8).reshape(-1, 8).T)) if flat.size else b""


def _unpack_keys(packed: bytes, n: int, dtypes: list[str]) -> list[np.ndarray]:
    if not n:
        return [np.empty(0, dtype=d) for d in dtypes]
    planes = np.frombuffer(_SHUFFLE_CODEC.decode(packed), dtype=np.uint8).reshape(8, -1)
    flat = np.ascontiguousarray(planes.T).view(np.uint64).ravel()
    return [flat[i * n:(i + 1) * n].view(d) for i, d in enumerate(dtypes)]


@dataclass
class ShardPart:
    """The documents of one batch that fall into one (split, shard) of the global shuffle.

    Its ids are in exactly one of three places: in memory as made (`raw_ids`); packed with
    LZ4 once the part is pickled to cross a runner's shuffle (`packed_ids`, see
    __getstate__); or, on local runners, in its batch's file of ids, among the batch's other
    documents (`spilled`, transforms/shuffle/spill.py), where LZ4 would cost more CPU (0.5 s per 95M
    ids) than it saves."""

    order_hashes: np.ndarray  # uint64
    salts: np.ndarray  # uint64 order salt of each document's file (a tie-breaker)
    offsets: np.ndarray  # uint64 (with --dedup exact, these two hold the halves of the content digest)
    lengths: np.ndarray  # int64
    ids_dtype: str  # "uint16" or "uint32"
    max_token_id: int  # measured when made, so sizing a part needs no ids
    raw_ids: np.ndarray | None = None  # token ids of the documents, concatenated
    packed_ids: bytes | None = None
    spilled: "SpilledDocuments | None" = None  # noqa: F821 (transforms.shuffle.spill.SpilledDocuments)
    sources: np.ndarray | None = None  # uint16 source of each document, with --record_sources only

    @classmethod
    def of(cls, order_hashes, salts, offsets, lengths, ids: np.ndarray, sources=None) -> "ShardPart":
        ids = np.ascontiguousarray(ids)
        return cls(order_hashes, salts, offsets, lengths, ids.dtype.name, int(ids.max()) if ids.size else -1,
                   raw_ids=ids, sources=sources)

    def ids(self) -> np.ndarray:
        if self.raw_ids is not None:
            return self.raw_ids
        if self.packed_ids is not None:
            return np.frombuffer(_SHUFFLE_CODEC.decode(self.packed_ids), dtype=self.ids_dtype)
        return self.spilled.read(self.ids_dtype, self.lengths)

    def __getstate__(self):
        state = dict(self.__dict__)
        if state["raw_ids"] is not None:
            state["packed_ids"], state["raw_ids"] = _SHUFFLE_CODEC.encode(state["raw_ids"]), None
        keys = [state.pop(name) for name in _KEYS]
        state["packed_keys"] = ([k.dtype.str for k in keys], len(keys[0]), _pack_keys(keys))
        return state

    def __setstate__(self, state):
        dtypes, n, packed = state.pop("packed_keys")
        state.update(zip(_KEYS, _unpack_keys(packed, n, dtypes)))
        self.__dict__.update(state)


class EncodedTokens:
    """The flat-tokens encoding (2*id, plus 1 on each sequence's first token) of concatenated
    sequences, made range by range when asked for (`np.asarray(tokens[a:b])`).

    A shard's encoded tokens are never made whole: the writer encodes each chunk on its own
    thread just before compressing it. A whole uint32 copy of a shard was ~100 MB of fresh
    memory per 64 MB shard, and clearing its pages cost more than encoding it (perf).

    The ids are one flat array, sequences end to end (`of`), or slices of other arrays
    (`gathered`: a shard's documents still in the parts they came from), copied straight
    into each encoded chunk. A shard of long documents is then never gathered into one
    array first, which cost a copy of every id, and the page clearing of that array, on
    the thread that sorts the next shard."""

    dtype = np.dtype(np.uint32)

    def __init__(self, layout: "_SequenceLayout", lo: int = 0, hi: int | None = None):
        self._layout = layout
        self._lo = lo
        self._hi = layout.size if hi is None else hi

    @classmethod
    def of(cls, ids: np.ndarray, lengths: np.ndarray) -> "EncodedTokens":
        """Sequences end to end in `ids`; lengths must be > 0."""
        return cls(_SequenceLayout(np.cumsum(lengths) - lengths, ids.size, (ids,)))

    @classmethod
    def gathered(cls, sources: list[np.ndarray], source_of: np.ndarray, start_in_source: np.ndarray,
                 lengths: np.ndarray) -> "EncodedTokens":
        """Sequence i is `sources[source_of[i]][start_in_source[i]:][:lengths[i]]`; lengths > 0."""
        return cls(_SequenceLayout(np.cumsum(lengths) - lengths, int(lengths.sum()), tuple(sources),
                                   source_of, start_in_source))

    @property
    def size(self) -> int:
        return self._hi - self._lo

    @property
    def nbytes(self) -> int:
        """What this view holds in memory (its ids and layout), not the size it encodes to."""
        return self._layout.nbytes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item: slice) -> "EncodedTokens":
        a, b, step = item.indices(self.size)
        if step != 1:
            raise IndexError("EncodedTokens takes contiguous slices only")
        return EncodedTokens(self._layout, self._lo + a, self._lo + max(a, b))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        tokens = self._layout.ids(self._lo, self._hi, np.uint32)  # a new array, shifted in place
        tokens <<= np.uint32(1)
        tokens[self._layout.starts_in(self._lo, self._hi) - self._lo] |= np.uint32(1)
        return tokens if dtype is None else tokens.astype(dtype, copy=False)

    def __reduce__(self):
        # Only the viewed range crosses a runner's shuffle: its ids end to end, and where
        # sequences start in it (a range may begin inside a sequence, without a start bit).
        ids = self._layout.ids(self._lo, self._hi)
        starts = self._layout.starts_in(self._lo, self._hi) - self._lo
        return _range_of, (ids, starts)


def _range_of(ids: np.ndarray, starts: np.ndarray) -> EncodedTokens:
    return EncodedTokens(_SequenceLayout(starts, ids.size, (ids,)))


class _SequenceLayout:
    """Where the sequences of an EncodedTokens start, and where their ids are; shared by
    every view of it. Sequence k covers [starts[k], starts[k+1]) of the concatenation (the
    last one up to `size`); ids before starts[0] belong to a sequence begun elsewhere."""

    def __init__(self, starts: np.ndarray, size: int, sources: tuple, source_of=None, start_in_source=None):
        self.starts = starts  # int64, increasing
        self.size = size
        self.sources = sources
        self.source_of = source_of  # None: sources[0] holds the concatenation itself
        self.start_in_source = start_in_source

    @property
    def nbytes(self) -> int:
        extra = 0 if self.source_of is None else self.source_of.nbytes + self.start_in_source.nbytes
        return sum(s.nbytes for s in self.sources) + self.starts.nbytes + extra

    def starts_in(self, lo: int, hi: int) -> np.ndarray:
        """The positions in [lo, hi) where a sequence starts."""
        first, last = np.searchsorted(self.starts, (lo, hi))
        return self.starts[first:last]

    def ids(self, lo: int, hi: int, dtype=None) -> np.ndarray:
        """The ids at [lo, hi) of the concatenation, as a new array (of `dtype`, else theirs)."""
        dtype = dtype or self.sources[0].dtype
        if self.source_of is None:
            return self.sources[0][lo:hi].astype(dtype)
        out = np.empty(hi - lo, dtype=dtype)
        first = max(int(np.searchsorted(self.starts, lo, side="right")) - 1, 0)
        last = int(np.searchsorted(self.starts, hi))
        ends = self.starts[first + 1:last + 1].tolist() + ([self.size] if last == self.starts.size else [])
        at = lo
        for start, end, source, begin in zip(self.starts[first:last].tolist(), ends,
                                             self.source_of[first:last].tolist(),
                                             self.start_in_source[first:last].tolist()):
            end = min(end, hi)
            begin += at - start
            out[at - lo:end - lo] = self.sources[source][begin:begin + end - at]
            at = end
        return out


@dataclass
class SortedShard:
    """All documents of one shard, in their final order."""

    split: str
    shard: int
    lengths: np.ndarray  # int64 token count of each sequence
    tokens: "np.ndarray | EncodedTokens"  # uint32 encoded tokens, or made per range when written
    sources: np.ndarray | None = None  # uint16 source of each sequence, with --record_sources only


@dataclass
class ShardSize:
    """What a ShardPart adds to its shard: enough to lay the shards out before writing."""

    split: str
    shard: int
    tokens: int
    sequences: int
    max_token_id: int = field(default=-1)


def approximate_bytes(record) -> int:
    """The size of a record's arrays, texts and bytes, without encoding it."""
    total = 0
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, (np.ndarray, EncodedTokens)):
            total += value.nbytes
        elif isinstance(value, (bytes, str)):
            total += len(value)
        elif isinstance(value, list):
            total += sum(map(len, value))
        else:
            total += 8
    return total


class RecordCoder(beam.coders.Coder):
    """Pickles a record, but estimates its size without encoding it.

    Beam measures every output's element sizes on a sample (the first ten elements, then
    fewer) by encoding them. Our elements are few and megabytes each, so that pickled most
    DocumentBatches and every SortedShard once more only to count their bytes."""

    def encode(self, value) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes):
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False  # records are values, never GroupByKey keys

    def estimate_size(self, value) -> int:
        return approximate_bytes(value)


for _record in (DocumentBatch, TokenizedBatch, ShardPart, SortedShard):
    beam.coders.registry.register_coder(_record, RecordCoder)


@dataclass
class DedupPart:
    """The documents of one TokenizedBatch that fall into one shard of the dedup shuffle.

    Its ids travel LZ4-packed (`packed_ids`, as in ShardPart), or, when its batch's ids lie
    in a local file (a local run's staged batch: TokenizedBatch.ids_file), only where each
    document starts in that file (`ids_file`, `starts`). The in-process runner holds every
    part until the group is read, several times over: with the ids inside, 3.8 GB at the
    peak of the 1.25 GB benchmark (5 copies of each text)."""

    file_key: str
    split: str  # the batch's split: "train", "validation" or "auto"
    offsets: np.ndarray  # uint64: with the file key, each copy's place (which copy is kept)
    digests: np.ndarray  # (n, 2) uint64 content digests
    lengths: np.ndarray  # int64
    packed_ids: bytes  # as in ShardPart; empty when the ids are in `ids_file`
    ids_dtype: str
    ids_file: LocalFile | None = None  # the batch's ids file
    starts: np.ndarray | None = None  # where each document starts in `ids_file`

    @classmethod
    def of(cls, file_key, split, offsets, digests, lengths, ids: np.ndarray) -> "DedupPart":
        ids = np.ascontiguousarray(ids)
        return cls(file_key, split, offsets, digests, lengths, _SHUFFLE_CODEC.encode(ids), ids.dtype.name)

    @classmethod
    def in_file(cls, file_key, split, offsets, digests, lengths, ids_file: LocalFile, ids: np.ndarray,
                starts: np.ndarray) -> "DedupPart":
        """A part whose documents are at `starts` of the local file `ids_file`, which holds `ids`."""
        return cls(file_key, split, offsets, digests, lengths, b"", ids.dtype.name, ids_file, starts)

    def documents(self, members: np.ndarray) -> np.ndarray:
        """The ids of documents `members` of the part, concatenated in that order."""
        if self.ids_file is not None:
            return take_documents(mapped(self.ids_file, self.ids_dtype, kind="staged file"),
                                  self.starts[members], self.lengths[members])
        ids = np.frombuffer(_SHUFFLE_CODEC.decode(self.packed_ids), dtype=self.ids_dtype)
        return take_documents(ids, (np.cumsum(self.lengths) - self.lengths)[members], self.lengths[members])


@dataclass
class DistinctBatch:
    """Distinct texts (--dedup exact): one copy of each, with its split already decided."""

    digests: np.ndarray  # (n, 2) uint64 content digests, all different
    splits: np.ndarray  # int8: 0 train, 1 validation
    sources: np.ndarray  # int64 mixture source of the kept copy (0 without a mixture)
    lengths: np.ndarray  # int64
    ids: np.ndarray  # narrowest_ids


for _record in (DedupPart, DistinctBatch):
    beam.coders.registry.register_coder(_record, RecordCoder)


# ---------------------------------------------------------------------------------------------
# --dedup near (transforms/tokenize/near_dedup.py): the near-duplicate graph's elements

@dataclass
class Nodes:
    """Distinct texts as nodes of the near-duplicate graph, in aligned arrays."""

    ids: np.ndarray  # uint64: dedup shard << 32 | row in the shard's node table (0 before it is made)
    digests: np.ndarray  # (n, 2) uint64 content digests
    ranks: np.ndarray  # uint64: the kept text of a cluster has the smallest (near_dedup.rank_of)
    votes: np.ndarray  # int8: the split its copies ask for (near_dedup.TRAIN, AUTO, VALIDATION)
    signatures: np.ndarray  # (n, K) uint16 MinHash signatures

    def take(self, index) -> "Nodes":
        return Nodes(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concatenate(parts: list["Nodes"]) -> "Nodes":
        return Nodes(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Nodes)))


@dataclass
class NodePart:
    """The signed documents of one TokenizedBatch that fall into one dedup shard (--dedup near):
    what their nodes are made of. Their signatures are in memory, or (local runs) rows of a
    file holding the batch's signatures, which the in-process runner then does not hold:
    512 bytes a document, for every copy of every text, until the copies are merged."""

    digests: np.ndarray  # (n, 2) uint64
    ranks: np.ndarray  # uint64
    votes: np.ndarray  # int8
    signatures: np.ndarray | None = None  # (n, K) uint16
    signature_file: LocalFile | None = None  # a file of uint16 signatures, K a row ...
    rows: np.ndarray | None = None  # ... whose rows these documents' are
    hashes: int = 0  # K

    def signatures_of(self, members: np.ndarray) -> np.ndarray:
        """The signatures of documents `members` of the part."""
        if self.signature_file is None:
            return self.signatures[members]
        return signature_rows(self.signature_file, self.hashes, self.rows[members])


@dataclass
class BandPart:
    """Band hashes of nodes (one entry per node and band) that fall into one band shard. When
    a node has several entries in the part (few band shards: a local run's), its entries are
    together and its id and order key are held once, with their count; else (a node's bands
    spread over many shards) once per entry, `counts` None. (With both per entry, 24 bytes,
    the parts of 107k short documents in 4 shards were 80 MB, encoded, grouped and decoded
    by the runner.)"""

    hashes: np.ndarray | None  # uint64, one per entry; None when they are in `hashes_file`
    nodes: np.ndarray  # uint64 node ids, one per node (or per entry)
    order_keys: np.ndarray  # uint64: the first half of each node's content digest, likewise
    counts: np.ndarray | None  # uint16: each node's entries, which come in that order; None: one each
    hashes_file: LocalFile | None = None  # local runs: a file of the hashes (8 bytes an entry), in the spill directory

    @classmethod
    def of(cls, hashes: np.ndarray, nodes: np.ndarray, order_keys: np.ndarray) -> "BandPart":
        """The part of entries (hashes, nodes, order_keys: one each per entry), whose entries
        of one node are together."""
        starts = np.flatnonzero(np.concatenate([[True], nodes[1:] != nodes[:-1]])) if nodes.size else np.empty(0, int)
        if np.unique(nodes[starts]).size != starts.size:
            raise ValueError("a band part's entries of one node are not together")
        if starts.size * 18 >= nodes.size * 16:  # a node's id, key and count cost more than its entries' ids and keys
            return cls(hashes, nodes, order_keys, None)
        return cls(hashes, nodes[starts], order_keys[starts], np.diff(np.append(starts, nodes.size)).astype(np.uint16))

    @property
    def entries(self) -> int:
        return self.nodes.size if self.counts is None else int(self.counts.sum(dtype=np.int64))

    def band_hashes(self) -> np.ndarray:
        if self.hashes_file is None:
            return self.hashes
        return mapped(self.hashes_file, "uint64", self.entries, kind="band hashes file")

    def entry_nodes(self) -> np.ndarray:
        return self.nodes if self.counts is None else np.repeat(self.nodes, self.counts)

    def entry_order_keys(self) -> np.ndarray:
        return self.order_keys if self.counts is None else np.repeat(self.order_keys, self.counts)


@dataclass
class Edges:
    """Pairs of nodes (a, b), each with what a step of the graph carries along: `nodes`, the
    node at one end of each pair (which end: `b_side`), or nothing."""

    a: np.ndarray  # uint64
    b: np.ndarray  # uint64
    b_side: np.ndarray | None = None  # bool: `nodes` is the pair's b
    nodes: Nodes | None = None


@dataclass
class VerifiedPairs:
    """Linked candidate pairs (a, b), a < b, of one pair bucket (local runs, whose pairs all meet
    on one worker: near_dedup.decide_at_once), and which of them are near-copies."""

    a: np.ndarray  # uint64
    b: np.ndarray  # uint64
    near: np.ndarray  # bool


@dataclass
class NearDecisions:
    """What --dedup near decided for texts of one dedup shard: each is removed (a near-copy of
    the kept text of its cluster) or kept, in the split of its whole cluster."""

    digests: np.ndarray  # (n, 2) uint64
    removed: np.ndarray  # bool
    splits: np.ndarray  # int8 split of the cluster (0 train, 1 validation)
    kept: np.ndarray  # (n, 2) uint64: the digest of the text kept for each (its own, when it is kept)
    similarity: np.ndarray  # float32: their estimated Jaccard similarity (1 when it is kept)


for _record in (Nodes, NodePart, BandPart, Edges, VerifiedPairs, NearDecisions):
    beam.coders.registry.register_coder(_record, RecordCoder)
