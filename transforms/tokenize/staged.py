"""Tokenized batches kept in the staging area (transforms/staging.py), and replayed from it.

TokenizeAndStage tokenizes as TokenizeBatches does and stages every batch: its ids at once
(locally that file is also the shuffle's spill file, so staging costs the shuffle nothing),
its documents once the tokenizer guard has compared the batch's sample with the reference.
A batch whose comparison failed is never staged whole, so a rerun cannot reuse it.

ReplayStagedUnits emits, for each unit an earlier attempt of the job staged whole, what
reading and tokenizing it gave: its TokenizedBatches, and the reader's rejected lines, line
count and counts. Downstream nothing can tell the two apart: they are the same values.
Every staged file is checked against the checksum written with it as it is replayed (the
launcher checked them all before it chose to reuse the unit: pipeline/resume.py); one damaged
since then fails the run, naming the file, and the rerun redoes that unit.
"""
from collections import Counter, deque

import apache_beam as beam
import numpy as np

from flat_tokens.format.checksums import Damaged
from transforms.local_files import LocalFile
from transforms.progress import ProgressFile
from transforms.read.jsonl_documents import COUNTS, LINE_COUNTS, REJECTED
from transforms.records import TokenizedBatch
from transforms.tokenize.tokenizer import TokenizeBatches
from transforms.write_behind import WriteBehind


class TokenizeAndStage(TokenizeBatches):
    """DocumentBatch -> TokenizedBatch, staged under the unit the batch was read from.

    A sampled batch's documents are staged once its comparison has finished and passed; the
    comparisons run one at a time on the guard's thread (TokenizeBatches), so at most the
    batches since the last sampled one wait, in order.

    A batch's ids (and, locally, its near signatures) are written on a thread while the next
    batch is read and tokenized (transforms/write_behind.py); the batch goes on at once,
    naming the files, and its documents are staged only once the writes have landed."""

    def __init__(self, info, area, storage_options: dict | None = None, progress_dir: str | None = None,
                 digests: bool = False, near=None, memo_dir: str | None = None):
        super().__init__(info, storage_options, progress_dir, digests, near, memo_dir)
        self._area = area  # transforms.staging.StagingArea
        # (unit, place, the batch's documents, its ids' write, its comparison or None): documents not staged yet
        self._unchecked = deque()
        self._writer = None

    def setup(self):
        super().setup()
        self._writer = WriteBehind("flat-tokens-stage")

    def start_bundle(self):
        super().start_bundle()
        self._unchecked = deque()  # a failed bundle's batches are not this bundle's
        self._writer.forget()

    def process(self, batch):
        place = int(batch.offsets[0])  # a batch's name: tokenizing may drop its first (empty) document
        unit = self._area.unit_of(batch.file_key, place)
        before = self._checking
        for tokenized in super().process(batch):
            own = self._checking if self._checking is not before else None  # a new comparison: this batch's
            written = self._writer.submit(self._area.put_batch_ids, unit, place, tokenized.ids)
            if self._area.local:  # the shuffle maps this file, checked against the Sum of these ids
                tokenized.ids_file = LocalFile.of(self._area.batch_ids_path(unit, place), tokenized.ids)
            signed = None
            if tokenized.signatures is not None and self._area.local:  # near dedup's node parts name this file
                signed = self._writer.submit(self._area.put_batch_signatures, unit, place, tokenized.signatures)
                tokenized.signatures_file = LocalFile.of(self._area.batch_signatures_path(unit, place),
                                                         np.ascontiguousarray(tokenized.signatures, dtype=np.uint16))
            documents = self._area.batch_documents(tokenized, signatures_beside=signed is not None)
            self._unchecked.append((unit, place, documents, written, signed, own))
            self._stage_checked()
            yield tokenized

    def finish_bundle(self):
        super().finish_bundle()  # waits for the last comparison, raising any difference
        self._stage_checked(wait=True)

    def teardown(self):
        if self._writer:
            self._writer.close()
        super().teardown()

    def _stage_checked(self, wait: bool = False):
        """Stages the documents of the waiting batches, in order, once their ids have landed and
        their comparisons have passed (a failed write or a difference raises here: that batch
        is never staged whole)."""
        while self._unchecked:
            unit, place, documents, written, signed, comparison = self._unchecked[0]
            for pending in (written, signed, comparison):
                if pending is not None:
                    if not (wait or pending.done()):
                        return
                    pending.result()
            # The Sums of the ids and signatures (what landed) are sealed into the `.batch`: a rerun checks them all.
            self._area.put_batch(unit, place, documents, written.result(), signed.result() if signed else None)
            self._unchecked.popleft()


class ReplayUnitFn(beam.DoFn):
    """(unit key, account name, text bytes) -> the unit's staged TokenizedBatches (main output)
    and its reader's tagged outputs."""

    def __init__(self, area, progress_dir: str | None = None):
        self._area = area
        self._progress_dir = progress_dir
        self._progress = None

    def setup(self):
        self._progress = ProgressFile(self._progress_dir)

    def process(self, staged):
        unit, name, text_bytes = staged
        try:
            account = self._area.read_unit(unit, name)
        except (FileNotFoundError, Damaged) as e:
            raise _changed(self._area, unit, e) from None
        for place in account["places"]:
            try:
                batch = self._area.read_batch(unit, place)
            except (FileNotFoundError, Damaged) as e:
                raise _changed(self._area, unit, e) from None
            self._progress.add(tokens=int(batch.ids.size))
            yield batch
        for record in account["rejected"]:
            yield beam.pvalue.TaggedOutput(REJECTED, record)
        if account["line_counts"] is not None:
            yield beam.pvalue.TaggedOutput(LINE_COUNTS, tuple(account["line_counts"]))
        counts = Counter(account["counts"])
        self._progress.add(documents=counts["documents"], bytes=text_bytes)
        self._progress.flush()
        yield beam.pvalue.TaggedOutput(COUNTS, counts)

    def teardown(self):
        if self._progress:
            self._progress.flush()


def _changed(area, unit: str, e: Exception) -> RuntimeError:
    """The error of a staged unit gone or damaged since the launcher checked it."""
    what = f"{e.filename or e} is gone" if isinstance(e, FileNotFoundError) else str(e)
    return RuntimeError(f"staged unit {area.path('units', unit)}: {what}: the staging area changed after the run "
                        f"was launched; rerun the same command: it reads and tokenizes this unit again")


class ReplayStagedUnits(beam.PTransform):
    """Units staged whole -> a DoOutputsTuple: `batches` (TokenizedBatch) and the reader's tags
    `rejected`, `line_counts` and `counts`.

    `units`: (unit key, account name, text bytes) of each unit to replay (pipeline/resume.py)."""

    def __init__(self, area, units: list[tuple[str, str, int]], progress_dir: str | None = None):
        super().__init__()
        self._area = area
        self._units = units
        self._progress_dir = progress_dir

    def expand(self, pbegin):
        return (
            pbegin
            | "ListStagedUnits" >> beam.Create(self._units)
            | "ReplayUnits" >> beam.ParDo(ReplayUnitFn(self._area, self._progress_dir))
            .with_output_types(TokenizedBatch).with_outputs(REJECTED, LINE_COUNTS, COUNTS, main="batches")
        )
