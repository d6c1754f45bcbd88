"""The reader checks what it serves (issue 37, cases 5 and 6): datasets written by the real
pipeline, then edited as a bad sync, a wrong restore or a hand edit would, every chunk still
matching the checksum it carries. The reader, `for ids in split`, Blend, inspect and export
raise a DatasetError naming the array and the index at fault: never zeros, never an endless
loop (flat_tokens/served_checks.py)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

from flat_tokens import reader
from flat_tokens.blend import Blend
from flat_tokens.reader import DatasetError, FlatTokensSplit, InconsistentData
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, remove_manifest, run_pipeline

CHUNK = 4096
STARTS_CHUNK = 16
TIMEOUT = 60  # a read that loops forever fails the test instead of hanging it


def write(corpus, out, *extra):
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction",
                 "0", "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size", str(STARTS_CHUNK), *extra)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory, corpus):
    """Two builds of one corpus, the second with another seed (so another order), zarr 2; and a
    zarr 3 build."""
    root = tmp_path_factory.mktemp("serves")
    return {"a": write(corpus, root / "a.zarr"), "seed 1": write(corpus, root / "b.zarr", "--seed", "1"),
            "zarr 3": write(corpus, root / "v3.zarr", "--zarr_format", "3")}


@pytest.fixture
def copy_of(builds, tmp_path, monkeypatch):
    """A fresh copy of a build, for a test to edit; iterators read it in small pieces. The copy
    has no manifest: these checks are what stands where no manifest binds the metadata and
    chunks (a dataset from before manifests, or another tool's); with one, the manifest refuses
    each edit here first (tests/test_manifest.py)."""
    monkeypatch.setattr(reader, "TOKENS_READ", CHUNK)
    monkeypatch.setattr(reader, "STARTS_READ", STARTS_CHUNK)

    def copy(name="a"):
        dataset = shutil.copytree(builds[name], tmp_path / f"{name.replace(' ', '-')}.zarr")
        remove_manifest(dataset)
        return dataset
    return copy


def set_token_count(dataset, count_of):
    """Edits train/encoded_tokens' shape in its metadata (.zarray, or zarr.json for zarr 3)."""
    array = dataset / "train" / "encoded_tokens"
    path = array / ".zarray" if (array / ".zarray").exists() else array / "zarr.json"
    meta = json.loads(path.read_text())
    meta["shape"] = [count_of(meta["shape"][0])]
    path.write_text(json.dumps(meta))
    return meta["shape"][0]


def python(code: str, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


EVERY_SEQUENCE = """
import sys
from flat_tokens.reader import FlatTokensSplit
try:
    split = FlatTokensSplit(sys.argv[1])
    print(sum(ids.size for ids in split))
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.parametrize("build", ["a", "zarr 3"])
def test_a_token_shape_smaller_than_seq_starts_end_raises_instead_of_looping(copy_of, tmp_path, build):
    """Case 6: `for ids in split` and export looped forever at 100% CPU."""
    dataset = copy_of(build)
    ends_at = int(zarr.open_group(str(dataset), mode="r")["train"]["seq_starts"][-1])
    set_token_count(dataset, lambda n: n - 100)
    found = python(EVERY_SEQUENCE, dataset).stdout.strip()
    assert found.startswith("InconsistentData") and "train/seq_starts[" in found and str(ends_at) in found, found
    assert f"encoded_tokens has {ends_at - 100} tokens" in found
    exported = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", str(dataset),
                               str(tmp_path / "mega" / "out")], cwd=REPO, capture_output=True, text=True,
                              timeout=TIMEOUT)
    assert exported.returncode == 2 and "train/seq_starts[" in exported.stderr, exported.stderr[-2000:]
    inspected = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", str(dataset)], cwd=REPO,
                               capture_output=True, text=True, timeout=TIMEOUT)
    assert inspected.returncode == 2 and "train/seq_starts[" in inspected.stderr, inspected.stderr[-2000:]


@pytest.mark.slow
def test_on_gcs_a_token_shape_smaller_than_seq_starts_end_raises_instead_of_looping(copy_of, gcs):  # noqa: F811
    dataset = copy_of("a")
    ends_at = int(zarr.open_group(str(dataset), mode="r")["train"]["seq_starts"][-1])
    set_token_count(dataset, lambda n: n - 100)
    gcs.fs.put(str(dataset) + "/", f"{BUCKET}/serves-smaller.zarr/", recursive=True)
    found = python(EVERY_SEQUENCE, f"gs://{BUCKET}/serves-smaller.zarr", env={**os.environ, **gcs.env})
    said = found.stdout + found.stderr[-2000:]
    assert found.stdout.startswith("InconsistentData") and f"encoded_tokens has {ends_at - 100} tokens" in said, said


@pytest.mark.parametrize("build", ["a", "zarr 3"])
def test_a_token_shape_larger_than_seq_starts_end_raises_instead_of_serving_zeros(copy_of, build):
    dataset = copy_of(build)
    n = set_token_count(dataset, lambda n: n + 100)
    plain = zarr.open_group(str(dataset), mode="r")["train"]["encoded_tokens"]
    assert not plain[n - 100:n].any()  # the hazard: zarr serves the fill value past the data
    with pytest.raises(InconsistentData, match=rf"train/seq_starts\[\d+\].* is {n - 100}, but encoded_tokens has "
                                               rf"{n} tokens"):
        FlatTokensSplit(str(dataset))
    with pytest.raises(DatasetError):
        reader.open_dataset(str(dataset))


def test_a_seq_starts_chunk_from_another_build_raises(copy_of):
    """A seq_starts chunk copied from a build of the same corpus with another seed: it carries
    a valid checksum, its entries increase, and they point at other sequences' boundaries."""
    dataset, other = copy_of("a"), copy_of("seed 1")
    shutil.copyfile(other / "train" / "seq_starts" / "2", dataset / "train" / "seq_starts" / "2")
    plain = zarr.open_group(str(dataset), mode="r")["train"]["seq_starts"][:]
    assert not (np.diff(plain.astype(np.int64)) > 0).all()  # overlapping sequences, served as such before
    split = FlatTokensSplit(str(dataset))
    assert split.sequence(0).size and split.sequence(30).size  # what precedes the foreign chunk reads as ever
    with pytest.raises(InconsistentData, match=r"train/seq_starts\[32\] \(chunk 2\) is \d+, not greater than "
                                               r"seq_starts\[31\]"):
        list(split)
    with pytest.raises(InconsistentData, match=r"train/seq_starts\[3[2-9]\]"):
        split.sequence(35)  # inside the foreign chunk: its boundary is not a start of this split
    with pytest.raises(InconsistentData, match=r"seq_starts\[32\]"):
        split.sequence_lengths()
    with pytest.raises(InconsistentData):
        list(split.iter_encoded(20, 60))


def test_export_and_inspect_of_a_seq_starts_chunk_from_another_build_fail_naming_it(copy_of, tmp_path):
    dataset, other = copy_of("a"), copy_of("seed 1")
    shutil.copyfile(other / "train" / "seq_starts" / "2", dataset / "train" / "seq_starts" / "2")
    exported = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", str(dataset),
                               str(tmp_path / "mega" / "out"), "--part_tokens", "4096"], cwd=REPO,
                              capture_output=True, text=True, timeout=TIMEOUT)
    assert exported.returncode in (1, 2) and "train/seq_starts[32] (chunk 2)" in exported.stderr.splitlines()[-1], \
        exported.stderr[-3000:]
    inspected = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", str(dataset)], cwd=REPO,
                               capture_output=True, text=True, timeout=TIMEOUT)
    assert inspected.returncode == 2 and "train/seq_starts[32]" in inspected.stderr, inspected.stderr[-2000:]


def test_an_id_above_max_token_id_raises(copy_of):
    dataset = copy_of("a")
    split = FlatTokensSplit(str(dataset))
    ids = np.concatenate(list(split))
    attrs_path = dataset / "train" / ".zattrs"
    attrs = json.loads(attrs_path.read_text())
    lowered = attrs["max_token_id"] - 5  # ids above it are in the data
    attrs["max_token_id"] = lowered
    attrs_path.write_text(json.dumps(attrs))
    first = int(np.argmax(ids > lowered))
    split = FlatTokensSplit(str(dataset))
    expected = rf"train/encoded_tokens\[{first}\] \(chunk {first // CHUNK}\) holds token id {ids[first]}, above the " \
               rf"split's max_token_id {lowered}"
    for read in (lambda: list(split), lambda: split.packed(first // 64, 64),
                 lambda: split.packed_batch([first // 64], 64), lambda: list(split.packed_batches(64, 4, epochs=1)),
                 lambda: next(Blend([split, split], weights=[1, 1]).packed_batches(64, 4))):
        with pytest.raises(InconsistentData, match=r"train/encoded_tokens\[\d+\].* above the split's max_token_id"):
            read()
    with pytest.raises(InconsistentData, match=expected):
        list(split)


def test_an_unedited_dataset_reads_as_before(copy_of):
    """The checks find nothing in what the pipeline writes: every sequence, window and length."""
    dataset = copy_of("a")
    split = FlatTokensSplit(str(dataset))
    sequences = list(split)
    assert len(sequences) == len(split) and sum(s.size for s in sequences) == split.num_tokens
    assert all(np.array_equal(split.sequence(i), sequences[i]) for i in range(0, len(split), 37))
    assert (split.sequence_lengths() > 0).all()
    # an epoch is num_windows // B full batches (docs/reader.md: the leftover windows sit out)
    assert sum(t.size for _, t in split.packed_batches(64, 4, epochs=1)) == split.num_windows(64) // 4 * 4 * 64


def test_bench_served_checks_smoke(builds):
    """benchmarks/bench_served_checks.py times the checks inside both reading loops."""
    proc = subprocess.run([sys.executable, "benchmarks/bench_served_checks.py", "--dataset", str(builds["a"]),
                           "--rounds", "1", "--length", "64", "--batch", "4"], cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.lstrip().startswith(("for ids", "packed_batches"))]
    assert len(rows) == 2 and all(row[-1].endswith("%") and int(row[-2]) > 0 for row in rows), proc.stdout


def test_the_checks_name_an_empty_sequence_an_overlap_and_a_break_between_reads():
    """SplitChecks on arrays as a foreign or edited seq_starts chunk would give them."""
    from flat_tokens.served_checks import SplitChecks
    checks = SplitChecks("ds.zarr", "train", num_tokens=100, num_sequences=5, max_token_id=9, tokens_chunk=8,
                         starts_chunk=4)
    checks.starts(np.array([0, 10, 20, 30], np.uint64), 0)
    checks.starts(np.array([40, 100], np.uint64), 4, previous=30)
    cases = {
        r"seq_starts\[2\] \(chunk 0\) is 10, not greater than seq_starts\[1\] = 10 \(an empty sequence\)":
            lambda: checks.starts(np.array([0, 10, 10, 30], np.uint64), 0),
        r"seq_starts\[3\] \(chunk 0\) is 5, not greater than seq_starts\[2\] = 20 \(overlapping sequences\)":
            lambda: checks.starts(np.array([10, 20, 5], np.uint64), 1),
        r"seq_starts\[4\] \(chunk 1\) is 25, not greater than seq_starts\[3\] = 30":
            lambda: checks.starts(np.array([25, 100], np.uint64), 4, previous=30),
        r"seq_starts\[5\] \(chunk 1\) is 90, but encoded_tokens has 100 tokens":
            lambda: checks.starts(np.array([40, 90], np.uint64), 4),
        r"seq_starts\[0\] \(chunk 0\) is 3, not 0": lambda: checks.starts(np.array([3, 10], np.uint64), 0),
        r"encoded_tokens\[13\] \(chunk 1\) holds token id 10, above the split's max_token_id 9":
            lambda: checks.tokens(np.array([19, 18, 21, 20], np.uint32), 11),
        r"seq_starts\[3\] \(chunk 0\) = 12 points at a token without the start bit":
            lambda: checks.sequences_begin(np.array([3, 4, 6, 6], np.uint32), np.array([0, 2]), 2, 10),
    }
    for message, check in cases.items():
        with pytest.raises(InconsistentData, match=message):
            check()
    checks.tokens(np.array([19, 18, 2, 0], np.uint32), 0)  # id 9, the maximum, passes
