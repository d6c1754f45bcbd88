"""--record_sources: which source each sequence was read from, carried through the shuffle
beside the documents so that the writer can store it per sequence, in output order.

A source is a mixture source (its index in the mixture file), or without a mixture an input
pattern (its index among --input, then --validation_input). With --dedup exact, a text's
source is that of the copy kept (transforms/tokenize/dedup.py). The ids are uint16, one
per sequence (`seq_sources` in each split; the names are the root attribute `sources`).
"""
import numpy as np

from transforms.read.inputs import input_index
from transforms.records import DistinctBatch

MAX_SOURCES = 1 << 16  # ids are uint16


def document_sources(batch, source_of_input: list[int]) -> np.ndarray:
    """The source id (uint16) of each document of a batch, in its order."""
    if isinstance(batch, DistinctBatch):  # the kept copy's source, decided by DropDuplicates
        return batch.sources.astype(np.uint16)
    return np.full(batch.offsets.shape, source_of_input[input_index(batch.file_key)], dtype=np.uint16)
