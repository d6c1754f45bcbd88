"""flat_tokens.torch_data with a real torch DataLoader (only where torch is installed: the package
does not depend on it; tests/test_loaders.py covers the same logic without torch): two ranks
with two worker processes each give each rank's stream exactly, and a loader resumes from a
state dict (torchdata's StatefulDataLoader, where installed) or from start_step."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from flat_tokens.torch_data import PackedBatchDataset, SequenceDataset  # noqa: E402


LENGTH = 128
SIZES = {"block_tokens": 4 * LENGTH, "buffer_blocks": 3}


def take(iterable, n):
    it = iter(iterable)
    return [next(it) for _ in range(n)]


@pytest.mark.slow  # worker processes start by spawn
def test_two_workers_on_each_of_two_ranks_give_each_rank_s_stream(byte_splits):
    train = byte_splits["train"]
    for rank in range(2):
        want = take(train.packed_batches(LENGTH, 8, seed=3, rank=rank, world_size=2, segments=True, **SIZES), 13)
        data = PackedBatchDataset(train, LENGTH, 8, seed=3, rank=rank, world_size=2, segments=True, **SIZES)
        loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        got = take(loader, 13)
        assert all(isinstance(b.inputs, torch.Tensor) and b.inputs.dtype == torch.int32 for b in got)
        for g, w in zip(got, want):
            for name in ("inputs", "targets", "segment_ids", "positions"):
                assert np.array_equal(getattr(g, name).numpy(), getattr(w, name)), name


@pytest.mark.slow  # worker processes start by spawn
def test_with_epochs_the_loader_ends_with_the_stream(byte_splits):
    train = byte_splits["train"]
    want = list(train.packed_batches(LENGTH, 6, seed=1, epochs=1, rank=0, world_size=2, **SIZES))
    data = PackedBatchDataset(train, LENGTH, 6, seed=1, epochs=1, rank=0, world_size=2, **SIZES)
    got = list(DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert len(got) == len(want) and len(want) % 2
    assert all(np.array_equal(g[1].numpy(), w[1]) for g, w in zip(got, want))


@pytest.mark.slow  # worker processes start by spawn
def test_a_loader_resumes_from_a_state_dict(byte_splits):
    train = byte_splits["train"]
    want = take(train.packed_batches(LENGTH, 8, seed=4, **SIZES), 12)
    data = PackedBatchDataset(train, LENGTH, 8, seed=4, **SIZES)
    it = iter(DataLoader(data, batch_size=None, num_workers=0))
    assert all(np.array_equal(next(it)[1].numpy(), w[1]) for w in want[:5])
    state = data.state_dict()
    again = PackedBatchDataset(train, LENGTH, 8, seed=4, **SIZES)
    again.load_state_dict(state)
    got = take(DataLoader(again, batch_size=None, num_workers=2, multiprocessing_context="spawn"), 7)
    assert all(np.array_equal(g[1].numpy(), w[1]) for g, w in zip(got, want[5:]))


@pytest.mark.slow  # worker processes start by spawn
def test_a_stateful_data_loader_with_two_workers_resumes(byte_splits):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    train = byte_splits["train"]
    want = take(train.packed_batches(LENGTH, 8, seed=6, rank=1, world_size=2, **SIZES), 14)
    loader = stateful.StatefulDataLoader(PackedBatchDataset(train, LENGTH, 8, seed=6, rank=1, world_size=2, **SIZES),
                                         batch_size=None, num_workers=2, multiprocessing_context="spawn")
    it = iter(loader)
    assert all(np.array_equal(next(it)[1].numpy(), w[1]) for w in want[:5])
    state = loader.state_dict()
    resumed = stateful.StatefulDataLoader(PackedBatchDataset(train, LENGTH, 8, seed=6, rank=1, world_size=2, **SIZES),
                                          batch_size=None, num_workers=2, multiprocessing_context="spawn")
    resumed.load_state_dict(state)
    got = take(resumed, 9)
    assert all(np.array_equal(g[1].numpy(), w[1]) for g, w in zip(got, want[5:]))


def test_sequences_with_a_distributed_sampler(byte_splits):
    validation = byte_splits["validation"]

    def pad(sequences):
        out = torch.zeros(len(sequences), max(len(s) for s in sequences), dtype=torch.int32)
        for row, s in enumerate(sequences):
            out[row, :len(s)] = torch.from_numpy(s)
        return out

    seen = []
    for rank in range(2):
        sampler = DistributedSampler(SequenceDataset(validation), num_replicas=2, rank=rank, shuffle=False)
        for batch in DataLoader(SequenceDataset(validation), batch_size=4, sampler=sampler, collate_fn=pad):
            seen += [row[row != 0].tolist() for row in batch]
    assert sorted(seen) == sorted(s.tolist() for s in validation) + ([] if len(validation) % 2 == 0 else
                                                                      [validation.sequence(0).tolist()])
