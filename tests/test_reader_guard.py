"""flat_tokens.reader never serves zeros or another dataset's data: a lost chunk raises
MissingChunk, and a reader whose dataset was deleted or replaced by `--overwrite` raises
(DatasetReplaced) instead of reading what is there now. Locally and on the GCS emulator."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

from flat_tokens import reader
from flat_tokens.reader import DatasetError, DatasetReplaced, FlatTokensSplit, MissingChunk
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, run_pipeline

CHUNK = 4096
# Small blocks and buffers, so that packed_batches goes on reading while it is served.
SMALL = {"block_tokens": 4 * 64, "buffer_blocks": 2}
# Reads of batches go past what one gather of the reader holds (16 steps a lane, docs/reader.md),
# so that a read after the change has to reach the store.


def write(corpus, out, *extra):
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction",
                 "0", "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size", "16", *extra)
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory, corpus):
    return write(corpus, tmp_path_factory.mktemp("guard") / "a.zarr")


@pytest.fixture
def dataset(written, tmp_path, monkeypatch):
    """A fresh copy of the pipeline's dataset, for a test to damage; iterators read it in
    small pieces, so they go on reading after the first."""
    monkeypatch.setattr(reader, "TOKENS_READ", CHUNK)
    monkeypatch.setattr(reader, "STARTS_READ", 16)
    return shutil.copytree(written, tmp_path / "a.zarr")


@pytest.mark.slow
def test_a_lost_chunk_raises_where_plain_zarr_reads_zeros(dataset):
    (dataset / "train" / "encoded_tokens" / "1").unlink()
    plain = zarr.open_group(str(dataset), mode="r")["train"]["encoded_tokens"]
    assert not plain[CHUNK:2 * CHUNK].any()  # the hazard: zarr serves the fill value, 0
    train = FlatTokensSplit(str(dataset))
    assert train.packed(0, CHUNK).any()  # other chunks are read as ever
    with pytest.raises(MissingChunk, match="encoded_tokens/1"):
        train.packed(1, CHUNK)
    with pytest.raises(MissingChunk):
        list(train)
    with pytest.raises(MissingChunk):
        train.packed_batch([0, 1], CHUNK)
    with pytest.raises(MissingChunk):
        list(train.packed_batches(64, 8, epochs=1))


def test_a_lost_seq_starts_chunk_raises(dataset):
    (dataset / "train" / "seq_starts" / "2").unlink()
    train = FlatTokensSplit(str(dataset))
    assert train.sequence(0).size
    with pytest.raises(MissingChunk, match="seq_starts/2"):
        train.sequence(40)
    with pytest.raises(MissingChunk):
        train.sequence_lengths()
    with pytest.raises(MissingChunk):
        list(train.iter_sequences(30, 50))


def test_a_deleted_dataset_raises(dataset):
    train = FlatTokensSplit(str(dataset))
    sequences, batches = iter(train), train.packed_batches(64, 4, **SMALL)
    next(sequences), next(batches)
    shutil.rmtree(dataset)
    for read in (lambda: train.sequence(0), lambda: train.packed(3, 64), lambda: list(sequences),
                 lambda: [next(batches) for _ in range(100)], lambda: pickle.loads(pickle.dumps(train))):
        with pytest.raises(DatasetError):
            read()


@pytest.mark.slow
def test_a_dataset_replaced_by_overwrite_raises(dataset, corpus):
    train = FlatTokensSplit(str(dataset))
    before = train.sequence(0)
    sequences, batches = iter(train), train.packed_batches(64, 4, **SMALL)
    next(sequences), next(batches)
    old_state = pickle.dumps(train)
    write(corpus, dataset, "--overwrite", "--seed", "1")  # same documents and shapes (no validation split), another order
    new = FlatTokensSplit(str(dataset))
    assert (new.num_tokens, len(new)) == (train.num_tokens, len(train)) and new.run_id != train.run_id
    assert not np.array_equal(new.sequence(0), before)  # so zarr would read the new run's data silently
    for read in (lambda: train.sequence(0), lambda: train.packed(3, 64), lambda: train.packed_batch([1, 2], 64),
                 lambda: list(sequences), lambda: [next(batches) for _ in range(100)],
                 lambda: train.sequence_lengths(), lambda: pickle.loads(old_state)):
        with pytest.raises(DatasetReplaced, match=train.run_id):
            read()
    assert len(pickle.loads(pickle.dumps(new))) == len(new)  # the new dataset reads as ever


WORKER = """
import json, pickle, sys
from flat_tokens import reader
from flat_tokens.reader import FlatTokensSplit
reader.TOKENS_READ, reader.STARTS_READ = 4096, 16  # iterators go on reading after the first piece
split = FlatTokensSplit(sys.argv[1])
batches = split.packed_batches(64, 4, block_tokens=256, buffer_blocks=2)
sequences = iter(split)
next(batches), next(sequences)
state = pickle.dumps(split)
print("opened", flush=True)
sys.stdin.readline()  # the test changes the dataset meanwhile
reads = {"sequence 0": lambda: split.sequence(0), "window 0": lambda: split.packed(0, 64),
         "the open iteration": lambda: list(sequences), "every sequence": lambda: list(split), "batches": lambda: [next(batches) for _ in range(100)],
         "unpickled": lambda: pickle.loads(state).sequence(len(split) - 1)}
found = {}
for name, read in reads.items():
    try:
        read()
        found[name] = "ok"
    except Exception as e:
        found[name] = type(e).__name__
print(json.dumps(found), flush=True)
"""


def reads_after(gcs, url, change) -> dict:
    """Opens `url` in another process (gcsfs picks its class from the environment there), lets
    `change()` act on the dataset, then returns what each read of the open reader did."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url], cwd=REPO, env={**os.environ, **gcs.env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "opened", proc.stderr.read()[-3000:]
        change()
        out, err = proc.communicate("go\n", timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("change", ["deleted", "overwritten", "lost chunk"])
@pytest.mark.slow
def test_on_gcs(gcs, written, corpus, change):
    name = f"guard-{change.replace(' ', '-')}.zarr"
    gcs.fs.put(str(written) + "/", f"{BUCKET}/{name}/", recursive=True)
    url = f"gs://{BUCKET}/{name}"
    actions = {
        "deleted": lambda: gcs.fs.rm(f"{BUCKET}/{name}", recursive=True),
        "overwritten": lambda: run_pipeline(
            "--input", f"{corpus}/*.jsonl", "--output", url, "--tokenizer", "bytes", "--validation_fraction", "0",
            "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size", "16", "--overwrite", "--seed", "1",
            env=gcs.env),
        "lost chunk": lambda: gcs.fs.rm(f"{BUCKET}/{name}/train/encoded_tokens/0"),
    }
    found = reads_after(gcs, url, actions[change])
    if change == "lost chunk":
        # The open iteration and the batches have read chunk 0 already, before it was lost.
        assert found == {"sequence 0": "MissingChunk", "window 0": "MissingChunk", "the open iteration": "ok",
                         "every sequence": "MissingChunk", "batches": found["batches"], "unpickled": "ok"}
        assert found["batches"] in ("ok", "MissingChunk")
    elif change == "overwritten":
        assert found == dict.fromkeys(found, "DatasetReplaced") and len(found) == 6
    else:
        assert set(found.values()) <= {"MissingChunk", "DatasetReplaced", "DatasetError"} and len(found) == 6, found


@pytest.mark.slow
def test_a_lost_shard_raises_with_zarr_3(corpus, tmp_path):
    out = write(corpus, tmp_path / "v3.zarr", "--zarr_format", "3", "--chunks_per_shard", "2")
    (out / "train" / "encoded_tokens" / "c" / "1").unlink()  # one shard object: chunks 2 and 3
    train = FlatTokensSplit(str(out))
    assert train.packed(1, CHUNK).any()
    with pytest.raises(MissingChunk, match="encoded_tokens/c/1"):
        train.packed(2, CHUNK)
