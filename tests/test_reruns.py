"""Reruns and retries: killed runs never look finished, reruns and retried writes give
the same bytes, finished datasets are never clobbered by accident."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from flat_tokens.tools import verify
from tests.helpers import CHECKER, REPO, check_flat_tokens, run_pipeline, write_jsonl
from transforms.records import SortedShard
from transforms.write import layout as plan
from transforms.write import CreateOutput
from transforms.write.chunk_writers import WriteEndMarkers, WriteOwnedChunks, WriteSharedChunks
from transforms.write.commit import CommitFn
from transforms.write.zarr_store import StoreTarget


def tree_digest(path):
    """sha256 of every file under `path`, by relative name."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
    return out


def same_arrays(a, b) -> bool:
    proc = subprocess.run([sys.executable, str(CHECKER), str(a),
                           "--compare", str(b)], capture_output=True, text=True)
    return proc.returncode == 0


@pytest.mark.slow
def test_an_existing_dataset_is_refused_without_overwrite(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", src, "--output", out, "--tokenizer", "bytes")
    before = tree_digest(out)
    proc = run_pipeline("--input", src, "--output", out, "--tokenizer", "bytes", "--seed", "1", check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and str(out) in proc.stderr
    assert "built by another command (--seed 0 -> 1)" in proc.stderr, proc.stderr
    assert tree_digest(out) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not ours")
    proc = run_pipeline("--input", src, "--output", tmp_path / "other", "--tokenizer", "bytes", check=False)
    assert proc.returncode == 2 and (tmp_path / "other" / "notes.txt").exists()


def chunk_files(path):
    d = path / "train" / "encoded_tokens"
    return sum(1 for name in os.listdir(d) if not name.startswith(".")) if d.is_dir() else 0


@pytest.mark.slow
def test_sigkill_at_any_moment_never_leaves_a_mixed_dataset_and_a_rerun_matches(tmp_path):
    texts = [f"document {i} " + "words and more words " * (i % 17) for i in range(3000)]
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"part-{i}.jsonl", texts[i::3])
    args = ["--input", tmp_path / "in", "--tokenizer", "bytes", "--num_shards", "6", "--tokens_chunk_size", "256",
            "--seq_starts_chunk_size", "64", "--batch_documents", "50"]
    old, ref, out = tmp_path / "old.zarr", tmp_path / "ref.zarr", tmp_path / "out.zarr"
    run_pipeline(*args, "--output", old, "--seed", "1")  # a different finished dataset
    run_pipeline(*args, "--output", ref)
    total_chunks = chunk_files(ref)
    # Kill points, by what the run has done: reading (its first tokenized batch is staged
    # under the output, transforms/staging.py; the output is claimed only once every batch
    # is); just uncommitted the old dataset; written a few chunks; written half of them.
    units = out / ".flat-tokens-staging" / "units"
    kill_when = {
        "reading": lambda started: any(files for _, _, files in os.walk(units)),
        "uncommitted": lambda started: not (out / ".zgroup").exists(),
        "a few chunks": lambda started: chunk_files(out) > 3 and not (out / ".zgroup").exists(),
        "half the chunks": lambda started: chunk_files(out) > total_chunks // 2 and not (out / ".zgroup").exists(),
    }
    outcomes = {}
    for moment, condition in kill_when.items():
        subprocess.run(["cp", "-r", str(old), str(out)], check=True)
        cmd = [sys.executable, "-m", "pipeline.run", *map(str, args), "--output", str(out), "--overwrite"]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        started = time.time()
        while proc.poll() is None and not condition(started):
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not out.exists() or verify.verify_dataset(str(out)):
            outcomes[moment] = "unfinished"
        elif same_arrays(out, old):
            outcomes[moment] = "old"
        else:
            assert same_arrays(out, ref), f"killed at {moment}: a dataset that verifies but is neither old nor new"
            outcomes[moment] = "new"
        run_pipeline(*args, "--output", out, "--overwrite")
        check_flat_tokens(out, "--compare", ref)
        subprocess.run(["rm", "-rf", str(out)], check=True)
    assert outcomes["reading"] == "old", outcomes
    assert [outcomes[m] for m in ("uncommitted", "a few chunks", "half the chunks")] == ["unfinished"] * 3, outcomes


def test_every_write_step_is_idempotent_under_retry(tmp_path):
    """Runs each write step's work twice, as a Beam retry would: the bytes do not change."""
    target = StoreTarget(url=str(tmp_path / "o.zarr"), tokens_chunk=4, seq_starts_chunk=3, run_id="r")
    rng = np.random.default_rng(0)
    lengths = [np.array([3, 5, 2]), np.array([7]), np.array([1, 1, 4])]
    shards = [SortedShard("train", i, n, ((rng.integers(0, 50, n.sum()) << 1) | 0).astype(np.uint32))
              for i, n in enumerate(lengths)]
    for s in shards:
        s.tokens[np.cumsum(s.lengths) - s.lengths] |= 1
    sizes = {("train", i): (int(s.tokens.size), int(s.lengths.size), int((s.tokens >> 1).max()))
             for i, s in enumerate(shards)}
    layout = plan.lay_out(sizes, ("train", "validation"))
    list(CreateOutput(target, False, str(tmp_path / "rej")).process(None, layout))

    def run_writes():
        owned = WriteOwnedChunks(target)
        owned.setup()
        markers = WriteEndMarkers(target)
        markers.setup()
        owned.start_bundle()
        outputs = [o for s in shards for o in owned.process(s, layout, True)]
        owned.finish_bundle()  # as the runner does: the last shard's writes land and are confirmed
        outputs += list(markers.process(None, layout, True))
        fragments = {}
        for o in outputs:
            if hasattr(o, "tag"):
                key, piece = o.value
                fragments.setdefault(key, []).append(piece)
        shared = WriteSharedChunks(target)
        shared.setup()
        receipts = [r for key, pieces in sorted(fragments.items()) for r in shared.process((key, pieces), layout, True)]
        return outputs, receipts

    run_writes()
    first = tree_digest(tmp_path / "o.zarr")
    run_writes()
    assert tree_digest(tmp_path / "o.zarr") == first
    counts = {"lines": 7, "documents": 7}
    chunks = {("train", "encoded_tokens"): plan.block_count(23, 4), ("train", "seq_starts"): plan.block_count(8, 3),
              ("validation", "encoded_tokens"): 0, ("validation", "seq_starts"): 1}
    commit = CommitFn(target, {"run_id": "r"})
    commit.commit(chunks, layout, counts)
    committed = tree_digest(tmp_path / "o.zarr")
    commit.commit(chunks, layout, counts)  # a retried commit
    assert tree_digest(tmp_path / "o.zarr") == committed
    assert verify.verify_dataset(str(tmp_path / "o.zarr")) == []


@pytest.mark.slow
def test_an_output_inside_its_own_input_directory_is_left_out_of_later_runs(tmp_path):
    """`--input DIR --output DIR/out.zarr` worked once; then the input held the output (exit
    2), and the rejected-lines report under DIR was read back as data."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", [f"document {i}" for i in range(2000)])
    with open(data / "a.jsonl", "a") as f:
        f.write("{not json\n")  # one rejected line: a report under DIR
    args = ["--tokenizer", "bytes", "--max_rejected_fraction", "0.01", "--overwrite"]
    for i, pattern in enumerate((data, data, f"{data}/**/*.jsonl")):
        proc = run_pipeline("--input", pattern, "--output", data / "out.zarr", *args)
        got = zarr.open_group(str(data / "out.zarr"), mode="r").attrs["stats"]
        assert (got["documents"], got["rejected"]) == (2000, 1), (i, got)
        assert list((data / "out.zarr.rejected").glob("rejected-*.jsonl")), i
        if i:
            assert "left out this tool's own output" in proc.stderr and f"{data}/out.zarr/" in proc.stderr
            assert "out.zarr.rejected/rejected-" in proc.stderr, proc.stderr
            check_flat_tokens(data / "out.zarr", "--compare", tmp_path / "first.zarr")
        else:
            subprocess.run(["cp", "-r", str(data / "out.zarr"), str(tmp_path / "first.zarr")], check=True)


@pytest.mark.slow
def test_a_summary_json_inside_the_output_is_the_output_s_own(tmp_path):
    """It could not be written on the first run (the output's directory did not exist yet),
    and once there it made the output foreign: the next --overwrite was refused."""
    src = write_jsonl(tmp_path / "in.jsonl", [f"document {i}" for i in range(50)])
    out = tmp_path / "out.zarr"
    args = ["--input", src, "--tokenizer", "bytes", "--output", out, "--summary_json", out / "summary.json"]
    run_pipeline(*args)
    assert json.loads((out / "summary.json").read_text())["stats"]["documents"] == 50
    first_run = zarr.open_group(str(out), mode="r").attrs["run_id"]
    run_pipeline(*args, "--overwrite", "--seed", "3")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run_id"] == zarr.open_group(str(out), mode="r").attrs["run_id"] != first_run
    assert verify.verify_dataset(str(out)) == []
    # Without --summary_json naming it, it is a file of someone else's there.
    proc = run_pipeline("--input", src, "--tokenizer", "bytes", "--output", out, "--overwrite", check=False)
    assert proc.returncode == 2 and "summary.json" in proc.stderr, proc.stderr
    # Inside a split it would make the dataset foreign: refused before anything is read.
    proc = run_pipeline(*args[:-1], out / "train" / "summary.json", "--overwrite", check=False)
    assert proc.returncode == 2 and "where the dataset's own files go" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_the_same_command_after_its_commit_finds_the_dataset_already_built(tmp_path):
    """A run killed after its commit, or a scheduler's retry of a job that finished, reran the
    command and got exit 2 ("exists and is not empty"). The same command over the same input
    now says so and exits 0, rewriting nothing; --summary_json is written for the retry."""
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"document {i}" for i in range(100)])
    out, summary = tmp_path / "out.zarr", tmp_path / "summary.json"
    args = ["--input", tmp_path / "in", "--tokenizer", "bytes", "--output", out]
    run_pipeline(*args, "--summary_json", summary)
    first = json.loads(summary.read_text())
    summary.unlink()
    before = tree_digest(out)
    proc = run_pipeline(*args, "--summary_json", summary)
    run_id = first["run_id"]
    assert f"already built by run {run_id}" in proc.stderr and "nothing was rewritten" in proc.stdout, proc.stderr
    assert tree_digest(out) == before
    retried = json.loads(summary.read_text())
    assert retried["already_built"] is True and retried["built_by_run"] == run_id
    assert retried["stats"] == first["stats"] and retried["output_bytes"] == first["output_bytes"]
    # The same command over changed input is not the same dataset: refused, saying why.
    with open(src, "a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    proc = run_pipeline(*args, check=False)
    assert proc.returncode == 2 and "from other input" in proc.stderr and "--overwrite" in proc.stderr, proc.stderr
    assert tree_digest(out) == before
