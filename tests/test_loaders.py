"""flat_tokens.loaders, torch- and jax-free: the stream a data loader's workers split by step
(interleaved worker by worker, they are the host's stream), its state for resuming, and the
map-style source of sequences; on a dataset written by the real pipeline."""
import pickle
from pathlib import Path

import numpy as np
import pytest

from flat_tokens.blend import Blend
from flat_tokens.loaders import PackedBatchStream, SequenceSource
from flat_tokens.reader import DatasetError, FlatTokensSplit
from tests.helpers import CountingReads, run_pipeline

LENGTH = 128
SIZES = {"block_tokens": 4 * LENGTH, "buffer_blocks": 3}


def take(batches, n):
    return [next(batches) for _ in range(n)]


def like_a_data_loader(workers, n):
    """What a DataLoader does with one iterator per worker: one item from each in turn, a
    finished worker left out."""
    out, live = [], list(workers)
    while live and len(out) < n:
        for w in list(live):
            try:
                out.append(next(w))
            except StopIteration:
                live.remove(w)
            if len(out) == n:
                break
    return out


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            assert (u is None and v is None) or np.array_equal(u, v)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.slow
def test_workers_of_two_ranks_give_each_rank_s_stream(byte_splits, num_workers):
    train = byte_splits["train"]
    for rank in range(2):
        want = take(train.packed_batches(LENGTH, 8, seed=3, rank=rank, world_size=2, **SIZES), 20)
        stream = PackedBatchStream(train, LENGTH, 8, seed=3, rank=rank, world_size=2, **SIZES)
        copies = [pickle.loads(pickle.dumps(stream)) for _ in range(num_workers)]  # as workers get it
        same(like_a_data_loader([c.batches(j, num_workers) for j, c in enumerate(copies)], 20), want)


@pytest.mark.slow
def test_with_epochs_the_workers_end_together_with_the_stream(byte_splits):
    train = byte_splits["train"]
    want = list(train.packed_batches(LENGTH, 6, seed=1, epochs=1, rank=1, world_size=2, **SIZES))
    stream = PackedBatchStream(train, LENGTH, 6, seed=1, epochs=1, rank=1, world_size=2, **SIZES)
    copies = [pickle.loads(pickle.dumps(stream)) for _ in range(3)]
    got = like_a_data_loader([c.batches(j, 3) for j, c in enumerate(copies)], 10**6)
    assert len(want) % 3 and len(got) == len(want)
    same(got, want)


def test_a_state_resumes_in_process_and_under_workers(byte_splits):
    train = byte_splits["train"]
    want = take(train.packed_batches(LENGTH, 8, seed=4, segments=True, **SIZES), 16)
    stream = PackedBatchStream(train, LENGTH, 8, seed=4, segments=True, **SIZES)
    it = iter(stream)
    same(take(it, 5), want[:5])
    state = stream.state_dict()
    assert state["next_step"] == 5
    again = PackedBatchStream(train, LENGTH, 8, seed=4, segments=True, **SIZES)
    again.load_state_dict(pickle.loads(pickle.dumps(state)))
    same(take(iter(again), 3), want[5:8])
    under_workers = [PackedBatchStream(train, LENGTH, 8, seed=4, segments=True, **SIZES) for _ in range(2)]
    for copy in under_workers:  # a state from one process resumes under any number of workers
        copy.load_state_dict(state)
    same(like_a_data_loader([c.batches(j, 2) for j, c in enumerate(under_workers)], 11), want[5:])
    fresh = PackedBatchStream(train, LENGTH, 8, seed=4, start_step=5, segments=True, **SIZES)
    same(take(iter(fresh), 11), want[5:])  # and start_step does the same, with any loader


def test_a_worker_s_state_resumes_that_worker(byte_splits):
    train = byte_splits["train"]
    want = take(train.packed_batches(LENGTH, 8, seed=2, **SIZES), 12)
    workers = [PackedBatchStream(train, LENGTH, 8, seed=2, **SIZES) for _ in range(2)]
    iterators = [w.batches(j, 2) for j, w in enumerate(workers)]
    same(like_a_data_loader(iterators, 6), want[:6])  # three batches from each worker
    states = [w.state_dict() for w in workers]
    assert [s["next_step"] for s in states] == [6, 7] and [s["worker"] for s in states] == [0, 1]
    resumed = [PackedBatchStream(train, LENGTH, 8, seed=2, **SIZES) for _ in range(2)]
    for r, s in zip(resumed, states):
        r.load_state_dict(s)
    same(like_a_data_loader([r.batches(j, 2) for j, r in enumerate(resumed)], 6), want[6:])
    wrong = PackedBatchStream(train, LENGTH, 8, seed=2, **SIZES)
    wrong.load_state_dict(states[1])
    with pytest.raises(ValueError, match="worker 1's of 2"):
        wrong.batches(0, 3)
    with pytest.raises(ValueError, match="another stream's"):
        PackedBatchStream(train, LENGTH, 8, seed=3, **SIZES).load_state_dict(states[0])


def test_a_blend_s_stream_splits_over_workers_too(byte_splits):
    blend = Blend([byte_splits["train"], byte_splits["validation"]], [3, 1], seed=5)
    want = take(blend.packed_batches(LENGTH, 8, rank=1, world_size=2, sources=True, **SIZES), 12)
    stream = PackedBatchStream(blend, LENGTH, 8, rank=1, world_size=2, sources=True, **SIZES)
    copies = [pickle.loads(pickle.dumps(stream)) for _ in range(3)]
    same(like_a_data_loader([c.batches(j, 3) for j, c in enumerate(copies)], 12), want)
    with pytest.raises(ValueError, match="own seed"):
        PackedBatchStream(blend, LENGTH, 8, seed=1)


def test_arguments_are_checked_at_once(byte_splits):
    train = byte_splits["train"]
    for kwargs, error in (({"world_size": 3}, ValueError), ({"length": 10**9}, ValueError),
                          ({"sources": True}, DatasetError), ({"batch_size": 0}, ValueError)):
        with pytest.raises(error):
            PackedBatchStream(train, **{"length": LENGTH, "batch_size": 8, **kwargs})


def test_sequences_map_style(byte_splits):
    validation = byte_splits["validation"]
    source = pickle.loads(pickle.dumps(SequenceSource(validation)))
    assert len(source) == len(validation) > 10
    assert [source[i].tolist() for i in (0, 3, len(source) - 1)] == [validation.sequence(i).tolist()
                                                                     for i in (0, 3, len(source) - 1)]
    cut = SequenceSource(validation, max_length=5)
    assert all(cut[i].tolist() == validation.sequence(i).tolist()[:5] for i in range(10))
    assert source[0].dtype == np.int32


@pytest.fixture(scope="module")
def small_chunks(tmp_path_factory, corpus):
    """The corpus through the bytes tokenizer in 1024-token chunks: a few hundred chunks, so that
    a lane's slice of an epoch is many chunks, as it is in a real dataset."""
    out = tmp_path_factory.mktemp("chunks") / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0", "--tokens_chunk_size", "1024")
    return FlatTokensSplit(str(out))


def test_two_workers_of_two_ranks_each_read_a_quarter_and_give_the_single_stream(small_chunks):
    """2 ranks x 2 DataLoader workers: each of the four reads about 1/4 of the split in an epoch
    (tokens asked, and stored bytes of the chunks decompressed), not its host's half, and the
    loaders' batches, rank by rank, are the single-host stream."""
    train, batch = small_chunks, 8
    sizes = {"block_tokens": 8 * 1024, "buffer_blocks": 8}  # blocks of 8 whole chunks; one block a lane
    store = Path(train.url) / "train" / "encoded_tokens"
    chunk_bytes = {int(p.name): p.stat().st_size for p in store.rglob("*") if p.name.isdigit()}
    total_bytes = sum(chunk_bytes.values())
    single = list(train.packed_batches(LENGTH, batch, seed=2, epochs=1, **sizes))
    assert len(single) > 30 and train.num_tokens > 16 * sizes["block_tokens"]  # several pieces a lane
    hosts = []
    for rank in range(2):
        stream = PackedBatchStream(train, LENGTH, batch, seed=2, epochs=1, rank=rank, world_size=2, **sizes)
        copies = [pickle.loads(pickle.dumps(stream)) for _ in range(2)]  # as the workers get it
        spies = []
        for copy in copies:
            copy.data._tokens = spy = CountingReads(copy.data._tokens, chunk_bytes)
            spies.append(spy)
        hosts.append(like_a_data_loader([c.batches(j, 2) for j, c in enumerate(copies)], 10**6))
        for spy in spies:
            print(f"rank {rank}: a worker read {spy.tokens / train.num_tokens:.3f} of the tokens, "
                  f"{spy.bytes / total_bytes:.3f} of the stored bytes")
            assert spy.tokens <= 0.3 * train.num_tokens and spy.bytes <= 0.3 * total_bytes
    assert len(hosts[0]) == len(hosts[1]) == len(single)
    for k, (inputs, targets) in enumerate(single):
        assert np.array_equal(np.concatenate([hosts[0][k][1], hosts[1][k][1]]), targets)
        assert np.array_equal(np.concatenate([hosts[0][k][0], hosts[1][k][0]]), inputs)


def test_a_state_saved_on_four_hosts_resumes_on_two(byte_splits):
    """The state names the global step, not the world size: saved by a rank of 4, loaded by the
    ranks of 2, the loaders continue the single-host stream."""
    train = byte_splits["train"]
    want = take(train.packed_batches(LENGTH, 8, seed=6, **SIZES), 10)
    saved = PackedBatchStream(train, LENGTH, 8, seed=6, rank=3, world_size=4, **SIZES)
    same(take(iter(saved), 4), [(i[6:], t[6:]) for i, t in want[:4]])
    state = pickle.loads(pickle.dumps(saved.state_dict()))
    resumed = []
    for rank in range(2):
        stream = PackedBatchStream(train, LENGTH, 8, seed=6, rank=rank, world_size=2, **SIZES)
        stream.load_state_dict(state)
        resumed.append(take(iter(stream), 6))
    got = [tuple(np.concatenate([resumed[0][k][f], resumed[1][k][f]]) for f in range(2)) for k in range(6)]
    same(got, want[4:])
