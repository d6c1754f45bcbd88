"""Never delete what is not ours: --overwrite replaces only an empty directory or this tool's
own output, checked down the whole tree; outputs that hold inputs or the rejected-lines
directory are refused; a user's files in the rejected-lines directory survive; two runs
racing for one output never leave a mixture that verifies nor delete a committed result
silently, and a run taking over one that still writes waits for its writes in flight;
`verify` finds a lost chunk; a truncated compressed input is named. Every case checks that
the user's unrelated files survive byte for byte."""
import dataclasses
import gzip
import hashlib
import json
import os
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait

import fsspec
import numpy as np
import pytest
import zarr
import zstandard

from flat_tokens.tools import verify
from tests.gcs_emulator import BUCKET, gcs, gcs_corpus  # noqa: F401 - pytest fixtures
from tests.helpers import REPO, check_flat_tokens, run_pipeline, write_jsonl
from transforms import processes
from transforms.records import SortedShard
from transforms.write import layout as plan
from transforms.write import CreateOutput, ownership
from transforms.write.chunk_writers import WriteEndMarkers, WriteOwnedChunks, WriteSharedChunks
from transforms.write.commit import CommitFn
from transforms.write.ownership import CONFLICT_PREFIX, STAGING, OutputError, OutputTaken
from transforms.write.zarr_store import StoreTarget

BYTES = ["--tokenizer", "bytes"]


def digest(path) -> dict:
    """sha256 of every file under `path` (or of `path` itself), by relative name."""
    path = str(path)
    if os.path.isfile(path):
        return {".": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    out = {}
    for root, dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
        for name in dirs:
            out.setdefault(os.path.relpath(os.path.join(root, name), path) + "/", "dir")
    return out


@pytest.fixture
def small_input(tmp_path):
    texts = [f"document number {i}, " + "word " * (i % 7) for i in range(60)]
    return write_jsonl(tmp_path / "in" / "docs.jsonl", texts)


def users_home(root):
    """A directory a user cares about: files, a subdirectory, more names than a message lists."""
    (root / "projects").mkdir(parents=True)
    (root / "notes.txt").write_text("precious\n")
    (root / "projects" / "main.py").write_text("print('code')\n")
    for i in range(5):
        (root / f"photo-{i}.jpg").write_bytes(bytes(range(i, 200)))
    return root


# ---------------------------------------------------------------------------------------------
# 1. --overwrite replaces only this tool's output


@pytest.mark.parametrize("overwrite", [["--overwrite"], []])
@pytest.mark.slow
def test_a_directory_that_is_not_a_dataset_is_refused(tmp_path, small_input, overwrite):
    home = users_home(tmp_path / "home")
    before = digest(home)
    proc = run_pipeline("--input", small_input, *BYTES, "--output", home, *overwrite, check=False)
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert f"--output {home}: holds notes.txt, photo-0.jpg" in message, message
    assert "and 2 more" in message and "not a flat-tokens dataset" in message and "refusing to delete it" in message
    assert digest(home) == before


def test_a_file_is_refused(tmp_path, small_input):
    target = tmp_path / "file.txt"
    target.write_text("hi\n")
    proc = run_pipeline("--input", small_input, *BYTES, "--output", target, "--overwrite", check=False)
    assert proc.returncode == 2 and "is a file, not a flat-tokens dataset" in proc.stderr, proc.stderr
    assert target.read_text() == "hi\n"


def test_a_zarr_store_written_by_something_else_is_refused(tmp_path, small_input):
    """Even one that calls itself flat-tokens: only this tool's claim (or an earlier version's
    full provenance) makes a store replaceable."""
    other = tmp_path / "other.zarr"
    root = zarr.open_group(str(other), mode="w", zarr_format=2)
    root.attrs.update({"format": "flat-tokens", "complete": True, "run_id": "not-ours"})
    for split in ("train", "validation"):
        root.create_group(split).create_array("encoded_tokens", shape=(4,), dtype="uint32")
    before = digest(other)
    proc = run_pipeline("--input", small_input, *BYTES, "--output", other, "--overwrite", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "holds .zattrs, .zgroup, train/, validation/: not a flat-tokens dataset" in proc.stderr, proc.stderr
    assert digest(other) == before


@pytest.mark.slow
def test_a_dataset_holding_a_users_file_is_refused(tmp_path, small_input):
    out = tmp_path / "out.zarr"
    run_pipeline("--input", small_input, *BYTES, "--output", out)
    (out / "my-notes.md").write_text("my analysis of this dataset\n")
    before = digest(out)
    proc = run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite", check=False)
    assert proc.returncode == 2 and "holds my-notes.md: not a flat-tokens dataset" in proc.stderr, proc.stderr
    assert digest(out) == before


@pytest.mark.slow
def test_zarrs_temporary_files_of_a_write_in_flight_are_ours_and_a_lookalike_is_not(tmp_path, small_input):
    # zarr writes every object under a temporary name (`.zattrs.<hex>.partial`) and renames
    # it: a run launched while another writes (or after one was killed mid-write) finds them.
    out = tmp_path / "out.zarr"
    run_pipeline("--input", small_input, *BYTES, "--output", out)
    partial = f"{uuid.uuid4().hex}.partial"
    for name in (f".zattrs.{partial}", f"train/.zattrs.{partial}", f"train/seq_starts/.zarray.{partial}",
                 f"validation/encoded_tokens/0.{partial}"):
        (out / name).write_text("{}")
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")
    assert not list(out.rglob("*.partial"))
    (out / "train" / f"notes.{partial}").write_text("mine")
    before = digest(out)
    proc = run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite", check=False)
    assert proc.returncode == 2 and f"train/notes.{partial}" in proc.stderr, proc.stderr
    assert digest(out) == before


@pytest.mark.slow
def test_overwrite_replaces_this_tools_outputs_and_nothing_beside_them(tmp_path, small_input):
    """An empty directory, a committed dataset, an unfinished output (a failed run's) and a
    dataset of an earlier version without a claim are all replaced; a sibling file is not."""
    (tmp_path / "sibling.txt").write_text("beside the output\n")
    out = tmp_path / "out.zarr"
    out.mkdir()
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")  # an empty directory
    first = json.loads(next(out.glob(".flat-tokens-run.*")).read_text())["run_id"]
    assert zarr.open_group(str(out), mode="r").attrs["run_id"] == first
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")  # a committed dataset
    assert sorted(p.name for p in out.glob(".flat-tokens-run.*")) == [".flat-tokens-run.2"]
    # An unfinished output: a run that fails at its rejected-lines gate, after creating the arrays.
    bad = write_jsonl(tmp_path / "bad" / "bad.jsonl", ["fine"] * 5)
    with open(bad, "a") as f:
        f.write("{not json\n")
    proc = run_pipeline("--input", bad, *BYTES, "--output", out, "--overwrite", check=False)
    assert proc.returncode == 1 and verify.verify_dataset(str(out)) != []
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")
    assert verify.verify_dataset(str(out)) == []
    # A dataset an earlier version wrote: no claim, but that version's provenance.
    for claim in out.glob(".flat-tokens-run.*"):
        claim.unlink()
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")
    check_flat_tokens(out, "--input", small_input, *BYTES)
    assert (tmp_path / "sibling.txt").read_text() == "beside the output\n"


@pytest.mark.slow
def test_the_optional_seq_sources_array_is_this_tools_too(tmp_path, small_input):
    """A split's `seq_sources` (the per-sequence sources extension) is an array the layout
    writes: an output holding one is replaced, and a file beside its chunks is not ours."""
    out = tmp_path / "out.zarr"
    run_pipeline("--input", small_input, *BYTES, "--output", out)
    sources = zarr.open_group(str(out / "train"), mode="r+").create_array(
        "seq_sources", shape=(40,), dtype="uint16", chunks=(16,), config={"write_empty_chunks": True})
    sources[...] = np.zeros(40, np.uint16)
    assert ownership.inspect_output(str(out)).kind == "dataset"
    (out / "train" / "seq_sources" / "notes.txt").write_text("mine\n")
    assert ownership.inspect_output(str(out)).foreign == ("train/seq_sources/notes.txt",)
    (out / "train" / "seq_sources" / "notes.txt").unlink()
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite")
    assert not (out / "train" / "seq_sources").exists()


@pytest.mark.slow
def test_a_users_file_that_appears_while_the_output_is_replaced_is_left_there(tmp_path, small_input):
    """The check before deleting passed; then someone puts a file into train/. The deletion
    removes only what the layout wrote, object by object, and refuses what is left."""
    out = tmp_path / "out.zarr"
    run_pipeline("--input", small_input, *BYTES, "--output", out)
    ownership.claim(str(out), "run-b", 2)
    (out / "train" / "NOTES.txt").write_text("written during the replacement\n")
    with pytest.raises(OutputError, match=r"train/NOTES.txt appeared while this run replaced the output; this tool "
                                          r"did not write it, so it was left there"):
        ownership.remove_replaced(str(out), "run-b")
    assert (out / "train" / "NOTES.txt").read_text() == "written during the replacement\n"
    assert sorted(os.listdir(out / "train")) == ["NOTES.txt"]


# ---------------------------------------------------------------------------------------------
# 2. Outputs that hold an input or the rejected-lines directory


@pytest.mark.parametrize("overwrite", [["--overwrite"], []])
@pytest.mark.slow
def test_an_output_holding_an_input_is_refused(tmp_path, overwrite):
    """`--input data/ --output data/out.zarr`: the first run is fine; a rerun used to find its
    own output among the input directory's files and refuse (issue 27.8): the listing now
    leaves this tool's outputs out, so the rerun reads what the first run read. An output
    that holds an input file is still refused: replacing it would delete the input."""
    data = tmp_path / "data"
    write_jsonl(data / "docs.jsonl", ["one document", "another"])
    out = data / "out.zarr"
    run_pipeline("--input", data, *BYTES, "--output", out)
    subprocess.run(["cp", "-r", str(out), str(tmp_path / "first.zarr")], check=True)
    before = digest(data)
    proc = run_pipeline("--input", data, *BYTES, "--output", out, *overwrite)
    assert "left out this tool's own output" in proc.stderr and f"{out}/" in proc.stderr, proc.stderr
    if not overwrite:  # the same command: already built, nothing rewritten
        assert "already built by run" in proc.stderr and digest(data) == before, proc.stderr
    check_flat_tokens(out, "--compare", tmp_path / "first.zarr")
    assert (data / "docs.jsonl").read_text().count("\n") == 2
    before = digest(data)
    proc = run_pipeline("--input", data / "docs.jsonl", *BYTES, "--output", data, *overwrite, check=False)
    assert proc.returncode == 2 and digest(data) == before, proc.stderr


@pytest.mark.parametrize("overwrite", [["--overwrite"], []])
@pytest.mark.slow
def test_an_output_holding_the_rejected_directory_is_refused(tmp_path, small_input, overwrite):
    out = tmp_path / "out.zarr"
    proc = run_pipeline("--input", small_input, *BYTES, "--output", out, "--rejected_output", out / "rejected",
                        *overwrite, check=False)
    assert proc.returncode == 2 and "holds the --rejected_output directory" in proc.stderr, proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# 3. The rejected-lines directory


@pytest.mark.slow
def test_only_the_replaced_runs_reports_are_deleted_from_the_rejected_directory(tmp_path):
    dirty = write_jsonl(tmp_path / "in" / "dirty.jsonl", [f"doc {i}" for i in range(20)])
    with open(dirty, "a") as f:
        f.write("{not json\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "rejected-notes.jsonl").write_text('{"my": "notes"}\n')
    (reports / "rejected-0123456789abcdef.jsonl").write_text("looks like an old report, but who knows\n")
    (reports / "notes.txt").write_text("mine\n")
    users = {n: digest(reports / n) for n in os.listdir(reports)}
    args = ["--input", dirty, *BYTES, "--rejected_output", reports, "--max_rejected_fraction", "0.5"]
    run_pipeline(*args, "--output", tmp_path / "other.zarr")  # another dataset's report, same directory
    other_reports = {p.name for p in reports.glob("rejected-*-*.jsonl")}
    run_pipeline(*args, "--output", tmp_path / "out.zarr")
    first = {p.name for p in reports.glob("rejected-*-*.jsonl")} - other_reports
    run_pipeline(*args, "--output", tmp_path / "out.zarr", "--overwrite")
    now = {p.name for p in reports.glob("rejected-*-*.jsonl")}
    assert len(first) == 1 and not first & now, "the replaced run's report is replaced"
    assert other_reports <= now, "another dataset's report in the same directory survives"
    run_id = zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs["run_id"]
    assert all(n.startswith(f"rejected-{run_id}-") for n in now - other_reports)
    assert {n: digest(reports / n) for n in users} == users


# ---------------------------------------------------------------------------------------------
# 4. Runs that race for one output


def shard(split, index, lengths, rng):
    tokens = (rng.integers(0, 50, int(sum(lengths))) << 1).astype(np.uint32)
    tokens[np.cumsum(lengths) - lengths] |= 1
    return SortedShard(split, index, np.array(lengths), tokens)


# The chunk writes small_job's four sequences of 17 tokens need (4-token, 3-entry chunks).
CHUNKS = {("train", "encoded_tokens"): 5, ("train", "seq_starts"): 2,
          ("validation", "encoded_tokens"): 0, ("validation", "seq_starts"): 1}


def small_job(tmp_path, run_id):
    rng = np.random.default_rng(0)
    shards = [shard("train", 0, [3, 5, 2], rng), shard("train", 1, [7], rng)]
    sizes = {("train", s.shard): (int(s.tokens.size), int(s.lengths.size), int((s.tokens >> 1).max())) for s in shards}
    target = StoreTarget(url=str(tmp_path / "o.zarr"), tokens_chunk=4, seq_starts_chunk=3, run_id=run_id)
    return target, shards, plan.lay_out(sizes, ("train", "validation"))


def test_a_run_whose_output_was_taken_over_stops_before_writing_and_cannot_commit(tmp_path):
    a, shards, layout = small_job(tmp_path, "run-a")
    b = dataclasses.replace(a, run_id="run-b")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    list(CreateOutput(b, True, str(tmp_path / "rej"), expected_owner=(1, "run-a", False)).process(None, layout))
    taken = digest(tmp_path / "o.zarr")
    writer = WriteOwnedChunks(a)
    writer.setup()
    with pytest.raises(OutputTaken, match="run run-b took it over"):
        list(writer.process(shards[0], layout, True))
    with pytest.raises(OutputTaken):
        CommitFn(a, {"run_id": "run-a"}).commit(CHUNKS, layout, {"lines": 4, "documents": 4})
    assert digest(tmp_path / "o.zarr") == taken


def paused_writer(target, shard, layout):
    """A WriteOwnedChunks of `target` stopped in the middle of writing `shard`: it took its
    lease, checked its claim and started writing; `list(steps)` and `finish()` go on."""
    writing = WriteOwnedChunks(target)
    writing.setup()
    writing.start_bundle()
    steps = writing.process(shard, layout, True)
    next(steps)
    return steps, writing.finish_bundle


def wait_for(condition, what):
    """Polls a condition that another thread of this test makes true (no timing: it must come)."""
    for _ in range(20000):
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_a_takeover_waits_for_the_old_runs_write_in_flight_which_then_harms_nothing(tmp_path):
    """Run B takes over run A's unfinished output while one of A's writes is in flight. B
    claims the output, then waits for A's lease; A's write lands, A sees the takeover at its
    check after the write and stops without a conflict record; only then does B delete A's
    data and create its own arrays."""
    a, shards, layout = small_job(tmp_path, "run-a")
    b = dataclasses.replace(a, run_id="run-b")
    out = tmp_path / "o.zarr"
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    steps, finish = paused_writer(a, shards[0], layout)
    with ThreadPoolExecutor(1) as pool:
        taking_over = pool.submit(lambda: list(CreateOutput(b, True, str(tmp_path / "rej"),
                                                            expected_owner=(1, "run-a", False)).process(None, layout)))
        wait_for(lambda: (out / ".flat-tokens-run.2").exists(), "run B claims the output")
        arrays_of_a = (out / "train" / "encoded_tokens" / ".zarray").stat()
        assert not taking_over.done()  # B waits, deleting nothing
        with pytest.raises(OutputTaken, match="run run-b took it over") as stopped:
            try:
                list(steps)  # its next array's writer sees the takeover when it opens...
            finally:
                finish()  # ... and the write in flight is confirmed: it landed before B went on
        assert stopped.value.landed_first
        assert taking_over.result() == [True]
    assert not [n for n in os.listdir(out) if n.startswith((CONFLICT_PREFIX, ".flat-tokens-writing."))]
    arrays_of_b = (out / "train" / "encoded_tokens" / ".zarray").stat()
    assert (arrays_of_b.st_ino, arrays_of_b.st_mtime_ns) != (arrays_of_a.st_ino, arrays_of_a.st_mtime_ns)  # B's own
    assert sorted(os.listdir(out / "train" / "encoded_tokens")) == [".zarray", ".zattrs"]  # A's chunks went


def test_a_write_that_outlasts_the_newcomers_patience_cannot_change_the_new_output(tmp_path):
    """Fencing: a run that took an output over stops waiting for a write in flight after a
    while (here at once), replaces the output and commits its own dataset. The stalled write
    lands afterwards: create-only, it replaces none of the new run's objects, its run takes
    back the objects it created, and it stops saying it lost the output. The new dataset is
    exactly as its run committed it, with no conflict record."""
    a, shards, layout = small_job(tmp_path, "run-a")
    b = dataclasses.replace(a, run_id="run-b")
    b_shards = [shard("train", 0, [2, 2], np.random.default_rng(1))]  # 4 other tokens: 1 chunk, not 5
    b_layout = plan.lay_out({("train", 0): (4, 2, int((b_shards[0].tokens >> 1).max()))}, ("train", "validation"))
    out = tmp_path / "o.zarr"
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    writing = WriteOwnedChunks(a)
    writing.setup()
    writing.start_bundle()
    list(writing.process(shards[0], layout, True))
    stall = threading.Event()  # A's writes of shard 1 pass the claim check, then wait on the pool
    pool = writing._arrays._pool
    blockers = [pool.submit(stall.wait) for _ in range(pool._max_workers)]
    list(writing.process(shards[1], layout, True))
    ownership.claim(b.url, "run-b", 2)
    ownership.wait_for_writers(b.url, "run-b", patience=0)  # A's lease is broken
    list(CreateOutput(b, True, str(tmp_path / "rej"), expected_owner=(1, "run-a", False)).process(None, b_layout))
    write_all(b, b_shards, b_layout)
    CommitFn(b, {"run_id": "run-b"}).commit({("train", "encoded_tokens"): 1, ("train", "seq_starts"): 1,
                                             ("validation", "encoded_tokens"): 0, ("validation", "seq_starts"): 1},
                                            b_layout, {"lines": 2, "documents": 2})
    committed = digest(out)
    stall.set()
    wait(blockers)
    with pytest.raises(OutputTaken, match="this run lost the output") as lost:
        writing.finish_bundle()  # A's writes land, then it confirms them
    assert "taken back" in str(lost.value)
    assert digest(out) == committed
    assert not [n for n in os.listdir(out) if n.startswith(CONFLICT_PREFIX)]
    assert verify.verify_dataset(str(out)) == []


def test_the_lease_of_a_process_that_has_ended_is_not_waited_for(tmp_path):
    a, _, layout = small_job(tmp_path, "run-a")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    lease = tmp_path / "o.zarr" / ".flat-tokens-writing.run-a.0123"
    lease.write_text(json.dumps({"run_id": "run-a", "what": "train shard 0's chunks",
                                 "process": {**processes.this_process(), "pid": ended.pid}}))
    ownership.claim(a.url, "run-b", 2)
    ownership.wait_for_writers(a.url, "run-b")  # the default patience is minutes: this returns at once
    assert not lease.exists()


def test_a_chunk_write_that_fails_on_the_pool_fails_the_bundle_after_the_claim_is_confirmed(tmp_path):
    """A shard's chunks are written on a thread pool while the next shard is sorted: a write
    that fails there must still fail its bundle (at the next shard or at finish_bundle),
    and the claim is confirmed after whatever did land, so no receipt counts as written."""
    a, shards, layout = small_job(tmp_path, "run-a")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    (tmp_path / "o.zarr" / "train" / "encoded_tokens" / "0").mkdir()  # chunk 0's name is taken: its write fails
    writing = WriteOwnedChunks(a)
    writing.setup()
    writing.start_bundle()
    list(writing.process(shards[0], layout, True))  # returns at once: the writes run on the pool
    with pytest.raises(OSError):
        list(writing.process(shards[1], layout, True))  # ... and the first failure surfaces here
    writing.start_bundle()  # the runner retries the bundle: the failed one's writes are settled
    assert writing._pending is None
    assert not [n for n in os.listdir(tmp_path / "o.zarr") if n.startswith(CONFLICT_PREFIX)]


@pytest.mark.slow
def test_a_dataset_committed_after_launch_is_not_deleted(tmp_path, small_input):
    """A run launched when the output was absent finds, at CreateOutput, a dataset another
    run committed meanwhile: even with --overwrite it stops and deletes nothing."""
    out = tmp_path / "o.zarr"
    late, _, layout = small_job(tmp_path, "late-run")
    run_pipeline("--input", small_input, *BYTES, "--output", out)
    before = digest(out)
    with pytest.raises(OutputTaken, match="appeared there after this run was launched"):
        list(CreateOutput(late, True, str(tmp_path / "rej"), expected_owner=(0, "", False)).process(None, layout))
    assert digest(out) == before


def test_a_dataset_its_run_committed_after_launch_is_not_deleted(tmp_path):
    """Run B's launcher found run A's unfinished output; A then finished and committed. The
    owner is the same run, but what B would delete is now a committed dataset, which B's
    launcher never saw: B stops and deletes nothing."""
    a, shards, layout = small_job(tmp_path, "run-a")
    b = dataclasses.replace(a, run_id="run-b")
    list(CreateOutput(a, False, str(tmp_path / "rej")).process(None, layout))
    found = ownership.inspect_output(b.url)  # B's launcher
    assert (found.owner, found.committed) == ((1, "run-a"), False)
    write_all(a, shards, layout)
    CommitFn(a, {"run_id": "run-a"}).commit(CHUNKS, layout, {"lines": 4, "documents": 4})
    committed = digest(tmp_path / "o.zarr")
    with pytest.raises(OutputTaken, match=r"a committed flat-tokens dataset of run run-a appeared there after this "
                                          r"run was launched \(it found the unfinished output of run run-a"):
        list(CreateOutput(b, True, str(tmp_path / "rej"), expected_owner=(*found.owner, found.committed))
             .process(None, layout))
    assert digest(tmp_path / "o.zarr") == committed
    assert verify.verify_dataset(b.url) == []


def write_all(target, shards, layout):
    """Every chunk of small_job's shards, as WriteFlatTokens writes them."""
    owned, markers, shared = WriteOwnedChunks(target), WriteEndMarkers(target), WriteSharedChunks(target)
    for fn in (owned, markers, shared):
        fn.setup()
    owned.start_bundle()
    out = [o for s in shards for o in owned.process(s, layout, True)]
    owned.finish_bundle()
    out += list(markers.process(None, layout, True))
    fragments = {}
    for o in out:
        if hasattr(o, "tag"):
            fragments.setdefault(o.value[0], []).append(o.value[1])
    for key, pieces in sorted(fragments.items()):
        list(shared.process((key, pieces), layout, True))


CLEAR_FAILURES = ("claimed it first", "took it over", "appeared there after this run was launched",
                  "exists and is not empty", "may have written into this output", "committed there while this one ran")


def race(tmp_path, out, runs):
    """Starts the runs at once; returns [(args, exit code, stderr, run id or None)]."""
    procs = []
    for i, args in enumerate(runs):
        summary = tmp_path / f"summary-{i}.json"
        summary.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pipeline.run", *map(str, args), "--output", str(out), "--summary_json",
               str(summary), "--quiet"]
        procs.append((args, summary, subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True)))
    results = []
    for args, summary, proc in procs:
        _, stderr = proc.communicate(timeout=300)
        run_id = json.loads(summary.read_text())["run_id"] if proc.returncode == 0 else None
        results.append((args, proc.returncode, stderr, run_id))
    return results


@pytest.mark.slow
def test_two_runs_racing_for_one_output(tmp_path):
    alpha = write_jsonl(tmp_path / "alpha.jsonl", [f"alpha {i} " + "a" * (i % 31) for i in range(1200)])
    beta = write_jsonl(tmp_path / "beta.jsonl", [f"beta {i} " + "b" * (i % 29) for i in range(1000)])
    common = [*BYTES, "--num_shards", "3", "--tokens_chunk_size", "512", "--seq_starts_chunk_size", "64"]
    configs = {"alpha": ["--input", alpha, *common], "beta": ["--input", beta, *common]}
    refs = {}
    for name, args in configs.items():
        refs[name] = tmp_path / f"ref-{name}.zarr"
        run_pipeline(*args, "--output", refs[name])
    out = tmp_path / "out.zarr"
    rounds = [  # (what is at the output first, alpha's extra options, beta's)
        (None, [], []),
        (None, ["--overwrite"], []),
        ("alpha", ["--overwrite"], ["--overwrite"]),
    ]
    for first, alpha_extra, beta_extra in rounds:
        shutil.rmtree(out, ignore_errors=True)
        if first:
            shutil.copytree(refs[first], out)
        results = race(tmp_path, out, [configs["alpha"] + alpha_extra, configs["beta"] + beta_extra])
        names = ["alpha", "beta"]
        context = f"round {first, alpha_extra, beta_extra}: " + repr([(r[1], r[2][-600:]) for r in results])
        assert any(code == 0 for _, code, _, _ in results), context
        for (_, code, stderr, _), name in zip(results, names):
            assert code in (0, 1, 2), context
            if code:
                assert str(out) in stderr and any(p in stderr for p in CLEAR_FAILURES), context
        problems = verify.verify_dataset(str(out))
        if problems:
            # Allowed only where a run's write may have landed after a takeover, which it records;
            # started together, one run claims the output and the other stops before touching it.
            assert any(p.startswith("conflict record") for p in problems), context + repr(problems)
            continue
        committed = zarr.open_group(str(out), mode="r").attrs["run_id"]
        winners = [name for (_, code, _, rid), name in zip(results, names) if code == 0 and rid == committed]
        assert len(winners) == 1, context
        check_flat_tokens(out, "--compare", refs[winners[0]])
        for (_, code, _, rid), name in zip(results, names):
            if code == 0 and rid != committed:  # a committed result was replaced: the replacer said so
                replacer = results[names.index(winners[0])][2]
                assert f"replacing a committed flat-tokens dataset of run {rid}" in replacer, context


# ---------------------------------------------------------------------------------------------
# 5. Truncated or corrupt compressed input


def truncated(kind: str, data: bytes) -> bytes:
    packed = zstandard.ZstdCompressor().compress(data) if kind == "zst" else gzip.compress(data, mtime=0)
    if kind == "gz-corrupt":
        middle = len(packed) // 2
        return packed[:middle] + bytes(64) + packed[middle + 64:]
    return packed[: len(packed) * 3 // 4]


@pytest.mark.parametrize("kind", ["gz", "gz-corrupt", "zst"])
@pytest.mark.slow
def test_a_truncated_compressed_input_names_the_file_and_the_place(tmp_path, kind):
    lines = [json.dumps({"text": f"document {i} " + "lorem ipsum " * (i % 23)}).encode() + b"\n" for i in range(4000)]
    data = b"".join(lines)
    suffix = "zst" if kind == "zst" else "gz"
    write_jsonl(tmp_path / "in" / "good.jsonl", ["an intact file"])
    broken = tmp_path / "in" / f"broken.jsonl.{suffix}"
    broken.write_bytes(truncated(kind, data))
    proc = run_pipeline("--input", tmp_path / "in", *BYTES, "--output", tmp_path / "out.zarr", check=False)
    assert proc.returncode == 1, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    match = re.search(rf"input {re.escape(str(broken))}: the compressed data is truncated or corrupt after "
                      rf"uncompressed byte (\d+) \(line (\d+) was the last whole line\)", message)
    assert match, message
    offset, line = map(int, match.groups())
    assert 0 < line < len(lines), message
    if kind != "gz-corrupt":  # (corrupt data may decode to garbage lines before gzip's CRC check fails)
        assert offset == sum(map(len, lines[:line])), message
        assert "Compressed file ended before the end-of-stream marker was reached" in message


# ---------------------------------------------------------------------------------------------
# 6. Locally and on gs:// alike: lost chunks, nested user files, runs that overlap in time


class Place:
    """Where a test's outputs live: a local directory, or a prefix in the GCS emulator's
    bucket; with the few storage operations the tests need, done through fsspec."""

    def __init__(self, root: str, fs, env: dict):
        self.root, self.fs, self.env = root, fs, env

    def url(self, *parts) -> str:
        return "/".join([self.root, *parts])

    def path(self, *parts) -> str:
        return self.url(*parts).removeprefix("gs://")

    def exists(self, *parts) -> bool:
        self.fs.invalidate_cache()
        return self.fs.exists(self.path(*parts))

    def names(self, *parts) -> list[str]:
        self.fs.invalidate_cache()
        try:
            return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.path(*parts), detail=False))
        except FileNotFoundError:
            return []

    def put(self, relative: str, data: bytes):
        self.fs.pipe_file(self.path(relative), data)

    def rm(self, relative: str):
        self.fs.rm(self.path(relative), recursive=True)

    def digest(self, *parts) -> dict:
        self.fs.invalidate_cache()
        base = self.path(*parts)
        return {posixpath.relpath(p, base): hashlib.sha256(self.fs.cat_file(p)).hexdigest()
                for p in self.fs.find(base)}

    def verify(self) -> list[str]:
        """`flat-tokens verify` of the output, as a user runs it: the problems it prints."""
        proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", self.url("out.zarr")], cwd=REPO,
                              capture_output=True, text=True, timeout=120, env={**os.environ, **self.env})
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout.splitlines()[:-1]


@pytest.fixture(params=["local", "gs"])
def place(request, tmp_path):
    if request.param == "local":
        (tmp_path / "place").mkdir()
        return Place(str(tmp_path / "place"), fsspec.filesystem("file", auto_mkdir=True), {})
    emulator = request.getfixturevalue("gcs")
    return Place(f"gs://{BUCKET}/place-{uuid.uuid4().hex[:8]}", emulator.fs, emulator.env)


@pytest.mark.slow
def test_verify_finds_a_chunk_lost_inside_a_long_document(place, tmp_path):
    """zarr reads a lost chunk as zeros; inside a long document zeros carry no start bit, as
    they should not: only the listing of the chunks can tell. Both splits, both arrays."""
    train = write_jsonl(tmp_path / "train.jsonl", ["a long document, " * 400])  # 6,800 tokens: 27 chunks
    valid = write_jsonl(tmp_path / "valid.jsonl", [f"short {i}" for i in range(300)])  # 301 starts: 5 chunks
    run_pipeline("--input", train, "--validation_input", valid, *BYTES, "--output", place.url("out.zarr"),
                 "--tokens_chunk_size", "256", "--seq_starts_chunk_size", "64", env=place.env)
    assert place.verify() == []
    place.rm("out.zarr/train/encoded_tokens/10")
    place.rm("out.zarr/validation/seq_starts/2")
    assert place.verify() == [
        "train: encoded_tokens: 1 of 27 chunks missing from storage (10 = elements [2560, 2816)); zarr would read "
        "them as zeros",
        "validation: seq_starts: 1 of 5 chunks missing from storage (2 = elements [128, 192)); zarr would read "
        "them as zeros"]


@pytest.mark.slow
def test_overwrite_refuses_a_users_files_anywhere_in_the_tree(place, small_input):
    """Not one level deep: a file or directory inside train/, validation/ or an array's
    directory (even one named like a chunk the arrays do not have) is not this tool's."""
    out = place.url("out.zarr")
    run_pipeline("--input", small_input, *BYTES, "--output", out, env=place.env)
    users = {"out.zarr/train/NOTES.txt": b"my notes\n", "out.zarr/validation/mine/plot.png": b"png",
             "out.zarr/train/encoded_tokens/README": b"about the tokens\n",
             "out.zarr/validation/encoded_tokens/77": b"not a chunk of this array"}
    for relative, data in users.items():
        place.put(relative, data)
    before = place.digest()
    proc = run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite", env=place.env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"flat-tokens: error: --output {out}: holds train/NOTES.txt, train/encoded_tokens/README, "
        f"validation/encoded_tokens/77, validation/mine/: not a flat-tokens dataset written by this tool; refusing "
        f"to delete it. --overwrite replaces only an empty directory or this tool's own output; choose another path")
    assert place.digest() == before
    for relative in ("out.zarr/train/NOTES.txt", "out.zarr/validation/mine", "out.zarr/train/encoded_tokens/README",
                     "out.zarr/validation/encoded_tokens/77"):
        place.rm(relative)
    run_pipeline("--input", small_input, *BYTES, "--output", out, "--overwrite", env=place.env)
    assert place.verify() == []


class Run:
    """A run in a subprocess that a test can pause and resume (SIGSTOP/SIGCONT to its
    session), with its own temporary directory so that its progress can be observed."""

    def __init__(self, place, tmp_path, name, *args, output="out.zarr", env=None):
        self.place = place
        self.temp = tmp_path / f"tmp-{name}"
        self.temp.mkdir()
        self.summary = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", "pipeline.run", *map(str, args), "--output", place.url(output),
               "--summary_json", str(self.summary)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **place.env, "TMPDIR": str(self.temp),
                                                         **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def wait_until(self, condition, what):
        while self.proc.poll() is None and not condition():
            time.sleep(0.005)
        assert condition(), f"the run ended before {what}: {self.proc.stderr.read()[-3000:]}"

    def spilled(self, staged_before=frozenset()) -> bool:
        """Its first batch's ids are written: spilled in its temporary directory, or staged under
        the output (transforms/staging.py) in a unit folder that was not there before it began."""
        if any(n.endswith(".ids") for _, _, files in os.walk(self.temp) for n in files):
            return True
        return bool(set(self.place.names(f"out.zarr/{STAGING}/units")) - set(staged_before))

    def pause(self):
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)

    def finish(self) -> tuple[int, str]:
        _, stderr = self.proc.communicate(timeout=300)
        return self.proc.returncode, stderr

    def run_id(self) -> str:
        return json.loads(self.summary.read_text())["run_id"]


def slow_input(tmp_path, name, n):
    """Many small shards and chunks: a run spends a long while writing them."""
    src = write_jsonl(tmp_path / f"{name}.jsonl", [f"{name} {i} " + "text " * (i % 13) for i in range(n)])
    return ["--input", src, *BYTES, "--num_shards", "40", "--tokens_chunk_size", "64", "--seq_starts_chunk_size", "16",
            "--batch_documents", "100"]


@pytest.mark.slow
def test_a_dataset_committed_after_a_takeover_was_launched_is_not_deleted(place, tmp_path):
    """Run B (--overwrite) is launched while run A is still writing, so B's launcher sees an
    unfinished output; A then commits before B replaces it. A committed dataset is deleted
    only by a run whose launcher saw it committed: B stops, deleting nothing."""
    a = Run(place, tmp_path, "a", *slow_input(tmp_path, "alpha", 1500))
    a.wait_until(lambda: place.exists("out.zarr/train/encoded_tokens/.zarray"), "A created its arrays")
    a.pause()
    staged_by_a = place.names(f"out.zarr/{STAGING}/units")
    b = Run(place, tmp_path, "b", *slow_input(tmp_path, "beta", 6000), "--overwrite")
    b.wait_until(lambda: b.spilled(staged_by_a), "B read its first batch")  # so its launcher has looked at the output
    b.pause()
    assert ".flat-tokens-run.2" not in place.names("out.zarr"), "B claimed the output before it was paused"
    a.resume()
    code_a, err_a = a.finish()
    assert code_a == 0, err_a
    committed = place.digest("out.zarr")
    b.resume()
    code_b, err_b = b.finish()
    assert code_b == 1, err_b
    assert (f"--output {place.url('out.zarr')}: a committed flat-tokens dataset of run {a.run_id()} appeared there "
            f"after this run was launched (it found the unfinished output of run {a.run_id()} (claim 1)); this run "
            f"stops and deletes nothing") in err_b
    # B staged what it read under the output (transforms/staging.py), and touched nothing else.
    assert {k: v for k, v in place.digest("out.zarr").items() if not k.startswith(f"{STAGING}/")} == committed
    assert place.verify() == []


@pytest.mark.slow
def test_taking_over_a_run_that_is_still_writing(place, tmp_path):
    """Run B (--overwrite) takes over run A's output while A is writing chunks (the crash
    recovery path cannot tell a live run from a killed one). B waits for A's write in
    flight, deletes and commits its own dataset; A stops at its next write."""
    a = Run(place, tmp_path, "a", *slow_input(tmp_path, "alpha", 3000))
    chunks = lambda: len(place.names("out.zarr/train/encoded_tokens")) > 5  # noqa: E731
    a.wait_until(lambda: chunks() and not place.exists("out.zarr/.zattrs"), "A wrote a few chunks")
    a.pause()
    b = Run(place, tmp_path, "b", *slow_input(tmp_path, "beta", 300), "--overwrite")
    b.wait_until(lambda: ".flat-tokens-run.2" in place.names("out.zarr"), "B claimed the output")
    a.resume()
    code_a, err_a = a.finish()
    code_b, err_b = b.finish()
    assert code_b == 0, err_b
    assert code_a == 1 and f"run {b.run_id()} took it over (claim 2)" in err_a, err_a
    assert "conflict record" not in err_a
    assert place.verify() == []
    assert not [n for n in place.names("out.zarr") if n.startswith((CONFLICT_PREFIX, ".flat-tokens-writing."))]


def without_run_ids(place, name: str) -> dict:
    """A dataset's objects by name, with what names its run (the claims, and the run id and
    report path in its attributes; the manifest and its seal, which hold checksums of objects
    that name the run: issue 37) set aside: what two runs of one command must share, byte
    for byte."""
    out = {}
    for relative, sha in place.digest(name).items():
        if posixpath.basename(relative).startswith(".flat-tokens-run.") or relative == "flat-tokens-manifest.json":
            continue
        if posixpath.basename(relative) in (".zattrs", "zarr.json") and relative.count("/") <= 1:
            place.fs.invalidate_cache()
            attrs = json.loads(place.fs.cat_file(place.path(name, relative)))
            inner = attrs.get("attributes", attrs)
            for key in ("run_id", "flat_tokens_run", "rejected_output", "manifest"):
                inner.pop(key, None)
            sha = json.dumps(attrs, sort_keys=True)
        out[relative] = sha
    return out


@pytest.mark.slow
def test_a_stalled_writer_cannot_change_the_dataset_that_replaced_it(place, tmp_path):
    """Issue 27.2. Run A is frozen (SIGSTOP) while it writes chunks; run B takes the output
    over with --overwrite, waits for A's write in flight (here 1 s), goes on without it,
    replaces the output and commits. A is resumed (SIGCONT): its stalled writes land, and
    fail where B wrote (create-only); what they create beyond B's arrays is taken back. A
    exits 1 saying it lost the output, and B's dataset is byte for byte what a fresh run of
    B's command writes, with no conflict record."""
    alpha, beta = slow_input(tmp_path, "alpha", 3000), slow_input(tmp_path, "beta", 300)
    a = Run(place, tmp_path, "a", *alpha)
    leases = lambda: [n for n in place.names("out.zarr") if n.startswith(".flat-tokens-writing.")]  # noqa: E731
    chunks = lambda: len(place.names("out.zarr/train/encoded_tokens")) > 5  # noqa: E731
    for _ in range(200):  # frozen while a write of its is in flight: it holds a lease
        a.wait_until(lambda: chunks() and leases(), "A wrote a few chunks")
        a.pause()
        if leases() and not place.exists("out.zarr/.zattrs"):
            break
        a.resume()
    else:
        pytest.fail("A was never seen holding a lease")
    b = Run(place, tmp_path, "b", *beta, "--overwrite", env={ownership.LEASE_PATIENCE_VARIABLE: "1"})
    code_b, err_b = b.finish()
    assert code_b == 0, err_b
    assert "has not landed after 1 s; going on without it" in err_b, err_b
    committed = place.digest("out.zarr")
    a.resume()
    code_a, err_a = a.finish()
    assert code_a == 1, err_a
    assert f"run {b.run_id()} took it over (claim 2)" in err_a and "this run lost the output" in err_a, err_a
    assert place.digest("out.zarr") == committed
    assert not [n for n in place.names("out.zarr") if n.startswith((CONFLICT_PREFIX, ".flat-tokens-writing."))]
    assert place.verify() == []
    fresh = Run(place, tmp_path, "fresh", *beta, output="fresh.zarr")
    assert fresh.finish()[0] == 0
    assert without_run_ids(place, "out.zarr") == without_run_ids(place, "fresh.zarr")


# ---------------------------------------------------------------------------------------------
# The same on gs://, against the fake-gcs-server emulator

GS_INPUT = f"gs://{BUCKET}/corpus/*.jsonl*"
GS_ARGS = ["--input", GS_INPUT, *BYTES, "--max_rejected_fraction", "0.01"]


def gs(*parts) -> str:
    return "/".join([f"gs://{BUCKET}/safety", *parts])


def gs_digest(gcs, url: str) -> dict:
    """sha256 of every object under `url`, by name (the emulator's view, not a cached one)."""
    gcs.fs.invalidate_cache()
    path = url.removeprefix("gs://").rstrip("/")
    return {p: hashlib.sha256(gcs.fs.cat_file(p)).hexdigest() for p in gcs.fs.find(path)}


def gs_run(gcs, *args, check=False):
    return run_pipeline(*args, env=gcs.env, check=check, timeout=200)


@pytest.mark.slow
def test_gs_objects_that_are_not_a_dataset_are_refused(gcs, gcs_corpus):
    gcs.fs.pipe({f"{BUCKET}/safety/home/notes.txt": b"precious\n", f"{BUCKET}/safety/home/projects/main.py": b"code\n",
                 f"{BUCKET}/safety/file.txt": b"hi\n"})
    before = gs_digest(gcs, gs())
    proc = gs_run(gcs, *GS_ARGS, "--output", gs("home"), "--overwrite")
    assert proc.returncode == 2, proc.stderr
    assert f"--output {gs('home')}: holds notes.txt, projects/: not a flat-tokens dataset" in proc.stderr
    proc = gs_run(gcs, *GS_ARGS, "--output", gs("file.txt"), "--overwrite")
    assert proc.returncode == 2 and "is a file, not a flat-tokens dataset" in proc.stderr, proc.stderr
    assert gs_digest(gcs, gs()) == before


@pytest.mark.parametrize("root", [f"gs://{BUCKET}", f"gs://{BUCKET}/"])
@pytest.mark.parametrize("overwrite", [["--overwrite"], []])
@pytest.mark.slow
def test_gs_a_bucket_root_is_never_an_output(gcs, gcs_corpus, root, overwrite):
    before = gs_digest(gcs, f"gs://{BUCKET}")
    proc = gs_run(gcs, *GS_ARGS, "--output", root, *overwrite)
    assert proc.returncode == 2 and f"is the root of bucket {BUCKET}" in proc.stderr, proc.stderr
    assert gs_digest(gcs, f"gs://{BUCKET}") == before


@pytest.mark.slow
def test_gs_a_dataset_holding_a_users_object_is_refused_and_one_without_is_replaced(gcs, gcs_corpus):
    out = gs("out.zarr")
    gs_run(gcs, *GS_ARGS, "--output", out, check=True)
    gcs.fs.pipe(f"{BUCKET}/safety/out.zarr/my-notes.md", b"mine\n")
    before = gs_digest(gcs, gs())
    proc = gs_run(gcs, *GS_ARGS, "--output", out, "--overwrite")
    assert proc.returncode == 2 and "holds my-notes.md: not a flat-tokens dataset" in proc.stderr, proc.stderr
    assert gs_digest(gcs, gs()) == before
    gcs.fs.rm(f"{BUCKET}/safety/out.zarr/my-notes.md")
    proc = gs_run(gcs, *GS_ARGS, "--output", out, "--overwrite", check=True)
    assert "replacing a committed flat-tokens dataset of run" in proc.stderr
    gcs.fs.invalidate_cache()
    assert [p.rsplit("/", 1)[1] for p in gcs.fs.glob(f"{BUCKET}/safety/out.zarr/.flat-tokens-run.*")] == [
        ".flat-tokens-run.2"]


@pytest.mark.slow
def test_gs_outputs_holding_an_input_or_the_rejected_directory_are_refused(gcs, gcs_corpus):
    gcs.fs.pipe(f"{BUCKET}/safety/data/docs.jsonl", b'{"text": "one"}\n{"text": "two"}\n')
    data, out = gs("data"), gs("data", "out.zarr")
    gs_run(gcs, "--input", data, *BYTES, "--output", out, check=True)
    # An output inside its input directory is left out of the listing (issue 27.8): the rerun
    # reads the one document file, as the first run did.
    proc = gs_run(gcs, "--input", data, *BYTES, "--output", out, "--overwrite", check=True)
    assert f"left out this tool's own output (datasets, staging areas, rejected-lines reports): {out}/" in proc.stderr
    assert "2 documents" in proc.stdout, proc.stdout
    before = gs_digest(gcs, data)
    proc = gs_run(gcs, "--input", f"{data}/docs.jsonl", *BYTES, "--output", data, "--overwrite")
    assert proc.returncode == 2 and f"--output {data}: holds " in proc.stderr, proc.stderr
    proc = gs_run(gcs, *GS_ARGS, "--output", gs("r.zarr"), "--rejected_output", gs("r.zarr", "rejected"), "--overwrite")
    assert proc.returncode == 2 and "holds the --rejected_output directory" in proc.stderr, proc.stderr
    assert gs_digest(gcs, data) == before and not gs_digest(gcs, gs("r.zarr"))


@pytest.mark.slow
def test_gs_a_users_files_in_the_rejected_directory_survive(gcs, gcs_corpus):
    reports = gs("reports")
    users = {f"{BUCKET}/safety/reports/rejected-notes.jsonl": b'{"my": "notes"}\n',
             f"{BUCKET}/safety/reports/notes.txt": b"mine\n"}
    gcs.fs.pipe(users)
    args = [*GS_ARGS, "--output", gs("rep.zarr"), "--rejected_output", reports]
    gs_run(gcs, *args, check=True)
    first = set(gs_digest(gcs, reports)) - set(users)
    gs_run(gcs, *args, "--overwrite", check=True)
    now = gs_digest(gcs, reports)
    assert len(first) == 1 and len(set(now) - set(users)) == 1 and not first & set(now)
    assert {p: now[p] for p in users} == {p: hashlib.sha256(v).hexdigest() for p, v in users.items()}


@pytest.mark.slow
def test_gs_a_truncated_compressed_input_is_named(gcs, gcs_corpus):
    data = b"".join(json.dumps({"text": f"document {i} " + "x" * (i % 50)}).encode() + b"\n" for i in range(3000))
    broken = f"{BUCKET}/safety/broken/part.jsonl.gz"
    gcs.fs.pipe(broken, gzip.compress(data, mtime=0)[:-200])
    proc = gs_run(gcs, "--input", f"gs://{broken}", *BYTES, "--output", gs("broken.zarr"))
    assert proc.returncode == 1, proc.stderr
    assert re.search(rf"input gs://{broken}: the compressed data is truncated or corrupt after uncompressed byte \d+ "
                     rf"\(line \d+ was the last whole line\): EOFError: Compressed file ended before the "
                     rf"end-of-stream marker was reached", proc.stderr), proc.stderr


@pytest.mark.slow
def test_gs_two_runs_racing_for_one_output(gcs, gcs_corpus, tmp_path):
    """Both with --overwrite on a committed dataset, started at once, on gs://."""
    out = gs("race.zarr")
    configs = {"all": GS_ARGS, "train-only": [*GS_ARGS, "--validation_fraction", "0"]}
    refs = {name: tmp_path / f"ref-{name}.zarr" for name in configs}
    for name, args in configs.items():
        gs_run(gcs, *args, "--output", gs(f"ref-{name}.zarr"), check=True)
        gcs.fs.get(f"{BUCKET}/safety/ref-{name}.zarr/", str(refs[name]) + "/", recursive=True)
    gs_run(gcs, *configs["all"], "--output", out, check=True)
    env = {**os.environ, **gcs.env}
    procs = [subprocess.Popen([sys.executable, "-m", "pipeline.run", *args, "--output", out, "--overwrite", "--quiet",
                               "--summary_json", str(tmp_path / f"{name}.json")], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in configs.items()]
    results = [(p.communicate(timeout=300)[1], p.returncode) for p in procs]
    context = repr([(code, err[-600:]) for err, code in results])
    winners = [name for name, (_, code) in zip(configs, results) if code == 0]
    assert len(winners) >= 1, context
    for err, code in results:
        assert code == 0 or (out in err and any(p in err for p in CLEAR_FAILURES)), context
    local = tmp_path / "race.zarr"
    gcs.fs.invalidate_cache()
    gcs.fs.get(f"{BUCKET}/safety/race.zarr/", str(local) + "/", recursive=True)
    committed = zarr.open_group(str(local), mode="r").attrs["run_id"]
    name = next(n for n in winners if json.loads((tmp_path / f"{n}.json").read_text())["run_id"] == committed)
    check_flat_tokens(local, "--compare", refs[name])
