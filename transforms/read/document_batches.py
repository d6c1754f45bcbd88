"""Gathering the documents of one input unit (a JSONL byte range, a Parquet row group)
into DocumentBatches: what both readers do between parsing a document and emitting it."""
import apache_beam as beam
import numpy as np

from transforms.progress import ProgressFile
from transforms.read.inputs import StoredBytes
from transforms.records import DocumentBatch


class DocumentBatcher:
    """Collects the documents of one input file into DocumentBatches of at most
    `batch_bytes` characters of text or `batch_documents` documents, whichever comes first.

    A document's `place` is what the shuffle keys it by: its byte offset in a JSONL file,
    its row index in a Parquet file."""

    def __init__(self, file_key: str, split: str, batch_bytes: int, batch_documents: int):
        self._file_key = file_key
        self._split = split
        self._batch_bytes = batch_bytes
        self._batch_documents = batch_documents
        self._places: list[int] = []
        self._texts: list[str] = []
        self._text_bytes = 0

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, place: int, text: str) -> bool:
        """Adds one document; True when the batch is full and should be taken."""
        self._places.append(place)
        self._texts.append(text)
        self._text_bytes += len(text)
        return self._text_bytes >= self._batch_bytes or len(self._texts) >= self._batch_documents

    def take(self) -> DocumentBatch:
        """The documents added since the last take, as one batch; the batcher starts afresh."""
        batch = DocumentBatch(self._file_key, self._split, np.array(self._places, dtype=np.uint64), self._texts)
        self._places, self._texts, self._text_bytes = [], [], 0
        return batch


class ReadIntoBatchesFn(beam.DoFn):
    """What the readers' DoFns share: the batch limits, the storage options, and a progress
    file opened in setup() and flushed in teardown()."""

    def __init__(self, batch_bytes: int, batch_documents: int, storage_options: dict | None,
                 progress_dir: str | None = None):
        self._batch_bytes = batch_bytes
        self._batch_documents = batch_documents
        self._storage_options = storage_options
        self._progress_dir = progress_dir
        self._progress = None

    def setup(self):
        self._progress = ProgressFile(self._progress_dir)

    def teardown(self):
        if self._progress:
            self._progress.flush()

    # Set by a wrapper that keeps each unit's stored bytes (transforms/read/staged_reads.py).
    record_stored = False
    last_stored = None  # the StoredBytes of the unit read last, when recorded

    def stored_bytes(self):
        """A StoredBytes for the unit about to be read (None unless recording)."""
        self.last_stored = StoredBytes() if self.record_stored else None
        return self.last_stored

    def batcher(self, file) -> DocumentBatcher:
        """A batcher for the documents of one input unit of `file` (an InputFile)."""
        return DocumentBatcher(file.key, file.split, self._batch_bytes, self._batch_documents)
