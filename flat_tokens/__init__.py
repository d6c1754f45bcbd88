"""flat_tokens: reading flat-tokens datasets in a trainer, without Beam.

    from flat_tokens import open_dataset, Blend

The package holds the trainer's side of flat-tokens-beam (docs/design.md has the map):
`flat_tokens.format` (what a dataset is: its layout, checksums, manifest and records, shared
with the pipeline that writes it), the reader and its guards, Blend, the data-loader
adapters, the Megatron layout, and the tools (`flat_tokens.tools`: verify, inspect, report).
The names below are imported on first use, so `import flat_tokens.format` costs nothing more.
"""
import importlib

__version__ = "0.1.0"
VERSION = f"flat-tokens-beam {__version__}"  # what --version prints

_PUBLIC = {  # name -> the module that defines it
    "open_dataset": "flat_tokens.reader", "FlatTokensSplit": "flat_tokens.reader",
    "DatasetError": "flat_tokens.reader", "CorruptChunk": "flat_tokens.reader",
    "Blend": "flat_tokens.blend",
    "PackedBatchStream": "flat_tokens.loaders", "SequenceSource": "flat_tokens.loaders",
    "StorageUnavailable": "flat_tokens.format.storage_faults",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'flat_tokens' has no attribute {name!r}")
