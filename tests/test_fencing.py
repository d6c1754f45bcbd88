"""Fencing (issue 27.2): a writer that lost the output can never change another run's objects.

Every write is create-only (transforms/create_only.py): the same bytes already there are
this write's own (a retry), other bytes are a conflict that replaces nothing; a run that
lost the output takes back exactly what it created, never an object another writer has made
its own. An output holding a conflict record, or committed by a run that no longer holds
its newest claim, is refused by the reader, `verify` and `export`. Local paths and the GCS
emulator. (The stalled-writer runs themselves: tests/test_output_safety.py.)"""
import dataclasses
import json
import os
import subprocess
import sys
import uuid

import fsspec
import pytest

from flat_tokens.tools import verify
from flat_tokens.reader import DatasetError, open_dataset
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, run_pipeline, write_jsonl
from tests.test_output_safety import CHUNKS, digest, small_job, write_all
from transforms import create_only
from transforms.create_only import Ledger, ObjectConflict
from transforms.write import CreateOutput, ownership
from transforms.write.commit import CommitFn
from transforms.write.ownership import CONFLICT_PREFIX, OutputError


@pytest.fixture(params=["local", "gs"])
def store(request, tmp_path):
    """(filesystem, a directory on it)."""
    if request.param == "local":
        return fsspec.filesystem("file"), str(tmp_path / "objects")
    emulator = request.getfixturevalue("gcs")
    return emulator.fs, f"{BUCKET}/fencing-{uuid.uuid4().hex[:8]}"


def read(fs, path):
    fs.invalidate_cache()
    return fs.cat_file(path)


def test_a_put_creates_finds_its_own_bytes_and_never_replaces_other_bytes(store):
    fs, base = store
    path = f"{base}/train/encoded_tokens/7"
    ledger = Ledger()
    assert create_only.put_new(fs, path, b"chunk seven", ledger) == "created"
    assert list(ledger.created) == [path]
    retry = Ledger()
    assert create_only.put_new(fs, path, b"chunk seven", retry) == "found"  # a retried write: done
    assert list(retry.found) == [path] and not retry.created
    other = Ledger()
    with pytest.raises(ObjectConflict, match="another object"):
        create_only.put_new(fs, path, b"another run's chunk", other)
    assert other.conflicts == [path]
    assert read(fs, path) == b"chunk seven"
    assert [p for p in fs.find(base) if p.endswith(create_only.PARTIAL)] == []


def test_a_writer_takes_back_only_what_it_created_never_what_another_made_its_own(store):
    """The stalled writer created an object (the owner had not written that name yet); the
    owner found the same bytes there and made the object its own. Taking back by identity
    then leaves it alone; an object nobody adopted is taken back."""
    fs, base = store
    adopted, stray = f"{base}/c/0", f"{base}/c/1"
    stalled = Ledger()
    create_only.put_new(fs, adopted, b"same bytes", stalled)
    create_only.put_new(fs, stray, b"only the stalled run writes this", stalled)
    owner = Ledger()
    assert create_only.put_new(fs, adopted, b"same bytes", owner) == "found"
    create_only.adopt(fs, adopted, b"same bytes", owner.found[adopted][0], owner)
    assert not create_only.take_back(fs, adopted, stalled.created[adopted])
    assert read(fs, adopted) == b"same bytes"
    assert create_only.take_back(fs, stray, stalled.created[stray])
    fs.invalidate_cache()
    assert not fs.exists(stray)
    assert not create_only.take_back(fs, stray, stalled.created[stray])  # twice: nothing more


def test_a_run_that_finds_other_bytes_where_it_writes_leaves_a_conflict_record_and_never_commits(tmp_path):
    """Other bytes at a chunk this run owns (a stalled run's late write): nothing is replaced;
    the run fails, and its conflict record keeps the output from being resumed or read."""
    a, shards, layout = small_job(tmp_path, "run-a")
    out = tmp_path / "o.zarr"
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    (out / "train" / "encoded_tokens" / "2").write_bytes(b"a stalled run's chunk")
    with pytest.raises(OutputError, match=r"train/encoded_tokens/2: another object \(other bytes\) was already "
                                          r"where this run \(run-a\) wrote"):
        write_all(a, shards, layout)
    assert (out / "train" / "encoded_tokens" / "2").read_bytes() == b"a stalled run's chunk"
    assert (out / f"{CONFLICT_PREFIX}run-a").exists()
    with pytest.raises(OutputError, match="another run may have written into this output"):
        CommitFn(a, {"run_id": "run-a"}).commit(CHUNKS, layout, {"lines": 4, "documents": 4})


def test_a_retried_write_and_a_retried_commit_find_their_own_objects(tmp_path):
    a, shards, layout = small_job(tmp_path, "run-a")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    write_all(a, shards, layout)
    CommitFn(a, {"run_id": "run-a"}).commit(CHUNKS, layout, {"lines": 4, "documents": 4})
    first = digest(tmp_path / "o.zarr")
    write_all(a, shards, layout)  # every bundle run again
    CommitFn(a, {"run_id": "run-a"}).commit(CHUNKS, layout, {"lines": 4, "documents": 4})
    assert digest(tmp_path / "o.zarr") == first
    assert verify.verify_dataset(str(tmp_path / "o.zarr")) == []


def refusals_of_every_reader(out) -> list[str]:
    """What the reader, `verify` and `export` say of the dataset at `out`."""
    said = []
    with pytest.raises(DatasetError) as refused:
        open_dataset(str(out))
    said.append(str(refused.value))
    said.append("\n".join(verify.verify_dataset(str(out))))
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", str(out),
                           str(out.parent / "megatron" / "x")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    said.append(proc.stderr)
    return said


@pytest.fixture
def committed(tmp_path):
    out = tmp_path / "out.zarr"
    src = write_jsonl(tmp_path / "in.jsonl", [f"document {i} " + "text " * (i % 9) for i in range(200)])
    run_pipeline("--input", src, "--tokenizer", "bytes", "--output", out, "--quiet")
    assert verify.verify_dataset(str(out)) == []
    open_dataset(str(out))
    return out


@pytest.mark.slow
def test_the_reader_verify_and_export_refuse_an_output_holding_a_conflict_record(committed):
    (committed / f"{CONFLICT_PREFIX}stalled-run").write_text("train shard 3's chunks of run stalled-run ...")
    for said in refusals_of_every_reader(committed):
        assert f"conflict record {CONFLICT_PREFIX}stalled-run: another run may have written into this output" \
               in said, said


@pytest.mark.slow
def test_the_reader_verify_and_export_refuse_a_commit_by_a_run_that_does_not_hold_the_newest_claim(committed):
    """A stalled run's commit landing in an output another run has claimed since (and that
    could not be taken back) must not be served as a dataset."""
    run_id = json.loads((committed / ".zattrs").read_text())["run_id"]
    (committed / ".flat-tokens-run.2").write_text(json.dumps({"run_id": "newer-run", "generation": 2}))
    for said in refusals_of_every_reader(committed):
        assert (f"run newer-run holds the output's newest claim (.flat-tokens-run.2), not run {run_id}, which "
                f"committed this dataset") in said, said


def test_an_owner_confirming_its_write_makes_found_objects_its_own(tmp_path):
    """A resumed run (same job) finds an earlier attempt's chunks in place: once it confirms
    it owns the output, each becomes its own object (a new identity), so a stalled writer of
    that earlier attempt can no longer take it back."""
    a, shards, layout = small_job(tmp_path, "run-a")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    write_all(a, shards, layout)
    chunk = tmp_path / "o.zarr" / "train" / "encoded_tokens" / "0"
    before = os.stat(chunk)
    b = dataclasses.replace(a, run_id="run-b")
    ownership.claim(b.url, "run-b", 2)
    with ownership.fenced(b.url, "run-b", "a chunk", None) as lease:
        assert create_only.put_new(fsspec.filesystem("file"), str(chunk), chunk.read_bytes(), lease.ledger) == "found"
    after = os.stat(chunk)
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    assert list(lease.ledger.created) == [str(chunk)]
