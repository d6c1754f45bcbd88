"""ReadParquetDocuments: row groups of Parquet files -> batches of documents, plus an account
of every row that is not a document (rejected rows reported with file, row group and row).

Its outputs have the same tags and meanings as ReadJsonlDocuments', so the two are
flattened into one corpus: a row counts as a line, and a Parquet file has no blank lines.
"""
from collections import Counter

import apache_beam as beam

from transforms.read import parquet
from transforms.read.document_batches import ReadIntoBatchesFn
from transforms.read.jsonl_documents import COUNTS, LINE_COUNTS, REJECTED
from transforms.read.parquet import RowGroup, open_parquet
from transforms.records import DocumentBatch


class ReadRowGroupFn(ReadIntoBatchesFn):
    """Reads one RowGroup. Main output: DocumentBatch (offsets are row indices in the file).
    Tagged outputs: `rejected` (one dict per rejected row) and `counts` (a Counter per
    group). Nothing goes to `line_counts`: a row's index is known without the other groups."""

    def process(self, group: RowGroup):
        counts = Counter()
        batcher = self.batcher(group.file)
        reported_bytes = 0

        def report_progress(documents: int):
            # In the group's uncompressed text bytes, in proportion to the rows read.
            nonlocal reported_bytes
            read_bytes = group.text_bytes * counts["lines"] // max(group.num_rows, 1)
            self._progress.add(documents=documents, bytes=read_bytes - reported_bytes)
            reported_bytes = read_bytes

        def batch():
            counts["documents"] += len(batcher)
            report_progress(len(batcher))
            return batcher.take()

        if not group.num_rows:  # the unit of a file without rows: only its counts
            self.stored_bytes()
            yield beam.pvalue.TaggedOutput(COUNTS, counts)
            return
        with open_parquet(group.file, self._storage_options, self.stored_bytes()) as pf:
            for row, value in parquet.iter_rows(pf, group):
                counts["lines"] += 1
                text, reason = parquet.text_of(value)
                if text is not None:
                    if batcher.add(row, text):
                        yield batch()
                else:
                    counts["rejected"] += 1
                    counts["rejected:" + reason] += 1
                    yield beam.pvalue.TaggedOutput(REJECTED, {
                        "file": group.file.url, "file_key": group.file.key, "range_start": group.index,
                        "row_group": group.index, "row": row, "row_in_group": row - group.first_row,
                        "offset": row, "reason": reason, "excerpt": parquet.excerpt(value),
                    })
        if batcher:
            yield batch()
        report_progress(0)
        yield beam.pvalue.TaggedOutput(COUNTS, counts)


class ReadParquetDocuments(beam.PTransform):
    """Reads row groups of Parquet files in parallel into DocumentBatches.

    The result is a DoOutputsTuple with ReadJsonlDocuments' tags: the main output
    (`documents`), `rejected`, `line_counts` (always empty) and `counts`."""

    def __init__(self, row_groups: list[RowGroup], batch_bytes: int = 1 << 23, batch_documents: int = 8192,
                 storage_options: dict | None = None, progress_dir: str | None = None, wrap=None):
        super().__init__()
        self._row_groups = row_groups
        fn = ReadRowGroupFn(batch_bytes, batch_documents, storage_options, progress_dir)
        self._fn = wrap(fn) if wrap else fn  # wrap: e.g. staged_reads.StagedReader

    def expand(self, pbegin):
        return (
            pbegin
            # Create reshuffles its elements, so row groups spread over workers.
            | "ListRowGroups" >> beam.Create(self._row_groups)
            | "ReadRowGroups" >> beam.ParDo(self._fn).with_output_types(DocumentBatch)
            .with_outputs(REJECTED, LINE_COUNTS, COUNTS, main="documents")
        )
