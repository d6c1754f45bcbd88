"""The records that flow between stages, and the coder Beam uses for them."""
import dataclasses

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from flat_tokens.format.checksums import Damaged
from pipeline.graph import build_pipeline
from pipeline.options import FlatTokensOptions
from pipeline.plan import plan_job
from tests.helpers import SAMPLE
from transforms.local_files import write_whole
from transforms.records import DocumentBatch, RecordCoder, ShardPart, SortedShard, TokenizedBatch

rng = np.random.default_rng(0)
RECORDS = [
    DocumentBatch("0:a.jsonl", "auto", np.arange(500, dtype=np.uint64), [f"{i} déjà vu 東京 " * 40 for i in range(500)]),
    TokenizedBatch("0:a.jsonl", "auto", np.arange(500, dtype=np.uint64), np.full(500, 200),
                   rng.integers(0, 50_000, 100_000).astype(np.uint16), 3),
    ShardPart.of(rng.integers(0, 2**63, 500, dtype=np.uint64), np.zeros(500, np.uint64),
                 np.arange(500, dtype=np.uint64), np.full(500, 200), rng.integers(0, 50_000, 100_000).astype(np.uint16)),
    SortedShard("train", 3, np.full(500, 200), rng.integers(0, 100_000, 100_000).astype(np.uint32)),
]


def test_a_batch_whose_ids_and_signatures_lie_in_files_crosses_stages_naming_them(tmp_path):
    """Staged locally, a batch's ids and near signatures lie in files: it crosses a runner's
    shuffle as their names (a few hundred bytes), and comes back as the same arrays."""
    ids, signatures = rng.integers(0, 50_000, 10_000).astype(np.uint16), rng.integers(0, 2**16, (50, 64)).astype(np.uint16)
    batch = TokenizedBatch("0:a.jsonl", "auto", np.arange(50, dtype=np.uint64), np.full(50, 200), ids, 0,
                           signatures=signatures, ids_file=write_whole(str(tmp_path / "ids"), ids),
                           signatures_file=write_whole(str(tmp_path / "signatures"), signatures))
    encoded = RecordCoder().encode(batch)
    back = RecordCoder().decode(encoded)
    whole = RecordCoder().encode(dataclasses.replace(batch, ids_file=None, signatures_file=None))
    assert len(encoded) < len(whole) / 10 and np.array_equal(back.ids, ids) and np.array_equal(back.signatures, signatures)
    # The names carry the Sums of what was written: a file changed since is refused, named.
    (tmp_path / "signatures").write_bytes(signatures[::-1].tobytes())
    with pytest.raises(Damaged, match=f"staged file {tmp_path / 'signatures'}: damaged: its CRC-32C"):
        RecordCoder().decode(encoded)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_round_trip_and_their_size_is_estimated_within_a_factor_of_two(record):
    coder = RecordCoder()
    encoded = coder.encode(record)
    back = coder.decode(encoded)
    if isinstance(record, ShardPart):  # ids cross the shuffle packed, and unpack to the same array
        assert back.raw_ids is None and back.packed_ids and record.raw_ids is not None
        assert np.array_equal(back.ids(), record.ids()) and back.ids().dtype == record.ids().dtype
    fields = {k: v for k, v in vars(record).items() if not (isinstance(record, ShardPart) and k.endswith("_ids"))}
    for name, value in fields.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(getattr(back, name), value) and getattr(back, name).dtype == value.dtype
        else:
            assert getattr(back, name) == value
    assert 0.5 <= coder.estimate_size(record) / len(encoded) <= 2


def test_every_record_pcollection_of_the_pipeline_uses_the_record_coder(tmp_path):
    """Without a type hint Beam falls back to pickling, and pickles sampled elements once
    more just to estimate their size."""
    options = PipelineOptions(["--input", f"{SAMPLE}/*.jsonl", "--tokenizer", "bytes",
                               "--output", str(tmp_path / "o.zarr")])
    p = beam.Pipeline(options=options)
    build_pipeline(p, plan_job(options.view_as(FlatTokensOptions)))
    found = {}

    class Visit(beam.pipeline.PipelineVisitor):
        def visit_value(self, value, producer):
            t = value.element_type
            record = t if t in (DocumentBatch, TokenizedBatch, SortedShard) else None
            if getattr(t, "tuple_types", None) and t.tuple_types[-1] is ShardPart:
                record = ShardPart
            if record:
                coder = beam.coders.registry.get_coder(t)
                found[record] = coder.value_coder() if record is ShardPart else coder

    p.visit(Visit())
    assert set(found) == {DocumentBatch, TokenizedBatch, ShardPart, SortedShard}
    assert all(isinstance(c, RecordCoder) for c in found.values()), found


def test_a_parts_keys_cross_the_runner_packed_and_come_back_the_same():
    """A part's per-document keys are most of what the in-process runner holds of the
    shuffle (several copies of the grouped parts): they cross byte-planed and LZ4'd, and
    unpack to the same values and types, empty parts and full 64-bit values included."""
    n = 20_000
    real = ShardPart.of(rng.integers(0, 2**64, n, dtype=np.uint64), np.full(n, 7, np.uint64),
                        np.cumsum(rng.integers(50, 20_000, n)).astype(np.uint64), rng.integers(1, 8_000, n),
                        np.zeros(10, np.uint16))
    digests = ShardPart.of(*(rng.integers(0, 2**64, n, dtype=np.uint64) for _ in range(3)), np.full(n, 3),
                           np.zeros(10, np.uint16))  # --dedup exact: offsets hold digest halves
    empty = ShardPart.of(*(np.empty(0, np.uint64) for _ in range(3)), np.empty(0, np.int64), np.empty(0, np.uint16))
    coder = RecordCoder()
    for part in (real, digests, empty):
        back = coder.decode(coder.encode(part))
        for name in ("order_hashes", "salts", "offsets", "lengths"):
            assert np.array_equal(getattr(back, name), getattr(part, name))
            assert getattr(back, name).dtype == getattr(part, name).dtype
    assert len(coder.encode(real)) < 16 * n  # 32 bytes a document as they are
