"""The elements that flow between stages: batches of documents, never single documents.

Batching keeps Beam's per-element cost (pickling, a GroupByKey entry) off every document,
and numpy arrays pickle as flat buffers.
"""
from dataclasses import dataclass, field

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


@dataclass
class ShardPart:
    """The documents of one batch that fall into one (split, shard) of the global shuffle."""

    order_hashes: np.ndarray  # uint64
    salts: np.ndarray  # uint64 order salt of each document's file (a tie-breaker)
    offsets: np.ndarray  # uint64
    lengths: np.ndarray  # int64
    tokens: np.ndarray  # uint32 encoded


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
