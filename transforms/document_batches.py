"""Gathering the documents of one input unit (a JSONL byte range, a Parquet row group)
into DocumentBatches: what both readers do between parsing a document and emitting it."""
import numpy as np

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
