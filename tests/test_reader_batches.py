"""packed_batches for trainers: data-parallel ranks and document masks (segment ids and
positions), on a dataset written by the real pipeline."""
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zarr

from flat_tokens.batch_order import BatchOrder, host_rows
from flat_tokens.reader import Batch, FlatTokensSplit, segments
from tests.helpers import CountingReads, run_pipeline

LONG = 1024  # a few hundred windows: a test reads several epochs
SMALL = {"block_tokens": 5 * LONG, "buffer_blocks": 3}  # many buffers, so ranks cross buffer edges
PIECES = {"block_tokens": 8 * 64, "buffer_blocks": 3}  # length 64: pieces of 8 windows, a dozen per lane and epoch


@pytest.fixture(scope="module")
def train(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("batches") / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0.1", "--tokens_chunk_size", "4096", "--seq_starts_chunk_size", "7")
    return FlatTokensSplit(str(out))


def take(batches, n):
    return [next(batches) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Data-parallel ranks: each host serves (and reads) its own share of every epoch


def row_counts(targets):
    return Counter(row.tobytes() for row in targets)


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    """A real zarr dataset whose token ids are their positions (sequences of 1 to 90 tokens), so
    a served row names its window: window k of length L holds ids k*L..(k+1)*L-1."""
    url = str(tmp_path_factory.mktemp("numbered") / "numbered.zarr")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 90, 2000)
    lengths = lengths[np.cumsum(lengths) <= 64 * 1500]
    tokens = 2 * np.arange(lengths.sum(), dtype=np.uint32)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64)
    tokens[starts[:-1].astype(np.int64)] |= 1
    group = zarr.open_group(f"{url}/train", mode="w", zarr_format=2)
    for name, data in (("encoded_tokens", tokens), ("seq_starts", starts)):
        group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=(256,))[...] = data
    group.attrs["max_token_id"] = int(tokens[-1] >> 1)
    zarr.open_group(f"{url}/validation", mode="w", zarr_format=2)
    for name, dtype in (("encoded_tokens", np.uint32), ("seq_starts", np.uint64)):
        zarr.open_group(f"{url}/validation", zarr_format=2).create_array(name, shape=(1,) if dtype == np.uint64 else (0,),
                                                                        dtype=dtype, chunks=(256,))
    zarr.create_group(url, zarr_format=2, attributes={"format": "flat-tokens", "complete": True})
    return FlatTokensSplit(url)


def windows_of(batch, length):
    """The window index of each row of a batch of `numbered` (ids are positions)."""
    targets = batch[1] if isinstance(batch, tuple) else batch.targets
    assert np.array_equal(targets, targets[:, :1] + np.arange(length))  # whole windows, unchanged
    assert (targets[:, 0] % length == 0).all()
    return (targets[:, 0] // length).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_the_hosts_rows_at_each_step_are_the_single_host_batch(numbered, world_size):
    """For a whole epoch and into the next, on a dataset of many lane pieces: the rows of ranks
    0..w-1 at step k, concatenated, are the single-host batch k; a restarted host serves its rows
    of step k from start_step alone."""
    length, batch = 64, 16
    n = numbered.num_windows(length)
    m = n // batch  # steps per epoch
    assert n % batch and m > 5 * PIECES["block_tokens"] // length  # windows sit out; many pieces per lane
    steps = m + 9  # an epoch, and across its end
    single = [windows_of(b, length) for b in take(numbered.packed_batches(length, batch, seed=5, **PIECES), steps)]
    hosts = [take(numbered.packed_batches(length, batch, seed=5, rank=r, world_size=world_size, **PIECES), steps)
             for r in range(world_size)]
    for k in range(steps):
        assert [w for r in range(world_size) for w in windows_of(hosts[r][k], length)] == single[k]
    epoch = [w for rows in single[:m] for w in rows]
    assert len(epoch) == len(set(epoch)) == n - n % batch  # every window at most once; n % B sit out
    for k in (0, 7, steps - 1):
        r = world_size - 1
        again = next(numbered.packed_batches(length, batch, seed=5, start_step=k, rank=r, world_size=world_size,
                                             **PIECES))
        assert windows_of(again, length) == windows_of(hosts[r][k], length)
    other = take(numbered.packed_batches(length, batch, seed=6, world_size=world_size, **PIECES), 4)
    assert [windows_of(b, length) for b in other] != [windows_of(b, length) for b in hosts[0][:4]]


def test_the_order_is_the_documented_one_and_is_computed_without_a_read(numbered):
    """Row j of batch k is BatchOrder.window(j, k) (docs/reader.md: blocks of block_tokens // L
    windows, lane pieces of max(1, buffer_blocks // B) blocks), and each lane serves, in epoch e,
    windows that are its own slice of the epoch: disjoint from every other lane's."""
    length, batch = 64, 16
    n = numbered.num_windows(length)
    m = n // batch
    order = BatchOrder(n, batch, PIECES["block_tokens"] // length, max(1, PIECES["buffer_blocks"] // batch), 5)
    served = take(numbered.packed_batches(length, batch, seed=5, **PIECES), m + 3)
    for k in (0, 1, 17, m - 1, m, m + 2):
        assert windows_of(served[k], length) == [order.window(j, k) for j in range(batch)]
    lanes = [{order.window(j, k) for k in range(m)} for j in range(batch)]
    assert sum(map(len, lanes)) == len(set().union(*lanes)) == m * batch


@pytest.mark.parametrize("before, after", [(4, 2), (2, 8)])
def test_a_job_resumed_on_another_number_of_hosts_continues_the_same_stream(numbered, before, after):
    """Checkpointed at step k on `before` hosts, resumed at step k on `after` hosts: the global
    batches from k on are those of the uninterrupted single-host stream, across an epoch's end."""
    length, batch, k = 64, 16, 70
    m = numbered.num_windows(length) // batch
    ahead = m + 5 - k  # steps served after the resume: into the next epoch
    uninterrupted = [windows_of(b, length) for b in take(numbered.packed_batches(length, batch, seed=1, **PIECES),
                                                         k + ahead)]
    old = [take(numbered.packed_batches(length, batch, seed=1, rank=r, world_size=before, **PIECES), k)
           for r in range(before)]
    new = [take(numbered.packed_batches(length, batch, seed=1, start_step=k, rank=r, world_size=after, **PIECES),
                ahead) for r in range(after)]
    served = [[w for r in range(before) for w in windows_of(old[r][s], length)] for s in range(k)]
    served += [[w for r in range(after) for w in windows_of(new[r][s], length)] for s in range(ahead)]
    assert served == uninterrupted


@pytest.mark.slow
def test_with_epochs_every_rank_yields_as_many_full_batches(train):
    length, world_size, batch = LONG, 4, 12
    m = train.num_windows(length) // batch
    ranks = [list(train.packed_batches(length, batch, seed=2, epochs=2, rank=r, world_size=world_size, **SMALL))
             for r in range(world_size)]
    assert {len(r) for r in ranks} == {2 * m}
    assert {t.shape for r in ranks for _, t in r} == {(batch // world_size, length)}
    epoch = Counter()
    for r in range(world_size):
        epoch += row_counts(np.concatenate([t for _, t in ranks[r]])[:m * batch // world_size])
    assert sum(epoch.values()) == m * batch
    assert not epoch - row_counts(train.packed_batch(range(train.num_windows(length)), length)[1])  # none twice


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_each_host_reads_its_share_of_the_split(train, world_size):
    """One epoch per host reads at most 1.25/w of the split's tokens and stored bytes, plus one
    shuffle buffer (Trainers I: 1.36x, 2.35x, 4.79x and 8.99x of the split per host), now that
    the global batches no longer depend on w (measured: 0.50, 0.25, 0.125 of the tokens)."""
    length, batch, sizes = 256, 16, {"block_tokens": 4096, "buffer_blocks": 2}  # blocks of whole chunks
    store = Path(train.url) / "train" / "encoded_tokens"
    chunk_bytes = {int(p.name): p.stat().st_size for p in store.iterdir() if p.name.isdigit()}
    total_bytes = sum(chunk_bytes.values())
    buffer_tokens = sizes["block_tokens"] * sizes["buffer_blocks"]
    buffer_bytes = total_bytes * buffer_tokens / train.num_tokens + 2 * max(chunk_bytes.values())
    assert train.num_tokens > 32 * buffer_tokens and len(chunk_bytes) > 64  # at w=8: 4 buffers, 8 chunks a host
    for rank in range(world_size):
        split = FlatTokensSplit(train.url)
        split._tokens = spy = CountingReads(split._tokens, chunk_bytes)
        served = sum(t.size for _, t in split.packed_batches(length, batch, epochs=1, rank=rank,
                                                              world_size=world_size, **sizes))
        assert served == train.num_windows(length) // batch * batch // world_size * length
        print(f"w={world_size} rank {rank}: read {spy.tokens / train.num_tokens:.3f} of the tokens, "
              f"{spy.bytes / total_bytes:.3f} of the stored bytes")
        assert spy.tokens <= 1.25 * train.num_tokens / world_size + buffer_tokens, (rank, spy.tokens)
        assert spy.bytes <= 1.25 * total_bytes / world_size + buffer_bytes, (rank, spy.bytes, total_bytes)


def test_a_block_s_windows_spread_over_as_many_batches_as_a_uniform_shuffle_would(numbered):
    """The mixing measure: over an epoch, the number of distinct global batches that the windows
    of one block land in. A uniform shuffle of a buffer of K windows into batches of b rows puts a
    block's k windows in (K/b) * (1 - C(K-b, k)/C(K, k)) batches on average; every host, and so
    the global batch, mixes at least 90% as well. (Served in storage order it would be k/b.)"""
    length, block, buffer_blocks, batch = 64, 8, 8, 16
    n = numbered.num_windows(length)
    for world_size in (1, 2, 4):
        rows = batch // world_size
        m = n // world_size
        step_of = {}
        for r in range(world_size):
            batches = take(numbered.packed_batches(length, batch, rank=r, world_size=world_size,
                                                   block_tokens=block * length, buffer_blocks=buffer_blocks), m // rows)
            for k, b in enumerate(batches):
                step_of.update((w, k) for w in windows_of(b, length))
        spread = [len({step_of[w] for w in range(s, s + block) if w in step_of}) for s in range(0, n - block, block)]
        K = block * buffer_blocks
        ideal = K / rows * (1 - math.comb(K - rows, block) / math.comb(K, block))
        assert np.mean(spread) >= 0.9 * ideal, (world_size, np.mean(spread), ideal)
        assert np.mean(spread) > 2 * block / rows  # far from storage order
    # And a batch's rows come from all over the split: the mean distance between two of its
    # windows is about that of windows drawn at random (n / 3), not that of one buffer's.
    batches = [windows_of(b, length) for b in take(numbered.packed_batches(length, batch, block_tokens=block * length,
                                                                          buffer_blocks=buffer_blocks), 40)]
    distance = np.mean([abs(a - b) for rows in batches for a in rows for b in rows if a < b])
    assert distance > 0.25 * n, (distance, n)


def test_ranks_refuse_bad_arguments(train):
    for kwargs in ({"world_size": 3}, {"rank": 4, "world_size": 4}, {"rank": -1, "world_size": 2},
                   {"world_size": 0}):
        with pytest.raises(ValueError):
            train.packed_batches(64, 8, **kwargs)


def test_a_world_size_that_does_not_divide_the_batch_is_refused_naming_the_nearest_that_do(train):
    """The order holds for every world size that divides batch_size (every power of two up to
    1024 for a batch of 1024 rows or a multiple); any other is refused, naming the nearest."""
    for batch, world_size, nearest in ((8, 3, "2 or 4"), (48, 5, "4 or 6"), (1024, 1000, "512 or 1024"),
                                       (32, 64, "32")):
        with pytest.raises(ValueError, match=f"world_size {world_size}.*nearest that do: {nearest}\\)"):
            train.packed_batches(16, batch, rank=0, world_size=world_size)
    for world_size in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        rows = 1024 // world_size
        assert host_rows(1024, world_size - 1, world_size) == range(1024 - rows, 1024)
    assert next(train.packed_batches(16, 1024, rank=1023, world_size=1024, block_tokens=4096))[1].shape == (1, 16)


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
    masked = take(train.packed_batches(length, batch, seed=9, segments=True, **SMALL), 12)
    for (inputs, targets), got in zip(plain, masked):
        assert np.array_equal(got.targets, targets) and np.array_equal(got.inputs, inputs)
        # The bytes tokenizer's ids are >= 1, so an input of 0 after a window's first token is a start bit.
        encoded = (2 * got.targets.astype(np.uint32)) | (got.inputs == 0)
        want_ids, want_positions = reference_segments(encoded)
        assert np.array_equal(got.segment_ids, want_ids) and np.array_equal(got.positions, want_positions)
