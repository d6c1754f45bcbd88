"""packed_batches for trainers: data-parallel ranks and document masks (segment ids and
positions), on a dataset written by the real pipeline."""
import numpy as np
import pytest

from pipeline.reader import Batch, FlatTokensSplit, segments
from tests.helpers import run_pipeline

LONG = 1024  # a few hundred windows: a test reads several epochs
SMALL = {"block_tokens": 5 * LONG, "buffer_blocks": 3}  # many buffers, so ranks cross buffer edges


@pytest.fixture(scope="module")
def train(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("batches") / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0.1", "--tokens_chunk_size", "4096", "--seq_starts_chunk_size", "7")
    return FlatTokensSplit(str(out))


def take(batches, n):
    return [next(batches) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Data-parallel ranks


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_ranks_rows_are_the_single_host_stream(train, world_size):
    length, batch, steps = LONG, 8, 100
    n = train.num_windows(length)
    assert steps * batch > 2 * n  # across epochs and many buffers
    single = take(train.packed_batches(length, batch, seed=5, **SMALL), steps)
    ranks = [take(train.packed_batches(length, batch, seed=5, rank=r, world_size=world_size, **SMALL), steps)
             for r in range(world_size)]
    for k in range(steps):
        parts = [ranks[r][k] for r in range(world_size)]
        assert all(t.shape == (batch // world_size, length) for _, t in parts)
        assert np.array_equal(np.concatenate([i for i, _ in parts]), single[k][0])
        assert np.array_equal(np.concatenate([t for _, t in parts]), single[k][1])
    rank, k = world_size - 1, 17  # a restarted host resumes by step on its own
    resumed = next(train.packed_batches(length, batch, seed=5, start_step=k, rank=rank, world_size=world_size,
                                        **SMALL))
    assert np.array_equal(resumed[1], ranks[rank][k][1])


def test_with_epochs_every_rank_yields_as_many_batches(train):
    length, batch, world_size = LONG, 12, 4
    n = train.num_windows(length)
    assert 0 < n % batch < batch // world_size * 2  # the last batch reaches rank 0 or 1 only
    single = list(train.packed_batches(length, batch, seed=2, epochs=1, **SMALL))
    ranks = [list(train.packed_batches(length, batch, seed=2, epochs=1, rank=r, world_size=world_size, **SMALL))
             for r in range(world_size)]
    assert {len(r) for r in ranks} == {len(single)}
    assert [len(ranks[r][-1][1]) for r in range(world_size)] == [
        min(3, max(0, n % batch - 3 * r)) for r in range(world_size)]
    for k in range(len(single)):
        assert np.array_equal(np.concatenate([ranks[r][k][1] for r in range(world_size)]), single[k][1])
    assert ranks[-1][-1][1].shape == (0, length)  # an empty part: the host still takes the step


def test_a_rank_reads_only_the_blocks_holding_its_windows(train):
    class Spy:
        def __init__(self, arr):
            self.arr, self.shape, self.chunks, self.reads = arr, arr.shape, arr.chunks, []

        def __getitem__(self, key):
            self.reads.append(key.start)
            return self.arr[key]

    length, sizes = 64, {"block_tokens": 64, "buffer_blocks": 64}  # one window per block
    reads = []
    for rank in range(4):
        split = FlatTokensSplit(train.url)
        split._tokens = spy = Spy(split._tokens)
        take(split.packed_batches(length, 4, rank=rank, world_size=4, **sizes), 16)  # one buffer: 64 windows
        reads.append(spy.reads[:16])
    assert all(len(r) == 16 for r in reads)  # 16 of the buffer's 64 blocks: its own windows
    assert len({x for r in reads for x in r}) == 64  # together, every window once


def test_ranks_refuse_bad_arguments(train):
    for kwargs in ({"world_size": 3}, {"rank": 4, "world_size": 4}, {"rank": -1, "world_size": 2},
                   {"world_size": 0}):
        with pytest.raises(ValueError):
            train.packed_batches(64, 8, **kwargs)


# ---------------------------------------------------------------------------------------------
# Document masks


def reference_segments(window):
    """Slow and plain: a new segment at each start bit and at the window's first token."""
    ids, positions = np.zeros(window.shape, np.int32), np.zeros(window.shape, np.int32)
    for row in range(window.shape[0]):
        segment = position = 0
        for j, v in enumerate(window[row].tolist()):
            if j == 0 or v & 1:
                segment, position = segment + 1, 0
            else:
                position += 1
            ids[row, j], positions[row, j] = segment, position
    return ids, positions


def test_segments_of_the_worked_example():
    windows = np.array([[3, 4, 7, 8], [10, 13, 14, 16]], np.uint32)  # [1 2 | 3 4] and [5 | 6 7 8]
    ids, positions = segments(windows)
    assert ids.tolist() == [[1, 1, 2, 2], [1, 2, 2, 2]] and positions.tolist() == [[0, 1, 0, 1], [0, 0, 1, 2]]
    assert ids.dtype == positions.dtype == np.int32


def test_segments_equal_the_reference_on_real_windows(train):
    length = 256
    indices = list(range(0, train.num_windows(length), 3))
    plain = train.packed_batch(indices, length)
    batch = train.packed_batch(indices, length, segments=True)
    assert isinstance(batch, Batch) and batch.sources is None
    assert np.array_equal(batch.inputs, plain[0]) and np.array_equal(batch.targets, plain[1])
    windows = np.stack([train.packed(i, length) for i in indices])
    want_ids, want_positions = reference_segments(windows)
    assert np.array_equal(batch.segment_ids, want_ids) and np.array_equal(batch.positions, want_positions)
    assert (batch.segment_ids.max(axis=1) > 1).any()  # windows do hold several documents
    assert (batch.inputs[batch.positions == 0] == 0).all()  # a segment's first input is 0, as the format says


def test_packed_batches_with_segments(train):
    length, batch = LONG, 8
    plain = take(train.packed_batches(length, batch, seed=9, **SMALL), 12)
    masked = take(train.packed_batches(length, batch, seed=9, segments=True, rank=1, world_size=2, **SMALL), 12)
    for (inputs, targets), got in zip(plain, masked):
        assert np.array_equal(got.targets, targets[4:]) and np.array_equal(got.inputs, inputs[4:])
        # The bytes tokenizer's ids are >= 1, so an input of 0 after a window's first token is a start bit.
        encoded = (2 * got.targets.astype(np.uint32)) | (got.inputs == 0)
        want_ids, want_positions = reference_segments(encoded)
        assert np.array_equal(got.segment_ids, want_ids) and np.array_equal(got.positions, want_positions)
