"""StagedReader: a reader's DoFn whose every finished input unit leaves its account in the
staging area (transforms/staging.py), so that a rerun can replay the unit instead of reading
and tokenizing it again.

The account is what the reader emitted besides documents: its counts, its line count (JSONL)
and its rejected lines, with the place of each batch it emitted, and the stored bytes it was
read from (their spans and digest: inputs.StoredBytes), which a rerun reads again before it
trusts the unit (pipeline/resume.py). It is written after the
unit's last output, and names the batches it expects; the tokenize step stages those
(transforms/tokenize/staged.py). A unit is reused only when its account and every batch it
names are staged, so the account may land before or after its batches, whichever way the
runner fused the steps.
"""
import apache_beam as beam

from transforms.read.jsonl_documents import COUNTS, LINE_COUNTS, REJECTED
from transforms.records import DocumentBatch


class StagedReader(beam.DoFn):
    """Wraps a reader's DoFn (ReadRangeFn, ReadRowGroupFn): same outputs, and each unit's
    account staged once the unit was read whole."""

    def __init__(self, reader: beam.DoFn, area):
        self._reader = reader
        self._area = area  # transforms.staging.StagingArea

    def setup(self):
        self._reader.setup()
        self._reader.record_stored = True  # each unit's stored bytes: a rerun checks them

    def start_bundle(self):
        self._reader.start_bundle()

    def process(self, unit):
        account = {"places": [], "counts": {}, "line_counts": None, "rejected": []}
        for out in self._reader.process(unit):
            if isinstance(out, DocumentBatch):
                account["places"].append(int(out.offsets[0]))
            elif out.tag == REJECTED:
                account["rejected"].append(out.value)
            elif out.tag == LINE_COUNTS:
                account["line_counts"] = list(out.value)
            elif out.tag == COUNTS:
                account["counts"] = dict(out.value)
            yield out
        stored = self._reader.last_stored
        account["stored"] = stored.describe() if stored is not None else None
        self._area.put_unit(self._area.unit_of(unit.file.key, unit_start(unit)), account)

    def finish_bundle(self):
        self._reader.finish_bundle()

    def teardown(self):
        self._reader.teardown()


def unit_start(unit) -> int:
    """The first place a unit covers: a byte range's start, a row group's first row."""
    return unit.first_row if hasattr(unit, "first_row") else unit.start
