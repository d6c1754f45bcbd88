"""Shuffle: tokenized batches -> shards of documents in their final order, and each shard's
size before the shards are grouped (so the layout is ready when they are).

Keeps: determinism. Every document's split, shard and place (and a mixture's copies) are
seeded hashes of its place or content, so the order is the same on any runner, with any
number of workers or bundles.
"""
from transforms import stage_exports

__getattr__, __all__ = stage_exports(__name__, {
    "WeighSources": "weigh_sources",  # [weigh sources]
    "ShuffleGlobally": "shuffle_globally",  # shuffle it globally
})
