"""The DoFn lifecycle as Beam's SDK harness may drive it (docs/design.md, "DoFn lifecycle"):
an instance's teardown() followed by more bundles of the same instance, and teardown() called
on another thread while one of its bundles still runs (what the harness does when it shuts
down with bundles in flight). Every DoFn with a thread of its own is driven here directly;
tests/test_runners.py runs the whole pipeline on concurrent bundles."""
import os
import threading
import time

import numpy as np
import pytest

from transforms.progress import ProgressFile, read_totals
from transforms.records import DocumentBatch, TokenizedBatch
from transforms.shuffle import spill
from transforms.shuffle.shuffle_globally import KeyByShard
from transforms.staging import StagingArea
from transforms.tokenize import backends
from transforms.tokenize.staged import TokenizeAndStage
from transforms.tokenize.tokenizer import TokenizeBatches, resolve_tokenizer
from transforms.write import zarr_store as store
from transforms.write.zarr_store import TOKENS, ChunkWriter, StoreTarget
from transforms.write_behind import WriteBehind

TEXTS = ["The quick brown fox jumps over the lazy dog.", "naïve café — 東京 🚀", "x" * 300, "",
         "def f(x):\n    return x + 1\n"] * 8


def used_after_teardown(fn, bundles):
    """setup(), then each bundle (start_bundle, process each element, finish_bundle) followed
    by teardown(): the instance is used again after its teardown. The outputs, per bundle."""
    fn.setup()
    outputs = []
    for elements in bundles:
        fn.start_bundle()
        outputs.append([out for element in elements for out in fn.process(element)])
        fn.finish_bundle()
        fn.teardown()
    return outputs


def document_batch(i: int, file_key: str = "0:in.jsonl") -> DocumentBatch:
    texts = TEXTS[i:] + TEXTS[:i]
    offsets = np.arange(len(texts), dtype=np.uint64) * 1000 + i * 100_000
    return DocumentBatch(file_key, "auto", offsets, texts)


@pytest.fixture(scope="module")
def guarded(bpe_tokenizer):
    """A backend other than the reference, every document compared with the reference on the
    guard's thread."""
    return resolve_tokenizer(str(bpe_tokenizer), backend=backends.FASTOKENS, check_fraction=1.0)


def reference_ids(bpe_tokenizer, batch: DocumentBatch) -> np.ndarray:
    encode = backends.make_encoder(backends.HF, bpe_tokenizer.read_text())
    return encode([t for t in batch.texts if t])[0]


def test_the_tokenizer_guard_works_after_teardown(bpe_tokenizer, guarded):
    batches = [document_batch(i) for i in range(3)]
    outputs = used_after_teardown(TokenizeBatches(guarded), [[b] for b in batches])
    for (tokenized,), batch in zip(outputs, batches):
        assert np.array_equal(tokenized.ids, reference_ids(bpe_tokenizer, batch))
        assert tokenized.empty == batch.texts.count("")


def test_staging_works_after_teardown(tmp_path, bpe_tokenizer, guarded):
    batches = [document_batch(i) for i in range(3)]
    area = StagingArea(str(tmp_path / "out.zarr"), unit_keys={"0:in.jsonl": ([0], ["unit-a"])})
    outputs = used_after_teardown(TokenizeAndStage(guarded, area), [[b] for b in batches])
    for (tokenized,), batch in zip(outputs, batches):
        place = int(batch.offsets[0])
        staged = area.read_batch("unit-a", place)  # ids and documents staged, in every bundle
        assert np.array_equal(staged.ids, tokenized.ids) and np.array_equal(staged.offsets, tokenized.offsets)
        assert np.array_equal(tokenized.ids, reference_ids(bpe_tokenizer, batch))


def test_spilling_works_after_teardown(tmp_path):
    rng = np.random.default_rng(0)
    batches = []
    for i in range(3):
        lengths = rng.integers(1, 50, 40)
        batches.append(TokenizedBatch(f"{i}:f{i}.jsonl", "auto", np.arange(40, dtype=np.uint64) * 100, lengths,
                                      rng.integers(0, 5000, int(lengths.sum())).astype(np.uint16), 0))
    outputs = used_after_teardown(KeyByShard(3, 0.1, {"train": 3, "validation": 2}, str(tmp_path)),
                                  [[b] for b in batches])
    for parts, batch in zip(outputs, batches):
        assert parts and all(part.spilled for _, part in parts)
        path = spill.batch_file(str(tmp_path), batch.file_key, int(batch.offsets[0]), batch.ids).path
        assert np.array_equal(np.fromfile(path, dtype=batch.ids.dtype), batch.ids)


def test_signature_files_are_written_after_teardown(tmp_path):
    """--dedup near's KeyNodes writes each batch's signatures on its own thread."""
    from transforms.tokenize import minhash
    from transforms.tokenize.near_dedup import KeyNodes, signature_file_name
    rng = np.random.default_rng(1)
    batches = []
    for i in range(3):
        lengths = rng.integers(10, 50, 30)
        ids = rng.integers(1, 5000, int(lengths.sum())).astype(np.uint16)
        batches.append(TokenizedBatch(f"{i}:f{i}.jsonl", "auto", np.arange(30, dtype=np.uint64) * 100, lengths, ids,
                                      0, rng.integers(0, 2**63, (30, 2), dtype=np.uint64),
                                      minhash.signatures(ids, lengths, 5, 64)))
    outputs = used_after_teardown(KeyNodes(0, 4, str(tmp_path)), [[b] for b in batches])
    for parts, batch in zip(outputs, batches):
        assert parts and all(part.signature_file for _, part in parts)
        written = np.fromfile(tmp_path / signature_file_name(batch.file_key, 0), dtype=np.uint16)
        assert np.array_equal(written.reshape(-1, 64), batch.signatures)
        for _, part in parts:
            assert np.array_equal(part.signatures_of(np.arange(part.ranks.size)), batch.signatures[part.rows])


def test_a_progress_file_keeps_counting_after_teardown(tmp_path):
    progress = ProgressFile(str(tmp_path))
    progress.add(documents=3, tokens=10)
    progress.flush()  # what teardown() does
    progress.add(documents=2, tokens=5)
    progress.flush()
    assert read_totals(str(tmp_path)) == {"documents": 5, "tokens": 15}


def test_a_write_in_flight_lands_when_teardown_runs_on_another_thread_and_the_writer_goes_on(tmp_path):
    """Beam's harness tears down the DoFns of bundles still running when it shuts down: the
    write in flight lands, and the bundle's next write is not refused."""
    writer = WriteBehind("test-writer")
    started = threading.Event()

    def slow_write(path, data):
        started.set()
        time.sleep(0.3)
        with open(path, "wb") as f:
            f.write(data)

    writer.submit(slow_write, tmp_path / "first", b"1")
    started.wait()
    teardown = threading.Thread(target=writer.close)
    teardown.start()
    teardown.join()
    assert (tmp_path / "first").read_bytes() == b"1", "close() returned before the write in flight landed"
    writer.submit(slow_write, tmp_path / "second", b"2")
    writer.wait()
    assert (tmp_path / "second").read_bytes() == b"2"
    writer.close()


class _SlowChunks:
    """Token values whose chunks take a while to encode, and whose third chunk is cut only
    after the writers' pool was shut down: a teardown on another thread, mid-write."""

    def __init__(self, values: np.ndarray, pool):
        self._values, self._pool, self._cuts = values, pool, 0
        self.size = values.size

    def __getitem__(self, where):
        self._cuts += 1
        if self._cuts == 3:
            self._pool.shutdown(wait=False)
        return _SlowToEncode(self._values[where])


class _SlowToEncode:
    def __init__(self, values):
        self._values = values

    def __array__(self, dtype=None, copy=None):
        time.sleep(0.3)
        return np.asarray(self._values, dtype=dtype)


def test_a_chunk_write_refused_midway_lets_the_chunks_it_started_land_before_it_raises(tmp_path):
    """The caller confirms its claim (and gives its lease back) when a write returns or
    raises: no chunk of it may land after that."""
    from concurrent.futures import ThreadPoolExecutor
    target = StoreTarget(url=str(tmp_path / "o"), tokens_chunk=7, seq_starts_chunk=3, run_id="r")
    store.create_split(target, "train", 50, 9)
    pool = ThreadPoolExecutor(4)
    writer = ChunkWriter(target, "train", TOKENS, pool)
    values = np.arange(28, dtype=np.uint32)
    with pytest.raises(RuntimeError, match="after shutdown"):
        writer.write(0, _SlowChunks(values, pool))
    chunks = sorted(os.listdir(tmp_path / "o" / "train" / TOKENS))
    assert [c for c in chunks if not c.startswith(".")] == ["0", "1"]
