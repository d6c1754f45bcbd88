"""The elements that flow between stages: batches of documents, never single documents.

Batching keeps Beam's per-element cost (pickling, a GroupByKey entry) off every document,
and numpy arrays pickle as flat buffers.
"""
from dataclasses import dataclass, field

import numcodecs
import numpy as np


@dataclass
class DocumentBatch:
    """Documents read from one range of one file, in file order."""

    file_key: str  # InputFile.key: the stable identity the shuffle hashes
    split: str  # "train", "validation" or "auto"
    offsets: np.ndarray  # uint64 byte offset of each document's line
    texts: list[str]


@dataclass
class TokenizedBatch:
    """Non-empty documents of a DocumentBatch, tokenized and encoded with start bits."""

    file_key: str
    split: str
    offsets: np.ndarray  # uint64, one per non-empty document
    lengths: np.ndarray  # int64 token count of each document
    tokens: np.ndarray  # uint32 encoded tokens (2*id + start bit), documents concatenated
    empty: int  # documents that tokenized to nothing (dropped)


# Token arrays cross the shuffle compressed: Blosc lz4 with bit-shuffle halves the bytes
# that are pickled, held by the runner and (on Dataflow) paid for as shuffle volume, at
# ~1 GB/s. Single-threaded, so the same tokens always give the same bytes.
_SHUFFLE_CODEC = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.BITSHUFFLE)
numcodecs.blosc.use_threads = False


@dataclass
class ShardPart:
    """The documents of one batch that fall into one (split, shard) of the global shuffle."""

    order_hashes: np.ndarray  # uint64
    salts: np.ndarray  # uint64 order salt of each document's file (a tie-breaker)
    offsets: np.ndarray  # uint64
    lengths: np.ndarray  # int64
    packed_tokens: bytes  # uint32 encoded tokens, compressed for the shuffle
    max_token_id: int  # measured when packed, so sizing a part needs no decompression

    @staticmethod
    def pack(tokens: np.ndarray) -> bytes:
        return _SHUFFLE_CODEC.encode(np.ascontiguousarray(tokens, dtype=np.uint32))

    def tokens(self) -> np.ndarray:
        return np.frombuffer(_SHUFFLE_CODEC.decode(self.packed_tokens), dtype=np.uint32)


@dataclass
class SortedShard:
    """All documents of one shard, in their final order."""

    split: str
    shard: int
    lengths: np.ndarray  # int64 token count of each sequence
    tokens: np.ndarray  # uint32 encoded tokens


@dataclass
class ShardSize:
    """What a ShardPart adds to its shard: enough to lay the shards out before writing."""

    split: str
    shard: int
    tokens: int
    sequences: int
    max_token_id: int = field(default=-1)
