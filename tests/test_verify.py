"""Tests of flat_tokens.tools.verify on real zarr stores (format 2 and 3) written here with zarr directly."""
import os
import tempfile

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from flat_tokens.tools import verify
from flat_tokens.tools.verify import CannotOpen, main, verify_dataset

EXAMPLE = [[1, 2], [3, 4, 5], [6, 7, 8]]  # the worked example of the format doc


# ---------------------------------------------------------------------------------------------
# Writing datasets the way the pipeline commits them


def encode(seqs):
    """(encoded_tokens, seq_starts) of a list of non-empty sequences."""
    tokens = [2 * t + (i == 0) for seq in seqs for i, t in enumerate(seq)]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs], dtype=np.uint64)])
    return np.array(tokens, np.uint32), starts.astype(np.uint64)


def write_split(path, tokens, starts, max_token_id, fmt, *, chunk=3, shard=None):
    """A split as the root of its own store (own .zgroup / zarr.json), like the pipeline does;
    `shard`: zarr v3 shards of that many elements."""
    group = zarr.open_group(path, mode="w", zarr_format=fmt)
    for name, data in (("encoded_tokens", tokens), ("seq_starts", starts)):
        # Every chunk stored, all-zero ones included, as the pipeline writes them (verify
        # refuses a missing chunk, which zarr would read as zeros).
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=(chunk,) * data.ndim,
                                 shards=(shard,) if shard else None, config={"write_empty_chunks": True})
        if data.size:
            arr[...] = data
    if max_token_id is not None:
        group.attrs["max_token_id"] = max_token_id


def split_stats(seqs, max_token_id):
    return {"sequences": len(seqs), "tokens": sum(map(len, seqs)), "max_token_id": max_token_id}


def make_dataset(root, splits, fmt=2, *, commit=True, chunk=3, shard=None):
    """Writes a dataset from {split: list of sequences}: splits first, root metadata last."""
    root = str(root)
    stats = {"documents": 0, "rejected": 0, "blank": 0, "empty": 0}
    for name, seqs in splits.items():
        max_id = max((t for s in seqs for t in s), default=0)
        write_split(f"{root}/{name}", *encode(seqs), max_id, fmt, chunk=chunk, shard=shard)
        stats[name] = split_stats(seqs, max_id)
        stats["documents"] += len(seqs)
    if commit:
        root_attrs = {"format": "flat-tokens", "complete": True, "stats": stats, "seed": 0}
        # create_group does not delete the children, unlike open_group(mode="w").
        zarr.create_group(root, zarr_format=fmt, attributes=root_attrs)
    return root


def set_attrs(path, **attrs):
    group = zarr.open_group(path, mode="r+")
    group.attrs.update(attrs)


def poke(path, index, value):
    arr = zarr.open_array(path, mode="r+").with_config({"write_empty_chunks": True})
    arr[index] = value


def flip_start_bit(path, index):
    arr = zarr.open_array(path, mode="r+").with_config({"write_empty_chunks": True})
    arr[index] = int(arr[index]) ^ 1


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def fmt(request):
    return request.param


@pytest.fixture
def good(tmp_path, fmt):
    return make_dataset(tmp_path / "out.zarr", {"train": EXAMPLE, "validation": [[9], [1, 1]]}, fmt)


@pytest.fixture
def good_v2(tmp_path):
    """For attribute-only variations, where the zarr format makes no difference once opened."""
    return make_dataset(tmp_path / "out.zarr", {"train": EXAMPLE, "validation": [[9], [1, 1]]}, 2)


def only(problems, *words):
    """Asserts there is exactly one problem and it names every word; returns it."""
    assert len(problems) == 1, problems
    for w in words:
        assert w in problems[0], (w, problems[0])
    return problems[0]


# ---------------------------------------------------------------------------------------------
# Valid datasets


def test_worked_example_passes(tmp_path, fmt):
    root = str(tmp_path / "out.zarr")
    tokens = np.array([3, 4, 7, 8, 10, 13, 14, 16], np.uint32)
    starts = np.array([0, 2, 5, 8], np.uint64)
    assert (encode(EXAMPLE)[0] == tokens).all() and (encode(EXAMPLE)[1] == starts).all()
    write_split(f"{root}/train", tokens, starts, 8, fmt)
    write_split(f"{root}/validation", tokens, starts, 8, fmt)
    zarr.create_group(root, zarr_format=fmt, attributes={"format": "flat-tokens", "complete": True})
    assert verify_dataset(root) == []


def test_good_dataset_passes_with_every_block(good):
    for block in (1, 2, 3, 7, 1 << 22):
        assert verify_dataset(good, block=block) == []


def test_empty_validation_passes(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": []}, fmt)
    assert verify_dataset(root, block=2) == []
    _, summaries = verify.check_dataset(root)
    assert summaries["validation"] == verify.SplitSummary(0, 0, -1, 0)


def test_empty_split_accepts_any_valid_max_token_id(tmp_path):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": []})
    set_attrs(f"{root}/validation", max_token_id=50_000)
    set_attrs(root, stats={"train": split_stats(EXAMPLE, 8), "validation": split_stats([], 50_000)})
    assert verify_dataset(root) == []
    set_attrs(f"{root}/validation", max_token_id=-1)
    only(verify_dataset(root), "validation", "max_token_id = -1", "outside")


def test_file_url(good):
    assert verify_dataset("file://" + good) == []


def test_fsspec_url(tmp_path, fmt):
    """memory:// goes through fsspec like gs:// does (the in-memory filesystem is process-wide)."""
    url = f"memory://{tmp_path.name}"
    make_dataset(url, {"train": EXAMPLE, "validation": []}, fmt)
    make_dataset(url + "-unfinished", {"train": EXAMPLE}, fmt, commit=False)
    assert verify_dataset(url, block=2) == []
    assert verify_dataset(url + "-unfinished") == [verify.UNFINISHED]
    with pytest.raises(CannotOpen, match="does not exist"):
        verify_dataset(url + "-nothing")


# ---------------------------------------------------------------------------------------------
# Violations of one split


def test_flipped_start_bit(good):
    flip_start_bit(f"{good}/train/encoded_tokens", 3)
    p = only(verify_dataset(good, block=2), "train", "encoded_tokens", "start bit wrong at 1 positions",
             "first at index 3", "value 9")
    assert "1 set where no sequence starts" in p


def test_cleared_start_bit_at_a_start(good):
    flip_start_bit(f"{good}/train/encoded_tokens", 5)
    only(verify_dataset(good), "train", "first at index 5", "0 set where no sequence starts, 1 clear")


def test_many_wrong_bits_are_one_line(tmp_path, fmt):
    seqs = [[1] * 50, [2] * 50]
    root = make_dataset(tmp_path / "o", {"train": seqs, "validation": seqs}, fmt, chunk=16)
    poke(f"{root}/train/encoded_tokens", slice(10, 60), 3)  # every bit set
    only(verify_dataset(root, block=7), "train", "start bit wrong at 49 positions", "first at index 10")


def test_first_start_not_zero(good):
    poke(f"{good}/train/seq_starts", 0, 1)
    only(verify_dataset(good), "train", "seq_starts[0] = 1, expected 0")


def test_last_start_not_token_count(good):
    poke(f"{good}/train/seq_starts", 3, 7)
    only(verify_dataset(good), "train", "seq_starts[3] (last) = 7", "len(encoded_tokens) = 8")


def test_equal_neighbours_are_an_empty_sequence(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": EXAMPLE}, fmt)
    write_split(f"{root}/train", encode(EXAMPLE)[0], np.array([0, 2, 2, 5, 8], np.uint64), 8, fmt)
    for block in (1, 2, 3, 100):
        only(verify_dataset(root, block=block), "train",
             "not strictly increasing at index 2", "seq_starts[1] = 2, seq_starts[2] = 2", "empty sequence")


def test_decreasing_starts(good):
    poke(f"{good}/train/seq_starts", 1, 6)  # [0, 6, 5, 8]
    only(verify_dataset(good, block=1), "train", "not strictly increasing at index 2", "= 6", "= 5")


def test_id_above_max_token_id(good):
    poke(f"{good}/train/encoded_tokens", 6, 2 * 20)
    only(verify_dataset(good, block=3), "train", "decoded id 20 at index 6 exceeds max_token_id 8")


def test_max_token_id_not_exact(good):
    set_attrs(f"{good}/validation", max_token_id=10)
    stats = dict(zarr.open_group(good).attrs["stats"])
    set_attrs(good, stats=dict(stats, validation=dict(stats["validation"], max_token_id=10)))
    only(verify_dataset(good), "validation", "max_token_id = 10 is not the exact maximum", "largest decoded id is 9")


def test_missing_max_token_id(good):
    group = zarr.open_group(f"{good}/train", mode="r+")
    del group.attrs["max_token_id"]
    only(verify_dataset(good), "train", "missing attribute max_token_id")


@pytest.mark.parametrize("bad", [True, "8", 8.0])
def test_max_token_id_not_an_int(good_v2, bad):
    set_attrs(f"{good_v2}/train", max_token_id=bad)
    only(verify_dataset(good_v2), "train", "max_token_id must be an integer")


@pytest.mark.parametrize("member,dtype", [("encoded_tokens", "int32"), ("encoded_tokens", "uint64"),
                                          ("seq_starts", "uint32"), ("seq_starts", "int64")])
def test_wrong_dtype(tmp_path, fmt, member, dtype):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": EXAMPLE}, fmt)
    tokens, starts = encode(EXAMPLE)
    data = {"encoded_tokens": tokens, "seq_starts": starts}
    data[member] = data[member].astype(dtype)
    write_split(f"{root}/validation", data["encoded_tokens"], data["seq_starts"], 8, fmt)
    want = "uint32" if member == "encoded_tokens" else "uint64"
    only(verify_dataset(root), "validation", f"{member} has dtype {dtype}, expected {want}")


def test_two_dimensional(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": EXAMPLE}, fmt)
    tokens, starts = encode(EXAMPLE)
    write_split(f"{root}/train", tokens.reshape(2, 4), starts, 8, fmt)
    only(verify_dataset(root), "train", "encoded_tokens has shape (2, 4), expected 1-D")


def test_missing_array(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": EXAMPLE}, fmt)
    group = zarr.open_group(f"{root}/train", mode="w", zarr_format=fmt)
    group.create_array("encoded_tokens", shape=(8,), dtype="uint32")[...] = encode(EXAMPLE)[0]
    group.attrs["max_token_id"] = 8
    only(verify_dataset(root), "train", "missing array seq_starts")


def test_empty_seq_starts(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": []}, fmt)
    write_split(f"{root}/validation", np.zeros(0, np.uint32), np.zeros(0, np.uint64), 0, fmt)
    only(verify_dataset(root), "validation", "seq_starts is empty")


def test_structural_failure_stops_the_split_but_not_the_other(good):
    poke(f"{good}/train/seq_starts", 0, 1)
    flip_start_bit(f"{good}/train/encoded_tokens", 1)
    flip_start_bit(f"{good}/validation/encoded_tokens", 1)
    problems = verify_dataset(good)
    assert len(problems) == 2, problems
    assert problems[0].startswith("train: seq_starts[0] = 1") and problems[1].startswith("validation: ")


# ---------------------------------------------------------------------------------------------
# Every chunk stored: zarr would read a missing one as zeros

LONG = [[5] * 4, [7] * 20, [3] * 2, [1] * 5, [2] * 3]  # the second sequence spans chunks 1-7 of 3 tokens


def chunk_path(root, split, member, index, fmt):
    return os.path.join(root, split, member, *(["c"] if fmt == 3 else []), str(index))


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("member, index", [("encoded_tokens", 3), ("seq_starts", 0), ("seq_starts", 1)])
@pytest.mark.slow
def test_a_missing_chunk_is_named(tmp_path, fmt, split, member, index):
    """A chunk inside a long document reads back as zeros whose start bits are all clear, as
    they should be there: no check of the values can see it. The listing does."""
    root = make_dataset(tmp_path / "o", {"train": LONG, "validation": LONG}, fmt)
    assert verify_dataset(root) == []
    os.remove(chunk_path(root, split, member, index, fmt))
    count = 12 if member == "encoded_tokens" else 2
    block = {0: "[0, 3)", 1: "[3, 6)", 3: "[9, 12)"}[index]
    only(verify_dataset(root), f"{split}: {member}: 1 of {count} chunks missing from storage "
                               f"({index} = elements {block}); zarr would read them as zeros")


def test_missing_chunks_of_both_arrays_are_listed_together(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": LONG, "validation": EXAMPLE}, fmt)
    for index in (2, 3, 4, 5, 6, 7, 8):
        os.remove(chunk_path(root, "train", "encoded_tokens", index, fmt))
    os.remove(chunk_path(root, "train", "seq_starts", 0, fmt))
    problem = only(verify_dataset(root), "train: encoded_tokens: 7 of 12 chunks missing", "and 2 more",
                   "seq_starts: 1 of 2 chunks missing from storage (0 = elements [0, 3))")
    assert "2 = elements [6, 9), 3 = elements [9, 12)" in problem


def test_a_missing_chunk_of_the_seq_sources_extension_is_named(tmp_path, fmt):
    """A split may carry the optional per-sequence `seq_sources` array: stored whole too."""
    splits = {"train": LONG, "validation": EXAMPLE}
    root = make_dataset(tmp_path / "o", splits, fmt)
    for name, seqs in splits.items():
        group = zarr.open_group(f"{root}/{name}", mode="r+")
        group.create_array("seq_sources", shape=(len(seqs),), dtype="uint16", chunks=(3,),
                           config={"write_empty_chunks": True})[...] = np.arange(len(seqs), dtype=np.uint16) % 2
    set_attrs(root, sources=["one", "two"])  # the names the ids stand for
    assert verify_dataset(root) == []
    os.remove(chunk_path(root, "train", "seq_sources", 0, fmt))
    only(verify_dataset(root), "train: seq_sources: 1 of 2 chunks missing from storage (0 = elements [0, 3))")


def test_shards_are_counted_by_listing_a_partial_last_shard_included(tmp_path):
    """zarr 3.1's nchunks_initialized counts a stored shard's every inner chunk, so a partial
    last shard overcounts; the check lists shard objects: 26 tokens in shards of 12 is 3."""
    root = make_dataset(tmp_path / "o", {"train": LONG[:3], "validation": EXAMPLE}, 3, chunk=3, shard=12)
    tokens = zarr.open_array(f"{root}/train/encoded_tokens", mode="r")
    assert tokens.nchunks_initialized != tokens.nchunks  # the count this check does not rely on
    assert verify_dataset(root) == []
    os.remove(chunk_path(root, "train", "encoded_tokens", 2, 3))  # the partial last shard
    only(verify_dataset(root), "train: encoded_tokens: 1 of 3 shard objects missing from storage "
                               "(2 = elements [24, 26))")


# ---------------------------------------------------------------------------------------------
# Dataset level: splits, commit protocol, stats


def test_missing_split(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE}, fmt)
    only(verify_dataset(root), "missing split group validation")


def test_missing_root_metadata_is_unfinished(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE}, fmt, commit=False)
    assert verify_dataset(root) == [verify.UNFINISHED]
    assert "unfinished output" in verify.UNFINISHED and "--overwrite" in verify.UNFINISHED


@pytest.mark.parametrize("complete", [False, None, "true", 1])
def test_complete_not_true_is_unfinished(good_v2, complete):
    set_attrs(good_v2, complete=complete)
    only(verify_dataset(good_v2), "unfinished output", f"complete is {complete!r}")


def test_complete_missing_is_unfinished(tmp_path, fmt):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE}, fmt, commit=False)
    zarr.create_group(root, zarr_format=fmt)
    only(verify_dataset(root), "unfinished output", "complete is None")


def test_wrong_format_attribute(good):
    set_attrs(good, format="something-else")
    only(verify_dataset(good), "root attribute format is 'something-else'")


@pytest.mark.parametrize("key,value,want", [
    ("sequences", 4, "stats.train.sequences = 4 disagrees with train: len(seq_starts) - 1 = 3"),
    ("tokens", 9, "stats.train.tokens = 9 disagrees with train: len(encoded_tokens) = 8"),
    ("max_token_id", 7, "stats.train.max_token_id = 7 disagrees with train: the split attribute max_token_id = 8"),
    ("tokens", True, "stats.train.tokens = True"),
])
def test_stats_disagree(good_v2, key, value, want):
    stats = dict(zarr.open_group(good_v2).attrs["stats"])
    stats["train"] = dict(stats["train"], **{key: value})
    set_attrs(good_v2, stats=stats)
    only(verify_dataset(good_v2), want)


def test_stats_missing_entries(good):
    set_attrs(good, stats={"train": {"sequences": 3, "tokens": 8}, "documents": -1})
    problems = verify_dataset(good)
    assert problems == ["stats.documents must be a non-negative integer, is -1",
                        "stats.train.max_token_id missing",
                        "stats.validation missing or not an object: None"]


# ---------------------------------------------------------------------------------------------
# Bounded memory: tiny blocks, and never a read wider than the block


@pytest.mark.parametrize("block", [1, 2, 3, 7])
def test_tiny_blocks(tmp_path, block):
    # One sequence spanning many blocks, then many one-token sequences (many starts per block).
    seqs = [list(range(1, 16))] + [[t] for t in range(12)] + [[5, 6]] * 4
    root = make_dataset(tmp_path / "o", {"train": seqs, "validation": [[1]]}, 3, chunk=5)
    assert verify_dataset(root, block=block) == []
    for at in (0, 15, len(encode(seqs)[0]) - 1):
        flip_start_bit(f"{root}/train/encoded_tokens", at)
        only(verify_dataset(root, block=block), "train", "start bit wrong at 1 positions", f"first at index {at}")
        flip_start_bit(f"{root}/train/encoded_tokens", at)


class Recording:
    """An array stand-in that records the width of every read."""

    def __init__(self, data):
        self.data, self.shape, self.widths = data, data.shape, []

    def __getitem__(self, s):
        self.widths.append(s.stop - s.start)
        return self.data[s]


@pytest.mark.parametrize("block", [1, 4, 64])
def test_reads_never_exceed_the_block(block):
    seqs = [[1] * 300] + [[2]] * 500 + [[3] * 17] * 20
    tokens, starts = encode(seqs)
    tok, st = Recording(tokens), Recording(starts)
    walk = verify.walk_split(tok, st, block)
    assert walk.wrong_bits == 0 and walk.max_id == 3
    assert max(tok.widths + st.widths) <= block
    assert sum(tok.widths) == tokens.size and sum(st.widths) == starts.size  # each read once


def test_start_stream_buffer_stays_bounded():
    starts = np.arange(0, 10_000, dtype=np.uint64)  # a start at every token: the densest case
    stream = verify.StartStream(Recording(starts), 8)
    for b in range(8, 10_000, 8):
        assert stream.take_below(b).size == 8
        assert stream._buf.size <= 8


# ---------------------------------------------------------------------------------------------
# Property: any correct store passes, any single flipped start bit is found, for any block


def sequences(max_len, max_count):
    return hs.lists(hs.lists(hs.integers(0, 2**31 - 1), min_size=1, max_size=max_len), min_size=1, max_size=max_count)


@settings(max_examples=150, deadline=None)
@given(seqs=sequences(40, 60), block=hs.integers(1, 50), data=hs.data())
def test_property_walk(seqs, block, data):
    """The merge walk alone, on in-memory arrays: cheap enough for many examples and long sequences."""
    tokens, starts = encode(seqs)
    tok, st = Recording(tokens), Recording(starts)
    walk = verify.walk_split(tok, st, block)
    assert walk.wrong_bits == 0 and walk.max_id == max(max(s) for s in seqs)
    assert max(tok.widths + st.widths) <= block
    at = data.draw(hs.integers(0, tokens.size - 1), label="flip at")
    tokens[at] ^= 1
    walk = verify.walk_split(Recording(tokens), Recording(starts), block)
    assert (walk.wrong_bits, walk.first_wrong) == (1, at)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=sequences(6, 8), block=hs.integers(1, 12), fmt=hs.sampled_from([2, 3]), data=hs.data())
def test_property_store(seqs, block, fmt, data):
    """End to end on real stores: a correct store passes and a flipped start bit is found."""
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(f"{tmp}/o", {"train": seqs, "validation": seqs[:1]}, fmt, chunk=4)
        assert verify_dataset(root, block=block) == []
        at = data.draw(hs.integers(0, sum(map(len, seqs)) - 1), label="flip at")
        flip_start_bit(f"{root}/train/encoded_tokens", at)
        only(verify_dataset(root, block=block), "train", "start bit wrong at 1 positions", f"first at index {at}")


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_ok(good, capsys):
    assert main([good, "--block", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["OK: train 3 seqs 8 tokens, validation 2 seqs 3 tokens"]
    # Written here with zarr directly: no checksums, and verify says so (issue 27).
    assert captured.err.splitlines() == [verify.NO_CHECKSUMS]


def test_cli_storage_option_and_url(good, capsys):
    assert main(["file://" + good, "--storage_option", "auto_mkdir=false"]) == 0
    assert capsys.readouterr().out.startswith("OK: ")


def test_cli_violation(good, capsys):
    flip_start_bit(f"{good}/validation/encoded_tokens", 2)
    poke(f"{good}/train/seq_starts", 0, 1)
    assert main([good]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[-1] == "FAIL: 2 problems"


def test_cli_unfinished(tmp_path, capsys):
    root = make_dataset(tmp_path / "o", {"train": EXAMPLE, "validation": EXAMPLE}, commit=False)
    assert main([root]) == 1
    assert capsys.readouterr().out.splitlines() == [verify.UNFINISHED, "FAIL: 1 problem"]


def test_cli_missing_path(tmp_path, capsys):
    path = str(tmp_path / "nowhere")
    assert main([path]) == 2
    err = capsys.readouterr().err
    assert path in err and "does not exist" in err and "Traceback" not in err


def test_cli_not_a_zarr_group(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main([str(tmp_path / "x")]) == 2
    assert "is not a zarr group" in capsys.readouterr().err
    with pytest.raises(CannotOpen):
        verify_dataset(str(tmp_path / "x"))


def test_cli_bad_arguments():
    with pytest.raises(SystemExit) as e:
        main(["somewhere", "--block", "0"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["somewhere", "--storage_option", "novalue"])
