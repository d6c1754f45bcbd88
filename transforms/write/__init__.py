"""Write: shard sizes -> the layout; sorted shards -> the flat-tokens arrays of one zarr group,
beside the rejected-lines report; then the commit, last.

Keeps: one owner per chunk (a writer writes only whole chunks it owns; shared chunks are
merged and written once), idempotent writes (Beam may retry any bundle), nothing deleted
that this tool did not write, and no dataset published before every count adds up.
"""
from transforms import stage_exports

__getattr__, __all__ = stage_exports(__name__, {
    "LayOutShards": "layout",  # lay the shards out
    "CreateOutput": "create_output",  # create the output
    "WriteRejectedLines": "rejected",  # report rejected lines
    "CheckRejectedFraction": "rejected",  # check the rejected fraction
    "WriteFlatTokens": "chunk_writers",  # write the flat-tokens arrays
    "CommitDataset": "commit",  # commit the dataset
})
