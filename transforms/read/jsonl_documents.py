"""ReadJsonlDocuments: byte ranges of JSONL files -> batches of documents, plus an account
of every line that is not a document (blank lines counted, rejected lines reported)."""
from collections import Counter
from dataclasses import dataclass

import apache_beam as beam

from transforms.read import jsonl
from transforms.read.document_batches import ReadIntoBatchesFn
from transforms.read.inputs import COMPRESSED_DATA_ERRORS, InputError, ReadRange, corrupt_input_message, open_input
from transforms.records import DocumentBatch

REJECTED = "rejected"
LINE_COUNTS = "line_counts"
COUNTS = "counts"
# Lines without --text_key whose keys each range reports (for the failure message's hint).
CENSUS_LINES_PER_RANGE = 16
# Bytes read between two progress updates, whether or not a batch is complete (ProgressFile
# throttles what reaches the disk).
PROGRESS_BYTES = 1 << 20


@dataclass
class Peek:
    """The first lines of the input, looked at before the run."""
    texts: list[str]  # the first documents, in file order (for the tokenizer guard)
    files: list[str]  # the files those lines came from
    lacking: jsonl.KeyCensus  # the keys of the objects that lack --text_key


def peek_input(files, count: int, text_key: str, storage_options: dict | None = None,
               peek: Peek | None = None) -> Peek:
    """Reads the input's first lines, in file order, until `count` documents, or `count`
    non-blank lines that are not documents (so a wrong --text_key does not read it all).
    Adds to `peek` when given (the first files may have been of another format)."""
    peek = peek or Peek([], [], jsonl.KeyCensus())
    others = 0
    for f in files:
        peek.files.append(f.url)
        reached = lines = 0
        try:
            with open_input(f, storage_options) as fh:
                for offset, raw in jsonl.iter_lines(fh):
                    reached, lines = offset + len(raw) + 1, lines + 1
                    text, reason = jsonl.parse_line(raw, f.text_key or text_key)
                    if text is not None:
                        peek.texts.append(text)
                    elif reason is not None:
                        others += 1
                        if reason == jsonl.MISSING_TEXT_KEY:
                            peek.lacking.add(jsonl.load_object(raw))
                    if len(peek.texts) >= count or others >= count:
                        return peek
        except COMPRESSED_DATA_ERRORS as e:
            if not f.compression:
                raise
            raise InputError(corrupt_input_message(f, reached, lines, e)) from None
    return peek


def check_text_key(peek: Peek, text_key: str) -> None:
    """Raises InputError when none of the first JSON objects has --text_key: the run would
    reject every line as missing_text_key. The message names the keys they do have."""
    if peek.texts or not peek.lacking.objects:
        return
    where = peek.files[0] + (f" and {len(peek.files) - 1} more file(s)" if len(peek.files) > 1 else "")
    raise InputError(f"--text_key {text_key}: none of the first {peek.lacking.objects} JSON objects of the input "
                     f"({where}) has this key; their keys: {peek.lacking.describe()}")


class CorruptInput(RuntimeError):
    """A compressed input file ends early or is corrupt; the message names it."""


class ReadRangeFn(ReadIntoBatchesFn):
    """Reads one ReadRange. Main output: DocumentBatch. Tagged outputs:
    `rejected` (one dict per rejected line), `line_counts` ((file key, range start, lines))
    so rejected lines get 1-based line numbers later, and `counts` (a Counter per range)."""

    def __init__(self, text_key: str, batch_bytes: int, batch_documents: int, storage_options: dict | None,
                 progress_dir: str | None = None):
        super().__init__(batch_bytes, batch_documents, storage_options, progress_dir)
        self._text_key = text_key

    def process(self, rng: ReadRange):
        counts = Counter()
        lacking = jsonl.KeyCensus()
        batcher = self.batcher(rng.file)
        unreported_bytes = 0

        def batch():
            nonlocal unreported_bytes
            counts["documents"] += len(batcher)
            self._progress.add(documents=len(batcher), bytes=unreported_bytes)
            unreported_bytes = 0
            return batcher.take()

        text_key = rng.file.text_key or self._text_key
        reached = rng.start  # the uncompressed offset after the last whole line: named if the file breaks
        try:
            with open_input(rng.file, self._storage_options, self.stored_bytes()) as f:
                for offset, raw in jsonl.iter_lines(f, rng.start, rng.stop):
                    counts["lines"] += 1
                    reached = offset + len(raw) + 1
                    unreported_bytes += len(raw) + 1
                    if unreported_bytes >= PROGRESS_BYTES:
                        self._progress.add(bytes=unreported_bytes)
                        unreported_bytes = 0
                    text, reason = jsonl.parse_line(raw, text_key)
                    if text is not None:
                        if batcher.add(offset, text):
                            yield batch()
                    elif reason is None:
                        counts["blank"] += 1
                    else:
                        counts["rejected"] += 1
                        counts["rejected:" + reason] += 1
                        if reason == jsonl.MISSING_TEXT_KEY and lacking.objects < CENSUS_LINES_PER_RANGE:
                            lacking.add(jsonl.load_object(raw))
                        yield beam.pvalue.TaggedOutput(REJECTED, {
                            "file": rng.file.url, "file_key": rng.file.key, "range_start": rng.start,
                            "line_in_range": counts["lines"], "offset": offset, "reason": reason,
                            "excerpt": jsonl.excerpt(raw),
                        })
        except COMPRESSED_DATA_ERRORS as e:
            if not rng.file.compression:
                raise
            raise CorruptInput(corrupt_input_message(rng.file, reached, counts["lines"], e)) from None
        if batcher:
            yield batch()
        self._progress.add(bytes=unreported_bytes)
        self._progress.flush()  # a finished range shows in full now, not when the workers stop
        yield beam.pvalue.TaggedOutput(LINE_COUNTS, (rng.file.key, rng.start, counts["lines"]))
        yield beam.pvalue.TaggedOutput(COUNTS, counts + lacking.to_counts())


class ReadJsonlDocuments(beam.PTransform):
    """Reads byte ranges of JSONL files in parallel into DocumentBatches.

    The result is a DoOutputsTuple: the main output, and the `rejected`, `line_counts` and
    `counts` tagged outputs described on ReadRangeFn."""

    def __init__(self, ranges: list[ReadRange], text_key: str, batch_bytes: int = 1 << 23,
                 batch_documents: int = 8192, storage_options: dict | None = None, progress_dir: str | None = None,
                 wrap=None):
        super().__init__()
        self._ranges = ranges
        fn = ReadRangeFn(text_key, batch_bytes, batch_documents, storage_options, progress_dir)
        self._fn = wrap(fn) if wrap else fn  # wrap: e.g. staged_reads.StagedReader

    def expand(self, pbegin):
        return (
            pbegin
            # Create reshuffles its elements, so ranges spread over workers.
            | "ListRanges" >> beam.Create(self._ranges)
            | "ReadRanges" >> beam.ParDo(self._fn).with_output_types(DocumentBatch)
            .with_outputs(REJECTED, LINE_COUNTS, COUNTS, main="documents")
        )
