"""flat_tokens.reader on datasets written by the real pipeline, and on the format's worked example."""
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from flat_tokens import reader
from flat_tokens.reader import DatasetError, FlatTokensSplit, UncommittedDataset, inputs_targets, open_dataset
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import CHECKER, REPO, SAMPLE, run_pipeline, write_jsonl

EXAMPLE = [[1, 2], [3, 4, 5], [6, 7, 8]]  # the worked example of docs/flat-tokens-format.md


def load_checker():
    spec = importlib.util.spec_from_file_location("flat_tokens_checker", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = load_checker()


def input_texts(corpus):
    return [json.loads(line)["text"] for p in sorted(corpus.glob("*.jsonl"))
            for line in p.read_text(encoding="utf-8").splitlines()]


def raw_sequences(path, split):
    """Sequences decoded independently from the raw zarr arrays, by the format's rules."""
    g = zarr.open_group(str(path), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:], g["seq_starts"][:]
    assert np.array_equal(np.flatnonzero(tokens & 1), starts[:-1])
    return [(tokens[a:b] >> 1).tolist() for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def write_dataset(url, splits, fmt=2, *, commit=True, complete=True, chunk=3):
    """A dataset written with zarr directly: splits first, root metadata last (the commit)."""
    for name, seqs in splits.items():
        tokens = np.array([2 * t + (i == 0) for s in seqs for i, t in enumerate(s)], np.uint32)
        starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.uint64)
        group = zarr.open_group(f"{url}/{name}", mode="w", zarr_format=fmt)
        for member, data in (("encoded_tokens", tokens), ("seq_starts", starts)):
            arr = group.create_array(member, shape=data.shape, dtype=data.dtype, chunks=(chunk,))
            if data.size:
                arr[...] = data
        group.attrs["max_token_id"] = max((t for s in seqs for t in s), default=0)
    if commit:
        zarr.create_group(url, zarr_format=fmt, attributes={"format": "flat-tokens", "complete": complete})
    return url


@pytest.fixture(scope="module")
def bytes_dataset(tmp_path_factory, corpus):
    """The real pipeline, `bytes` tokenizer, small chunks so sequences cross chunk boundaries."""
    out = tmp_path_factory.mktemp("reader") / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0.1", "--tokens_chunk_size", "4096", "--seq_starts_chunk_size", "7")
    return out


@pytest.fixture(scope="module")
def decoded(bytes_dataset):
    """Every sequence of both splits, read through the reader (one pass, shared by tests)."""
    return {name: [split.sequence(i) for i in range(len(split))]
            for name, split in open_dataset(str(bytes_dataset)).items()}


@pytest.fixture(params=[2, 3], ids=["zarr2", "zarr3"])
def example(request, tmp_path):
    return write_dataset(str(tmp_path / "example.zarr"), {"train": EXAMPLE, "validation": []}, request.param)


# ---------------------------------------------------------------------------------------------
# A real pipeline run


@pytest.mark.slow
def test_every_sequence_equals_the_checkers_decode(bytes_dataset, decoded):
    root = zarr.open_group(str(bytes_dataset), mode="r")
    for name, got in decoded.items():
        problems = []
        _, digests = checker.check_split(root[name], name, 1000, problems, True)
        assert problems == []
        assert len(got) == len(digests) > 0
        assert [checker.digest(ids.astype(np.uint32)) for ids in got] == digests
        assert [ids.tolist() for ids in got] == raw_sequences(bytes_dataset, name)


def test_sequences_are_the_input_documents_tokenized(bytes_dataset, decoded, corpus):
    splits = open_dataset(str(bytes_dataset))
    got = Counter(bytes((seq - 1).astype(np.uint8)).decode("utf-8") for s in decoded.values() for seq in s)
    want = Counter(t for t in input_texts(corpus) if t)  # "" tokenizes to nothing and is dropped
    assert got == want
    stats = splits["train"].attrs["stats"]
    for name, split in splits.items():
        assert (len(split), split.num_tokens, split.max_token_id) == (
            stats[name]["sequences"], stats[name]["tokens"], stats[name]["max_token_id"])
        assert split.sequence(0).dtype == np.int32


def test_counts_and_lengths_match_the_arrays(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset))
    starts = zarr.open_group(str(bytes_dataset), mode="r")["train"]["seq_starts"][:].astype(np.int64)
    assert train.num_tokens == starts[-1] and len(train) == starts.size - 1
    assert np.array_equal(np.concatenate(list(train.iter_sequence_lengths(block=5))), np.diff(starts))
    assert train.sequence_bounds(4) == (starts[4], starts[5])


def test_packed_windows_tile_the_token_array(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset), "train")
    tokens = zarr.open_group(str(bytes_dataset), mode="r")["train"]["encoded_tokens"][:]
    length = 1000
    n = train.num_windows(length)
    assert n == tokens.size // length and tokens.size % length  # there is a partial tail
    for i in (0, 1, n // 2, n - 1):
        assert np.array_equal(train.packed(i, length), tokens[i * length:(i + 1) * length])
    with pytest.raises(IndexError):
        train.packed(n, length)
    assert np.array_equal(train.packed(n, length, partial=True), tokens[n * length:])
    assert train.num_windows(length, partial=True) == n + 1
    inputs, targets = train.packed_batch([n - 1, 0, 3], length)
    assert inputs.shape == targets.shape == (3, length) and targets.dtype == np.int32
    for row, i in enumerate([n - 1, 0, 3]):
        w = tokens[i * length:(i + 1) * length]
        assert np.array_equal(targets[row], w >> 1)
        want_inputs = [0] + [0 if w[j] & 1 else int(w[j - 1] >> 1) for j in range(1, length)]
        assert inputs[row].tolist() == want_inputs


@pytest.mark.slow
def test_concurrent_reads_from_threads(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset))
    order = np.random.default_rng(0).permutation(len(train))[:150].tolist() * 2
    serial = [train.sequence(i).tolist() for i in order]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda i: train.sequence(i).tolist(), order))
    assert parallel == serial


def test_pickles_by_url(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset))
    copy = pickle.loads(pickle.dumps(train))
    assert len(copy) == len(train) and np.array_equal(copy.sequence(3), train.sequence(3))


# ---------------------------------------------------------------------------------------------
# The worked example of the format doc


def test_worked_example(example):
    train = FlatTokensSplit(example, "train")
    assert (len(train), train.num_tokens, train.max_token_id) == (3, 8, 8)
    assert [train.sequence(i).tolist() for i in range(3)] == EXAMPLE
    assert train.encoded_sequence(1).tolist() == [7, 8, 10]
    assert train.packed(1, 4).tolist() == [10, 13, 14, 16]
    inputs, targets = train.packed_inputs_targets(0, 8)
    assert targets.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert inputs.tolist() == [0, 1, 0, 3, 4, 0, 6, 7]
    inputs, targets = inputs_targets(np.array([3, 4, 7, 8, 10, 13, 14, 16], np.uint32))
    assert (inputs.tolist(), targets.tolist()) == ([0, 1, 0, 3, 4, 0, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8])
    inputs, targets = train.packed_batch([1, 0], 4)
    assert targets.tolist() == [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert inputs.tolist() == [[0, 0, 6, 7], [0, 1, 0, 3]]  # a window's first input is 0


def test_last_partial_window_is_dropped_unless_asked_for(example):
    train = FlatTokensSplit(example)
    assert train.num_windows(3) == 2 and train.num_windows(3, partial=True) == 3
    assert train.num_windows(4, partial=True) == 2  # 8 tokens: no partial window
    with pytest.raises(IndexError):
        train.packed(2, 3)
    assert train.packed(2, 3, partial=True).tolist() == [14, 16]
    inputs, targets = train.packed_inputs_targets(2, 3, partial=True)
    assert (inputs.tolist(), targets.tolist()) == ([0, 7], [7, 8])
    with pytest.raises(IndexError):
        train.packed_batch([0, 2], 3)
    with pytest.raises(ValueError):
        train.packed(0, 0)


@pytest.mark.parametrize("bad", [-1, 3, 10**12])
def test_out_of_range_indices(example, bad):
    train = FlatTokensSplit(example)
    with pytest.raises(IndexError):
        train.sequence(bad)
    with pytest.raises(IndexError):
        train.packed(bad if bad != 3 else 2, 4)


def test_integer_indices_only(example):
    train = FlatTokensSplit(example)
    assert train.sequence(np.int64(2)).tolist() == [6, 7, 8]
    with pytest.raises(TypeError):
        train.sequence(1.0)


def test_empty_split(example):
    validation = FlatTokensSplit(example, "validation")
    assert (len(validation), validation.num_tokens, validation.num_windows(4)) == (0, 0, 0)
    assert list(validation) == []
    with pytest.raises(IndexError):
        validation.sequence(0)
    with pytest.raises(IndexError):
        validation.packed(0, 4, partial=True)


def test_each_access_is_two_small_reads_or_one(example):
    """Unpacked: seq_starts[i:i+2] then the tokens; packed: one slice. Nothing read whole."""
    train = FlatTokensSplit(example)
    reads = []

    class Spy:
        def __init__(self, name, arr):
            self.name, self.arr, self.shape = name, arr, arr.shape

        def __getitem__(self, key):
            reads.append((self.name, key.start, key.stop))
            return self.arr[key]

    train._tokens, train._starts = Spy("tokens", train._tokens), Spy("starts", train._starts)
    assert train.sequence(1).tolist() == [3, 4, 5]
    assert reads == [("starts", 1, 3), ("tokens", 2, 5)]
    reads.clear()
    train.packed(1, 4)
    assert reads == [("tokens", 4, 8)]


def test_fsspec_url(tmp_path):
    """memory:// goes through fsspec exactly like gs:// does."""
    url = write_dataset(f"memory://{tmp_path.name}-reader", {"train": EXAMPLE, "validation": [[9]]})
    splits = open_dataset(url)
    assert splits["train"].packed(1, 4).tolist() == [10, 13, 14, 16]
    assert splits["validation"].sequence(0).tolist() == [9]


# ---------------------------------------------------------------------------------------------
# Refusing what is not a committed dataset


def test_refuses_an_uncommitted_dataset(tmp_path):
    url = write_dataset(str(tmp_path / "half.zarr"), {"train": EXAMPLE, "validation": []}, commit=False)
    with pytest.raises(UncommittedDataset, match="unfinished"):
        FlatTokensSplit(url)
    with pytest.raises(UncommittedDataset, match="unfinished"):
        open_dataset(url)


def test_refuses_complete_false(tmp_path):
    url = write_dataset(str(tmp_path / "c.zarr"), {"train": EXAMPLE, "validation": []}, complete=False)
    with pytest.raises(UncommittedDataset, match="complete"):
        FlatTokensSplit(url)


def test_refuses_a_missing_path_and_a_missing_split(tmp_path, example):
    with pytest.raises(DatasetError, match="does not exist"):
        FlatTokensSplit(str(tmp_path / "nothing.zarr"))
    with pytest.raises(ValueError):
        FlatTokensSplit(example, "test")
    url = write_dataset(str(tmp_path / "one.zarr"), {"train": EXAMPLE})
    with pytest.raises(DatasetError, match="no split group validation"):
        open_dataset(url)


# ---------------------------------------------------------------------------------------------
# Reading for trainers: iterating sequences block by block, and packed_batches


def raw_arrays(path, split="train"):
    """encoded_tokens and seq_starts of a split, read whole with zarr alone."""
    g = zarr.open_group(str(path), mode="r")[split]
    return g["encoded_tokens"][:], g["seq_starts"][:].astype(np.int64)


def raw_encoded_sequences(path, split="train"):
    tokens, starts = raw_arrays(path, split)
    return [tokens[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def expected_rows(path, length, split="train"):
    """Every full window's inputs and targets, derived here from the raw tokens by the format's
    rule, as one row [inputs | targets] per window, sorted (a multiset: windows may repeat)."""
    tokens, _ = raw_arrays(path, split)
    w = tokens[:tokens.size // length * length].reshape(-1, length)
    targets = (w >> 1).astype(np.int32)
    inputs = np.zeros_like(targets)
    inputs[:, 1:] = np.where(w[:, 1:] & 1, 0, targets[:, :-1])
    return sorted_rows(inputs, targets)


def sorted_rows(inputs, targets):
    rows = np.concatenate([inputs, targets], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def take(batches, n):
    return [next(batches) for _ in range(n)]


def stacked(batches):
    return (np.concatenate([i for i, _ in batches]), np.concatenate([t for _, t in batches]))


class ReadSpy:
    """Stands in for a zarr array: records every slice read (from any thread), then reads it."""

    def __init__(self, arr):
        self.arr, self.shape, self.chunks, self.reads = arr, arr.shape, arr.chunks, []

    def __getitem__(self, key):
        self.reads.append((key.start, key.stop))
        return self.arr[key]


@pytest.fixture(scope="module")
def tiny_chunks(tmp_path_factory):
    """The real pipeline with 16-token and 2-entry chunks: sequences span many chunks."""
    root = tmp_path_factory.mktemp("tiny")
    texts = input_texts(SAMPLE)[:60] + ["y" * 3000, "z", "naïve café — 東京 🚀"]
    write_jsonl(root / "in.jsonl", texts)
    out = root / "tiny.zarr"
    run_pipeline("--input", root / "in.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0.1", "--tokens_chunk_size", "16", "--seq_starts_chunk_size", "2")
    return out


@pytest.mark.parametrize("reads", ["default", "tiny"])
@pytest.mark.slow
def test_iteration_equals_a_raw_read(bytes_dataset, tiny_chunks, reads, monkeypatch):
    if reads == "tiny":  # reads far shorter than most sequences: each is stitched from many
        monkeypatch.setattr(reader, "TOKENS_READ", 40)
        monkeypatch.setattr(reader, "STARTS_READ", 3)
    for path in (bytes_dataset, tiny_chunks):
        for name, split in open_dataset(str(path)).items():
            want = raw_encoded_sequences(path, name)
            assert len(want) > 0
            got = list(split)
            assert [s.dtype for s in got[:3]] == [np.int32] * 3
            assert [s.tolist() for s in got] == [(w >> 1).tolist() for w in want]
            assert [s.tolist() for s in split.iter_encoded()] == [w.tolist() for w in want]
            n = len(want)
            for lo, hi in ((0, 1), (n // 3, n // 2), (n - 1, n), (n, n), (5, 5)):
                assert [s.tolist() for s in split.iter_sequences(lo, hi)] == [(w >> 1).tolist() for w in want[lo:hi]]


def test_iteration_reads_each_chunk_once_in_aligned_reads(bytes_dataset, monkeypatch):
    """Not one read per sequence: encoded_tokens and seq_starts are each read forward once, in
    chunk-aligned pieces that tile them (the 50,000-token document comes out of one longer read)."""
    monkeypatch.setattr(reader, "TOKENS_READ", 10_000)
    monkeypatch.setattr(reader, "STARTS_READ", 20)
    train = FlatTokensSplit(str(bytes_dataset))
    train._tokens, train._starts = tokens, starts = ReadSpy(train._tokens), ReadSpy(train._starts)
    lengths = [s.size for s in train]
    assert max(lengths) == 50_000 and len(lengths) == len(train)
    for spy, total in ((tokens, train.num_tokens), (starts, len(train) + 1)):
        chunk = spy.chunks[0]
        assert [a for a, _ in spy.reads] == [0] + [b for _, b in spy.reads[:-1]]  # forward, no overlap
        assert spy.reads[-1][1] == total
        assert all(a % chunk == 0 for a, _ in spy.reads)
        assert len(spy.reads) < len(train) / 10
    unit = -(-10_000 // tokens.chunks[0]) * tokens.chunks[0]  # 10,000 rounded up to whole chunks
    assert {b - a for a, b in tokens.reads[:-1]} - {unit} != set()  # the long document's own read
    assert max(b - a for a, b in tokens.reads) > 3 * unit


def test_iteration_of_one_huge_sequence_and_of_an_empty_split(tmp_path):
    rng = np.random.default_rng(5)
    seqs = [[7, 8], rng.integers(0, 50_000, 1_300_000).tolist(), [9], [1, 2, 3]]
    url = write_dataset(str(tmp_path / "huge.zarr"), {"train": seqs, "validation": []}, chunk=1 << 16)
    splits = open_dataset(url)
    assert [s.tolist() for s in splits["train"]] == seqs
    assert [s.tolist() for s in splits["train"].iter_sequences(1, 3)] == seqs[1:3]
    assert list(splits["validation"]) == [] and list(splits["validation"].iter_encoded()) == []
    with pytest.raises(ValueError, match="no full window"):  # an endless stream of nothing: refused at once
        splits["validation"].packed_batches(4, 2)
    with pytest.raises(IndexError):
        splits["train"].iter_sequences(2, 5)


def test_a_split_shorter_than_one_window_raises(example):
    """The stream is endless: on a split with no full window it would yield nothing, silently."""
    train = FlatTokensSplit(example)  # 8 tokens
    assert train.num_windows(8) == 1 and train.num_windows(9) == 0
    for kwargs in ({}, {"epochs": 1}, {"start_step": 3}):
        with pytest.raises(ValueError, match=r"holds no full window of 9 tokens \(8 tokens\)"):
            train.packed_batches(9, 2, **kwargs)  # at the call, not at the first next()
    with pytest.raises(ValueError, match="fewer than batch_size 2"):  # a row of every batch would get nothing
        train.packed_batches(8, 2, rank=1, world_size=2)
    assert next(train.packed_batches(8, 1))[1].tolist() == [list(range(1, 9))]  # one window, every step


def row_multiset(inputs, targets):
    return Counter(row.tobytes() for row in np.concatenate([inputs, targets], axis=1))


@pytest.mark.slow
def test_an_epoch_holds_every_full_window_at_most_once(bytes_dataset):
    """An epoch is num_windows // B full batches; the num_windows % B windows left over sit out."""
    train = FlatTokensSplit(str(bytes_dataset))
    length, batch = 64, 7
    n = train.num_windows(length)
    assert n % batch and train.num_tokens % length  # windows sit out, and a dropped tail
    want = expected_rows(bytes_dataset, length)
    every = row_multiset(want[:, :length], want[:, length:])
    for sizes in ({}, {"block_tokens": 5 * length, "buffer_blocks": 3}):
        batches = list(train.packed_batches(length, batch, seed=1, epochs=1, **sizes))
        assert [t.shape for _, t in batches] == [(batch, length)] * (n // batch)
        assert all(i.dtype == t.dtype == np.int32 for i, t in batches)
        inputs, targets = stacked(batches)
        served = row_multiset(inputs, targets)
        assert not served - every and sum((every - served).values()) == n % batch  # none twice, n % B sit out
        tokens, _ = raw_arrays(bytes_dataset)
        assert not np.array_equal(targets, (tokens[:len(targets) * length].reshape(-1, length) >> 1))  # shuffled


def test_windows_are_read_as_contiguous_runs_once_per_epoch(bytes_dataset):
    """Each lane reads its slice of the epoch in runs of consecutive windows inside blocks, each
    window once: not one read per window, and only the blocks that the lanes' slices cut in two
    are read in more than one run."""
    train = FlatTokensSplit(str(bytes_dataset))
    train._tokens = spy = ReadSpy(train._tokens)
    length, block, batch = 64, 10, 8
    n = train.num_windows(length)
    list(train.packed_batches(length, batch, epochs=1, block_tokens=block * length, buffer_blocks=4))
    reads = sorted(spy.reads)
    assert all(a % length == 0 and z % length == 0 and (a // length) // block == (z // length - 1) // block
               for a, z in reads)  # whole windows, inside one block
    windows = [w for a, z in reads for w in range(a // length, z // length)]
    assert len(windows) == len(set(windows)) == n - n % batch  # each served window read once
    assert len(reads) <= -(-n // block) + batch  # a block per read, but where a lane's slice ends
    assert spy.reads != reads  # in a shuffled block order


@pytest.mark.slow
def test_the_stream_goes_on_epoch_after_epoch(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset))
    length, batch = 64, 7
    n = train.num_windows(length)
    sizes = {"block_tokens": 4 * length, "buffer_blocks": 5}
    per_epoch = n // batch * batch  # the windows an epoch serves
    endless = take(train.packed_batches(length, batch, seed=3, **sizes), 3 * (n // batch))
    assert all(t.shape == (batch, length) for _, t in endless)  # every batch full
    inputs, targets = stacked(endless)
    want = expected_rows(bytes_dataset, length)
    every = row_multiset(want[:, :length], want[:, length:])
    for e in range(3):
        served = row_multiset(inputs[e * per_epoch:(e + 1) * per_epoch], targets[e * per_epoch:(e + 1) * per_epoch])
        assert not served - every and sum((every - served).values()) == n % batch
    assert not np.array_equal(targets[:per_epoch], targets[per_epoch:2 * per_epoch])  # each epoch reshuffled
    two = list(train.packed_batches(length, batch, seed=3, epochs=2, **sizes))
    assert sum(len(t) for _, t in two) == 2 * per_epoch
    assert np.array_equal(stacked(two)[1], targets[:2 * per_epoch])  # epochs=2 is the stream's first 2 epochs


@pytest.mark.parametrize("sizes", [{}, {"block_tokens": 3 * 64, "buffer_blocks": 4}], ids=["default", "small"])
@pytest.mark.slow
def test_start_step_resumes_exactly(bytes_dataset, sizes):
    train = FlatTokensSplit(str(bytes_dataset))
    length, batch = 64, 9
    n = train.num_windows(length)
    steps = -(-2 * n // batch) + 2  # past the end of epoch 1
    full = take(train.packed_batches(length, batch, seed=11, **sizes), steps)
    for k in (1, 5, n // batch, n // batch + 1, steps - 3):
        again = FlatTokensSplit(str(bytes_dataset))  # a restarted job
        resumed = take(again.packed_batches(length, batch, seed=11, start_step=k, **sizes), steps - k)
        for (i0, t0), (i1, t1) in zip(full[k:], resumed, strict=True):
            assert np.array_equal(i0, i1) and np.array_equal(t0, t1)
    last = list(train.packed_batches(length, batch, seed=11, epochs=1, start_step=n // batch - 1, **sizes))
    assert len(last) == 1 and np.array_equal(last[0][1], full[n // batch - 1][1])
    assert list(train.packed_batches(length, batch, seed=11, epochs=1, start_step=n // batch, **sizes)) == []


def test_seeds_give_different_orders(bytes_dataset):
    train = FlatTokensSplit(str(bytes_dataset))
    first = {seed: stacked(take(train.packed_batches(64, 16, seed=seed), 4))[1] for seed in (0, 1, 2**40)}
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2**40])
    assert np.array_equal(stacked(take(train.packed_batches(64, 16, seed=1), 4))[1], first[1])


def test_packed_batches_refuses_bad_arguments(example):
    train = FlatTokensSplit(example)
    for kwargs, error in (({"length": 0}, ValueError), ({"batch_size": 0}, ValueError),
                          ({"seed": -1}, ValueError), ({"seed": 2**64}, ValueError),
                          ({"start_step": -1}, ValueError), ({"seed": 1.5}, TypeError),
                          ({"epochs": -1}, ValueError), ({"buffer_blocks": 0}, ValueError)):
        with pytest.raises(error):
            train.packed_batches(**{"length": 4, "batch_size": 2, **kwargs})  # at the call, not later
    inputs, targets = next(train.packed_batches(4, 2))  # the worked example: two windows
    assert sorted(targets.tolist()) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert sorted(inputs.tolist()) == [[0, 0, 6, 7], [0, 1, 0, 3]]


WORKER = """
import pickle, sys
import numpy as np
from flat_tokens.reader import FlatTokensSplit
job = pickle.load(sys.stdin.buffer)
split = pickle.loads(job["split"]) if "split" in job else FlatTokensSplit(job["url"], "train")
batches = split.packed_batches(64, 8, seed=4, start_step=job["start"])
done = {"batches": [next(batches) for _ in range(job["count"])], "split": pickle.dumps(split)}
if job.get("sequences"):
    done["sequences"] = [s.tolist() for s in split]
with open(job["out"], "wb") as f:
    pickle.dump(done, f)
"""


def in_a_worker(tmp_path, env=None, **job):
    """Runs WORKER in a fresh interpreter (as a DataLoader worker would be): it opens the split
    (or unpickles job["split"]) and serves `count` batches from `start`; returns what it did."""
    out = tmp_path / f"worker-{len(list(tmp_path.glob('worker-*')))}.pickle"
    proc = subprocess.run([sys.executable, "-c", WORKER], input=pickle.dumps({**job, "out": str(out)}),
                          cwd=REPO, capture_output=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return pickle.loads(out.read_bytes())


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (i0, t0), (i1, t1) in zip(a, b):
        assert np.array_equal(i0, i1) and np.array_equal(t0, t1)


@pytest.mark.slow
def test_a_pickled_split_goes_on_with_the_same_batches(bytes_dataset, tmp_path):
    train = FlatTokensSplit(str(bytes_dataset))
    batches = train.packed_batches(64, 8, seed=4)
    first = take(batches, 3)  # mid-use
    copy = pickle.loads(pickle.dumps(train))
    want = take(batches, 4)
    assert_same_batches(take(copy.packed_batches(64, 8, seed=4, start_step=3), 4), want)
    worker = in_a_worker(tmp_path, split=pickle.dumps(train), start=3, count=4)
    assert_same_batches(worker["batches"], want)
    assert_same_batches(first, in_a_worker(tmp_path, split=worker["split"], start=0, count=3)["batches"])


@pytest.mark.slow
def test_gs_iteration_and_batches_equal_local(gcs, bytes_dataset, tmp_path):
    """The real GCS emulator: the dataset uploaded, read back through gcsfs in another process,
    whose split, pickled mid-use, goes on in a third. (In other processes because gcsfs picks
    its filesystem class at import, from the environment: gcs.env makes it skip the gRPC probe
    that the emulator cannot answer.)"""
    gcs.fs.put(str(bytes_dataset) + "/", f"{BUCKET}/reader.zarr/", recursive=True)
    local = FlatTokensSplit(str(bytes_dataset))
    want = take(local.packed_batches(64, 8, seed=4), 7)
    first = in_a_worker(tmp_path, gcs.env, url=f"gs://{BUCKET}/reader.zarr", start=0, count=4, sequences=True)
    assert first["sequences"] == [s.tolist() for s in local]
    assert_same_batches(first["batches"], want[:4])
    assert b"gs://" in first["split"]
    assert_same_batches(in_a_worker(tmp_path, gcs.env, split=first["split"], start=4, count=3)["batches"], want[4:])
