"""pipeline.reader on datasets written by the real pipeline, and on the format's worked example."""
import importlib.util
import json
import pickle
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from pipeline.reader import (DatasetError, FlatTokensSplit, UncommittedDataset, inputs_targets,
                             open_dataset)
from tests.helpers import CHECKER, run_pipeline

EXAMPLE = [[1, 2], [3, 4, 5], [6, 7, 8]]  # the worked example of docs/flat-tokens-format.md


def load_checker():
    spec = importlib.util.spec_from_file_location("check_flat_tokens", CHECKER)
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


def test_every_sequence_equals_the_checkers_decode(bytes_dataset, decoded):
    root = zarr.open_group(str(bytes_dataset), mode="r")
    for name, got in decoded.items():
        problems = []
        _, digests = checker.check_split(root[name], name, 1000, problems, True)
        assert problems == []
        assert len(got) == len(digests) > 0
        assert [checker._digest(ids.astype(np.uint32)) for ids in got] == digests
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
