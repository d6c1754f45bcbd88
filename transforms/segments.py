"""Flat arrays of concatenated documents: copying some of their documents out, in order, and
grouping elements by key.

Token ids travel as one flat array per batch, part or shard, each document's length beside
it. Taking documents out of such an array is the shuffle's main copy, so it has two ways:
long documents are sliced out one by one; many short ones are gathered with a per-token
index, built in blocks so that the index (8 bytes per token, three times over) stays
bounded.
"""
import numpy as np

SLICE_WHEN_AVERAGE_LENGTH = 64
GATHER_BLOCK_TOKENS = 1 << 22


def take_documents(ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                   block_tokens: int = GATHER_BLOCK_TOKENS) -> np.ndarray:
    """The documents of `ids` at `starts`, `lengths` long, concatenated in the order given."""
    total = int(lengths.sum())
    if total == 0:
        return ids[:0].copy()
    if total >= SLICE_WHEN_AVERAGE_LENGTH * lengths.size:
        return np.concatenate([ids[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist())])
    # Output position j reads ids[start of its document + j - output start of its document].
    out = np.empty(total, dtype=ids.dtype)
    out_starts = np.cumsum(lengths) - lengths
    step = max(1, block_tokens * lengths.size // total)
    for lo in range(0, lengths.size, step):
        hi = min(lo + step, lengths.size)
        n = lengths[lo:hi]
        a, b = int(out_starts[lo]), int(out_starts[hi - 1] + n[-1])
        shift = np.repeat(starts[lo:hi] - out_starts[lo:hi], n)
        out[a:b] = ids[np.arange(a, b, dtype=np.int64) + shift]
    return out


def gather_segments(tokens: np.ndarray, lengths: np.ndarray, order: np.ndarray,
                    block_tokens: int = GATHER_BLOCK_TOKENS) -> np.ndarray:
    """The documents of a flat token array (`lengths` of them, end to end), concatenated
    in `order`."""
    starts = np.cumsum(lengths) - lengths
    return take_documents(tokens, starts[order], lengths[order], block_tokens)


def groups_of(keys: np.ndarray):
    """(key, indices of its elements) for each distinct value of `keys`, in increasing order
    of key; the indices of one key in their original order."""
    small = keys.size and keys.dtype.kind in "iu" and keys.min() >= 0 and keys.max() <= 0xFFFF
    # Shard numbers fit 16 bits: numpy sorts those stably by radix, 5x its stable sort of int64.
    order = np.argsort(keys.astype(np.uint16) if small else keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for members in np.split(order, bounds):
        if members.size:
            yield keys[members[0]], members
