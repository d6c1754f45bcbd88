"""ReadCorpus: every input, whatever its format, -> one stream of document batches and one
account of the lines (JSONL) and rows (Parquet) that are not documents.

JSONL files are read by byte range (transforms.read.jsonl_documents), Parquet files by row group
(transforms.read.parquet_documents); each output of the two readers is flattened with its twin.
"""
import contextlib
import functools
from typing import NamedTuple

import apache_beam as beam

from transforms.read import jsonl, jsonl_documents, parquet
from transforms.read.inputs import PARQUET, ReadRange
from transforms.read.jsonl_documents import COUNTS, LINE_COUNTS, REJECTED, ReadJsonlDocuments
from transforms.read.parquet import RowGroup
from transforms.read.parquet_documents import ReadParquetDocuments
from transforms.read.staged_reads import StagedReader


class Corpus(NamedTuple):
    documents: beam.PCollection  # DocumentBatch
    rejected: beam.PCollection  # one dict per rejected line or row
    line_counts: beam.PCollection  # (file key, range start, lines) per JSONL range
    counts: beam.PCollection  # a Counter per range or row group


def peek_input(files, count: int, text_key: str, storage_options: dict | None = None) -> jsonl_documents.Peek:
    """The input's first documents, in file order, until `count` (for checks before the run),
    and the keys of the first JSON objects that lack the text key (jsonl_documents.check_text_key)."""
    peek = jsonl_documents.Peek([], [], jsonl.KeyCensus())
    for f in files:
        if len(peek.texts) >= count:
            break
        if f.format == PARQUET:
            peek.files.append(f.url)
            with contextlib.closing(parquet.iter_texts(f, f.text_key or text_key, storage_options)) as documents:
                for text in documents:
                    peek.texts.append(text)
                    if len(peek.texts) >= count:
                        break
        else:
            jsonl_documents.peek_input([f], count - len(peek.texts), text_key, storage_options, peek)
    return peek


class ReadCorpus(beam.PTransform):
    """Reads JSONL byte ranges and Parquet row groups in parallel into DocumentBatches. With a
    staging area (transforms/staging.py), each unit leaves its account there once read."""

    def __init__(self, ranges: list[ReadRange], row_groups: list[RowGroup], text_key: str,
                 batch_documents: int = 8192, storage_options: dict | None = None, progress_dir: str | None = None,
                 staging=None):
        super().__init__()
        self._wrap = functools.partial(StagedReader, area=staging) if staging is not None else None
        self._ranges = ranges
        self._row_groups = row_groups
        self._text_key = text_key
        self._batch_documents = batch_documents
        self._storage_options = storage_options
        self._progress_dir = progress_dir

    def expand(self, pbegin):
        readers = []
        if self._ranges or not self._row_groups:
            readers.append(pbegin | "ReadJsonl" >> ReadJsonlDocuments(
                self._ranges, self._text_key, batch_documents=self._batch_documents,
                storage_options=self._storage_options, progress_dir=self._progress_dir, wrap=self._wrap))
        if self._row_groups:
            readers.append(pbegin | "ReadParquet" >> ReadParquetDocuments(
                self._row_groups, batch_documents=self._batch_documents,
                storage_options=self._storage_options, progress_dir=self._progress_dir, wrap=self._wrap))
        tags = ("documents", REJECTED, LINE_COUNTS, COUNTS)  # "documents": the main output
        if len(readers) == 1:  # one format: no Flatten (four transforms the runner would build and run)
            return Corpus(*(readers[0][tag] for tag in tags))
        return Corpus(*(tuple(r[tag] for r in readers) | f"Flatten_{tag}" >> beam.Flatten() for tag in tags))
