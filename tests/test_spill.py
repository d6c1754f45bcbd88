"""Shard parts' ids spilled to local disk on local runners (transforms/shuffle/spill.py)."""
import hashlib
import os
import pickle
import re

import numpy as np
import pytest

from flat_tokens.format.checksums import Damaged
from tests.helpers import run_pipeline, write_jsonl
from transforms.records import TokenizedBatch
from transforms.shuffle import spill
from transforms.shuffle.spill import SpilledFragment, fragment_values, spill_fragment
from transforms.shuffle.shuffle_globally import KeyByShard, sort_shard, split_and_shard

NUM_SHARDS = {"train": 3, "validation": 2}


def a_batch(seed=0, documents=300):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, documents)
    offsets = np.cumsum(rng.integers(10, 5000, documents)).astype(np.uint64)
    ids = rng.integers(0, 50_000, int(lengths.sum())).astype(np.uint16)
    return TokenizedBatch("0:docs/a.jsonl", "auto", offsets, lengths, ids, 0)


def files_of(directory):
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in os.listdir(directory)}


def key_by_shard(fn: KeyByShard, *batches) -> list:
    """One bundle of the DoFn, as a runner drives it: its outputs, once the bundle finished."""
    fn.setup()
    try:
        fn.start_bundle()
        out = [kp for batch in batches for kp in fn.process(batch)]
        fn.finish_bundle()
        return out
    finally:
        fn.teardown()


def test_spilled_parts_hold_the_same_documents_and_a_retry_writes_the_same_file(tmp_path):
    batch = a_batch()
    in_band = list(split_and_shard(batch, 7, 0.2, NUM_SHARDS))
    fn = KeyByShard(7, 0.2, NUM_SHARDS, str(tmp_path))
    spilled = key_by_shard(fn, batch)
    first = files_of(tmp_path)
    assert len(first) == 1, "one file per batch, whatever the number of shards it hits"
    assert len(spilled) == len(in_band) > 1
    for (key, part), (key_in_band, part_in_band) in zip(spilled, in_band):
        assert key == key_in_band and part.raw_ids is None and part.packed_ids is None and part.spilled
        assert np.array_equal(part.ids(), part_in_band.ids()) and part.ids().dtype == part_in_band.ids().dtype
        assert np.array_equal(part.offsets, part_in_band.offsets)
    assert key_by_shard(fn, batch)[0][1].spilled == spilled[0][1].spilled  # a retried bundle: same place
    assert files_of(tmp_path) == first, "a retry rewrites the same bytes under the same name, and leaves no temporary"


def test_a_shard_sorts_the_same_from_spilled_and_in_band_parts(tmp_path):
    batches = [a_batch(seed, 200) for seed in range(3)]
    batches = [TokenizedBatch(f"{i}:f{i}.jsonl", b.split, b.offsets, b.lengths, b.ids, 0) for i, b in enumerate(batches)]
    fn = KeyByShard(1, 0.0, NUM_SHARDS, str(tmp_path))
    spilled = [kp for kp in key_by_shard(fn, *batches) if kp[0] == ("train", 1)]
    in_band = [kp for b in batches for kp in split_and_shard(b, 1, 0.0, NUM_SHARDS) if kp[0] == ("train", 1)]
    a = sort_shard((("train", 1), [p for _, p in spilled]))
    b = sort_shard((("train", 1), [p for _, p in in_band]))
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.lengths, b.lengths)
    assert len(os.listdir(tmp_path)) == 3


def test_a_spilled_part_whose_file_is_gone_or_damaged_fails_with_its_path(tmp_path):
    """A part's file is checked against the Sum of the ids written to it: gone, cut short, a
    bit flipped, or another batch's file of the same size in its place, each fails naming it."""
    (_, part), *_ = key_by_shard(KeyByShard(0, 0.0, NUM_SHARDS, str(tmp_path)), a_batch())
    path = part.spilled.file.path
    good = open(path, "rb").read()
    os.remove(path)
    with pytest.raises(FileNotFoundError, match=os.path.basename(path)):
        part.ids()
    with open(path, "wb") as f:
        f.write(good[:-2])
    with pytest.raises(Damaged, match=f"shuffle spill file {re.escape(path)}: damaged: {len(good) - 2} bytes"):
        part.ids()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    with open(path, "wb") as f:
        f.write(flipped)
    with pytest.raises(Damaged, match=f"shuffle spill file {re.escape(path)}: damaged: its CRC-32C"):
        part.ids()
    with open(path, "wb") as f:  # another batch's ids, as many
        f.write(np.resize(a_batch(seed=1).ids, len(good) // 2).tobytes())
    assert os.path.getsize(path) == len(good)
    with pytest.raises(Damaged, match="damaged: its CRC-32C"):
        part.ids()
    with open(path, "wb") as f:
        f.write(good)
    assert np.array_equal(part.ids(), split_and_shard(a_batch(), 0, 0.0, NUM_SHARDS).__next__()[1].ids())


def test_a_batch_goes_on_while_its_ids_are_written_and_a_failed_write_fails_the_bundle(tmp_path):
    """The ids are written on a thread while the next batch is tokenized: the parts name the
    file at once, it holds the ids once the bundle has finished, and a write that fails
    fails the bundle (here: the spill directory is gone)."""
    batches = [TokenizedBatch(f"{i}:f{i}.jsonl", "auto", b.offsets, b.lengths, b.ids, 0)
               for i, b in enumerate(a_batch(seed, 100) for seed in range(3))]
    out = key_by_shard(KeyByShard(3, 0.1, NUM_SHARDS, str(tmp_path)), *batches)
    named = {part.spilled.file.path for _, part in out}
    assert named == {str(tmp_path / name) for name in os.listdir(tmp_path)} and len(named) == 3
    for batch in batches:
        path = spill.batch_file(str(tmp_path), batch.file_key, int(batch.offsets[0]), batch.ids).path
        assert np.array_equal(np.fromfile(path, dtype=batch.ids.dtype), batch.ids)
    gone = tmp_path / "gone"
    fn = KeyByShard(3, 0.1, NUM_SHARDS, str(gone))
    fn.setup()
    try:
        fn.start_bundle()
        parts = list(fn.process(batches[0]))
        assert parts and all(part.spilled.file.path.startswith(str(gone)) for _, part in parts)
        with pytest.raises(FileNotFoundError, match="gone"):
            fn.finish_bundle()
    finally:
        fn.teardown()


def test_only_spill_directories_are_removed(tmp_path):
    mine = spill.make_directory("run1", str(tmp_path))
    other = tmp_path / "data"
    other.mkdir()
    with pytest.raises(ValueError, match="not a shuffle spill directory"):
        spill.remove_directory(str(other))
    spill.remove_directory(mine)
    assert not os.path.exists(mine) and other.is_dir()


@pytest.mark.parametrize("outcome", ["success", "failure"])
@pytest.mark.slow
def test_a_local_run_removes_its_spill_directory_and_nothing_else(tmp_path, outcome):
    """The run's spill directory lives under --temp_location (a local path) and is gone after
    the run, whether it succeeded or failed; what was there before stays."""
    temp = tmp_path / "temp"
    (temp / f"{spill.PREFIX}someone-else").mkdir(parents=True)
    (temp / f"{spill.PREFIX}someone-else" / "x.ids").write_bytes(b"not ours")
    texts = [f"document {i} " * (i % 7 + 1) for i in range(500)]
    path = write_jsonl(tmp_path / "in.jsonl", texts)
    if outcome == "failure":
        with open(path, "a") as f:
            f.write("{not json\n")
    proc = run_pipeline("--input", path, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                        "--temp_location", temp, "--max_rejected_fraction", "0", "--verbose", check=False)
    assert proc.returncode == (0 if outcome == "success" else 1), proc.stderr[-3000:]
    used = re.search(r"shard parts wait for the sort in (\S+)", proc.stderr).group(1)
    assert os.path.dirname(used) == str(temp) and os.path.basename(used).startswith(spill.PREFIX)
    assert sorted(os.listdir(temp)) == [f"{spill.PREFIX}someone-else"]
    assert (temp / f"{spill.PREFIX}someone-else" / "x.ids").read_bytes() == b"not ours"


def test_a_spilled_fragment_holds_its_values_and_a_retry_writes_the_same_file(tmp_path):
    values = np.arange(1000, dtype=np.uint32) * 2 + 1
    key = ("train", "encoded_tokens", 7)
    k, (start, spilled) = spill_fragment((key, (1_835_000, values)), str(tmp_path))
    assert (k, start) == (key, 1_835_000) and isinstance(spilled, SpilledFragment)
    path = spilled.file.path
    first = open(path, "rb").read()
    assert spill_fragment((key, (1_835_000, values.copy())), str(tmp_path))[1][1] == spilled  # a retried bundle
    assert open(path, "rb").read() == first and os.listdir(tmp_path) == [os.path.basename(path)]
    got = fragment_values(pickle.loads(pickle.dumps(spilled)))
    assert got.dtype == values.dtype and np.array_equal(got, values)
    assert fragment_values(values) is values  # fragments of remote runs travel as they are
    # Checked against the Sum of the values written: a flipped bit fails, naming the file.
    flipped = bytearray(first)
    flipped[-1] ^= 1
    open(path, "wb").write(flipped)
    with pytest.raises(Damaged, match=f"shared-chunk fragment {re.escape(path)}: damaged"):
        fragment_values(spilled)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match=os.path.basename(path)):
        fragment_values(spilled)


def producers_of_gathered_fragments(spill_dir):
    """The labels of the steps whose outputs the shared chunks' Flatten reads, in a graph
    wired by WriteFlatTokens (nothing runs)."""
    import apache_beam as beam

    from transforms.write.chunk_writers import WriteFlatTokens

    p = beam.Pipeline()
    singleton = beam.pvalue.AsSingleton(p | "Nothing" >> beam.Create([None]))
    _ = p | beam.Create([]) | WriteFlatTokens(None, singleton, singleton, spill_dir=spill_dir)
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if node.full_label.endswith("/GatherFragments"):
                found.extend(pc.producer.full_label for pc in node.inputs)

    p.visit(Visitor())
    return found


def test_fragments_are_spilled_before_they_are_gathered_on_local_runs(tmp_path):
    """The Flatten that gathers the shared chunks' pieces breaks fusion: the in-process runner
    holds everything that crosses it in memory (measured: a peak RSS jump growing with the
    corpus, 25-37 MB at 1.25 GB of input). On local runs only the spilled pieces' names may
    cross, so every input of the Flatten is a spill step; elsewhere the pieces travel as
    they are, straight from their writers."""
    local = producers_of_gathered_fragments(str(tmp_path))
    assert len(local) == 2 and all(label.rsplit("/", 1)[1].startswith("Spill") for label in local), local
    remote = producers_of_gathered_fragments(None)
    assert len(remote) == 2 and not any("Spill" in label for label in remote), remote
