"""Resume (issue 20): a run killed at any point, then rerun with the same command, reuses what
it finished and gives a dataset byte-identical to an uninterrupted run's; work whose key no
longer matches (a changed input file, tokenizer or option) is redone, never reused.

Runs are real subprocesses killed with SIGKILL at moments observed in the output's staging
area (transforms/staging.py), never after a delay."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flat_tokens.format.checksums import Sum
from flat_tokens.tools import verify
from tests.beam_services import portable_services
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, check_flat_tokens, run_pipeline, train_byte_level_bpe, write_jsonl
from tests.wrong_backends import RARE_MARKER
from transforms import staging
from transforms.write.ownership import STAGING

FILES = 8


def corpus(root: Path, files: int = FILES, per_file: int = 500) -> Path:
    texts = [f"document {i} " + "words and more words " * (i % 23) for i in range(files * per_file)]
    for i in range(files):
        write_jsonl(root / f"part-{i}.jsonl", texts[i::files])
    return root


def job_args(tmp_path: Path, *extra) -> list:
    """One unit per file (files are below --read_range_mb), 2 x 10 shards, small chunks: many
    moments to kill a run at. --rejected_output is fixed so that two outputs' attributes agree."""
    return ["--input", tmp_path / "in", "--tokenizer", "bytes", "--num_shards", "10", "--validation_fraction", "0.1",
            "--tokens_chunk_size", "1024", "--seq_starts_chunk_size", "64", "--batch_documents", "40",
            "--rejected_output", tmp_path / "rejected", *extra]


def dataset_digest(path: Path) -> dict:
    """sha256 of every file of a dataset, by relative name, with the run id (which names each
    run) replaced in every file that holds it; the claims (one per run) left out, and so are
    the manifest and its seal (issue 37), which hold checksums of files that name the run."""
    v2 = path / ".zattrs"
    attrs = json.loads(v2.read_text()) if v2.exists() else json.loads((path / "zarr.json").read_text())["attributes"]
    run_id = attrs["run_id"].encode()
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            rel = str(full.relative_to(path))
            data = full.read_bytes()
            if rel in (".zattrs", "zarr.json"):
                document = json.loads(data)
                (document.get("attributes", document) if rel == "zarr.json" else document).pop("manifest", None)
                data = json.dumps(document, sort_keys=True).encode()
            if not rel.startswith(".flat-tokens-run.") and rel != "flat-tokens-manifest.json":
                out[rel] = hashlib.sha256(data.replace(run_id, b"<run id>")).hexdigest()
    return out


def area(out: Path) -> Path:
    return out / STAGING


def units_staged(out: Path) -> int:
    """Units a rerun may reuse: an account and every batch it names staged. (An account can
    land before its last batch does: that batch's ids are written behind, on a thread.)"""
    return len(staging.StagingArea(str(out)).listing().units)


def shards_recorded(out: Path) -> int:
    return len(list(area(out).glob("shards/*/*.rec")))


def committed(out: Path) -> bool:
    return (out / ".zgroup").exists() or (out / "zarr.json").exists()


def kill_when(args: list, out: Path, condition) -> None:
    """Starts a run and SIGKILLs it (its whole process group) once `condition()` holds; the run
    must not have committed by then."""
    cmd = [sys.executable, "-m", "pipeline.run", *map(str, args), "--output", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and not condition() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before the moment to kill it"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not committed(out), "killed too late: the run had committed"
    assert verify.verify_dataset(str(out)), "a killed run must not look finished"


def staged_now(out: Path) -> tuple[int, int]:
    """(units, chunks) the staging area lets a rerun of the same job reuse, as its names say."""
    listed = staging.StagingArea(str(out)).listing()
    chunks = 0
    if listed.arrays_key:
        chunks = sum(n for n, _ in listed.shards.get(listed.arrays_key, {}).values())
        chunks += len(listed.chunks.get(listed.arrays_key, ()))
    return len(listed.units), chunks


def resume(args: list, out: Path, summary: Path) -> dict:
    """Reruns the same command (no --overwrite) and returns what its summary says it reused."""
    run_pipeline(*args, "--output", out, "--summary_json", summary)
    assert not area(out).exists(), "the commit removes the staging area"
    return json.loads(summary.read_text())["reused"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    corpus(root / "in")
    args = job_args(root)
    ref = root / "ref.zarr"
    run_pipeline(*args, "--output", ref)
    return root, args, ref


MOMENTS = {  # five moments spread over the run, each observed in the output's staging area
    "first unit read": lambda out: units_staged(out) >= 1,
    "half the units read": lambda out: units_staged(out) >= FILES // 2,
    "arrays created": lambda out: (area(out) / staging.ARRAYS).exists(),
    "a few shards written": lambda out: shards_recorded(out) >= 2,
    "most shards written": lambda out: shards_recorded(out) >= 12,
}


@pytest.mark.slow
def test_a_run_killed_at_five_moments_resumes_to_the_same_bytes(job, tmp_path):
    root, args, ref = job
    expected = dataset_digest(ref)
    seen = {}
    for moment, condition in MOMENTS.items():
        out = tmp_path / f"{moment.replace(' ', '-')}.zarr"
        kill_when(args, out, lambda: condition(out))
        units, chunks = staged_now(out)
        reused = resume(args, out, tmp_path / "summary.json")
        assert (reused["input_units"], reused["chunks"]) == (units, chunks), moment
        assert reused["input_units_total"] == FILES and reused["chunks_total"] > chunks
        assert dataset_digest(out) == expected, f"killed at {moment}: not the uninterrupted run's bytes"
        seen[moment] = (units, chunks)
    assert 1 <= seen["first unit read"][0] < FILES and seen["first unit read"][1] == 0, seen
    assert seen["arrays created"][0] == FILES and seen["most shards written"][1] > seen["a few shards written"][1] > 0


@pytest.mark.slow
def test_a_run_killed_twice_resumes_to_the_same_bytes(job, tmp_path):
    root, args, ref = job
    out = tmp_path / "twice.zarr"
    kill_when(args, out, lambda: units_staged(out) >= FILES // 2)
    first = staged_now(out)[0]
    kill_when(args, out, lambda: shards_recorded(out) >= 3)
    units, chunks = staged_now(out)
    assert units == FILES and chunks > 0 and first < FILES
    reused = resume(args, out, tmp_path / "summary.json")
    assert (reused["input_units"], reused["chunks"]) == (units, chunks)
    assert dataset_digest(out) == dataset_digest(ref)
    check_flat_tokens(out, "--compare", ref)


@pytest.mark.slow
def test_a_lease_a_kill_left_half_written_does_not_hold_the_rerun(job, tmp_path):
    """A SIGKILL while a write's lease is being created leaves it empty; the rerun must not
    wait for a writer that never passed its check."""
    root, args, ref = job
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    (out / f".flat-tokens-writing.{'a' * 32}.{'b' * 32}").write_bytes(b"")
    proc = run_pipeline(*args, "--output", out, timeout=200)
    assert "run ?'s write" not in proc.stderr, proc.stderr  # before the fix: waited 10 minutes for it
    assert dataset_digest(out) == dataset_digest(ref)


@pytest.mark.slow
def test_the_summary_says_what_was_reused(job, tmp_path):
    root, args, ref = job
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    proc = run_pipeline(*args, "--output", out)
    line = next(line for line in proc.stdout.splitlines() if "resumed:" in line)
    assert line.strip().startswith(f"resumed: reused {FILES} of {FILES} input units, ") and " chunks" in line


@pytest.mark.slow
def test_a_routine_resume_after_a_kill_says_plainly_that_nothing_is_wrong(job, tmp_path):
    """The rerun printed `waiting for run ...'s write ... to land` and `should it land later,
    that run leaves a conflict record` for the lease of a process the kill had ended."""
    root, args, ref = job
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    ended = subprocess.run([sys.executable, "-c", "import json; from transforms import processes; "
                            "print(json.dumps(processes.this_process()))"], cwd=REPO, capture_output=True,
                           text=True, check=True)
    lease = {"run_id": "a" * 32, "what": "shard train/3's chunks", "process": json.loads(ended.stdout)}
    (out / f".flat-tokens-writing.{'a' * 32}.{'b' * 32}").write_text(json.dumps(lease))
    proc = run_pipeline(*args, "--output", out)
    assert "waiting" not in proc.stderr and "conflict record" not in proc.stderr, proc.stderr
    assert f"run {'a' * 32} was stopped while writing shard train/3's chunks" in proc.stderr, proc.stderr
    assert "nothing is wrong" in proc.stderr
    assert dataset_digest(out) == dataset_digest(ref)


# ---------------------------------------------------------------------------------------------
# Stale work is redone


def fresh(root: Path, args: list, name: str) -> dict:
    out = root / name
    run_pipeline(*args, "--output", out)
    return dataset_digest(out)


@pytest.mark.slow
def test_a_changed_input_file_is_read_again_and_no_chunk_is_reused(tmp_path):
    corpus(tmp_path / "in")
    args = job_args(tmp_path)
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    changed = tmp_path / "in" / "part-3.jsonl"
    with open(changed, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "a document added after the kill"}) + "\n")
    proc = run_pipeline(*args, "--output", out, "--summary_json", tmp_path / "summary.json")
    reused = json.loads((tmp_path / "summary.json").read_text())["reused"]
    assert (reused["input_units"], reused["chunks"]) == (FILES - 1, 0)
    # It says what changed, and what is redone.
    assert f"input file changed (size or modification time): {changed}" in proc.stderr, proc.stderr
    assert "1 staged input unit no longer matches this job and is read and tokenized again" in proc.stderr
    assert "chunks written before are written again" in proc.stderr
    assert dataset_digest(out) == fresh(tmp_path, args, "fresh.zarr")


@pytest.mark.slow
def test_an_input_file_changed_in_place_to_the_same_size_is_read_again(tmp_path):
    """Same size, other bytes: the modification time tells them apart."""
    corpus(tmp_path / "in")
    args = job_args(tmp_path)
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: (area(out) / staging.ARRAYS).exists())
    changed = tmp_path / "in" / "part-0.jsonl"
    data = changed.read_bytes()
    changed.write_bytes(data.replace(b"document 0 ", b"document X "))
    assert changed.stat().st_size == len(data)
    reused = resume(args, out, tmp_path / "summary.json")
    assert (reused["input_units"], reused["chunks"]) == (FILES - 1, 0)
    assert dataset_digest(out) == fresh(tmp_path, args, "fresh.zarr")


@pytest.mark.slow
def test_an_input_file_edited_in_place_with_its_size_and_modification_time_restored_is_read_again(tmp_path):
    """Issue 27.4: same size, same modification time, other bytes. Only the bytes tell: a
    rerun reads again the bytes each staged unit was read from and compares their sha256
    with the one staged; a changed unit is read and tokenized afresh, and the shards (which
    gather documents from every unit) are written again."""
    corpus(tmp_path / "in")
    args = job_args(tmp_path)
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    changed = tmp_path / "in" / "part-0.jsonl"
    before, data = changed.stat(), changed.read_bytes()
    changed.write_bytes(data.replace(b"document 0 ", b"document X "))
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (changed.stat().st_size, changed.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    reused = resume(args, out, tmp_path / "summary.json")
    assert (reused["input_units"], reused["input_units_changed"], reused["chunks"]) == (FILES - 1, 1, 0)
    assert dataset_digest(out) == fresh(tmp_path, args, "fresh.zarr")


@pytest.mark.slow
def test_a_changed_tokenizer_file_redoes_everything(tmp_path):
    texts = [f"text {i} about tokenizers and shards " * (1 + i % 5) for i in range(2000)]
    for i in range(4):
        write_jsonl(tmp_path / "in" / f"part-{i}.jsonl", texts[i::4])
    tok = tmp_path / "tokenizer.json"
    train_byte_level_bpe(texts, 400).save(str(tok))
    args = ["--input", tmp_path / "in", "--tokenizer", tok, "--tokenizer_backend", "hf", "--num_shards", "6",
            "--tokens_chunk_size", "512", "--batch_documents", "40", "--rejected_output", tmp_path / "rejected"]
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    train_byte_level_bpe(texts, 600).save(str(tok))  # same path, other content
    proc = run_pipeline(*args, "--output", out, "--summary_json", tmp_path / "summary.json")
    reused = json.loads((tmp_path / "summary.json").read_text())["reused"]
    assert (reused["input_units"], reused["chunks"]) == (0, 0)
    # It used to re-tokenize everything without a word.
    assert "the tokenizer's content changed (sha256 " in proc.stderr, proc.stderr
    assert "staged input units no longer match this job and are read and tokenized again" in proc.stderr
    assert dataset_digest(out) == fresh(tmp_path, args, "fresh.zarr")


@pytest.mark.slow
def test_another_command_needs_overwrite_and_reuses_only_what_its_options_leave_alike(job, tmp_path):
    root, args, _ = job
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    reseeded = [*args, "--seed", "7"]
    proc = run_pipeline(*reseeded, "--output", out, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and "unfinished output" in proc.stderr
    # It says which options differ (it used to say only "an unfinished output is there").
    assert "made by another command (--seed 0 -> 7); rerun that command to resume it" in proc.stderr, proc.stderr
    # The seed changes no tokenized batch: every unit is reused, no chunk.
    proc = run_pipeline(*reseeded, "--overwrite", "--output", out, "--summary_json", tmp_path / "summary.json")
    reused = json.loads((tmp_path / "summary.json").read_text())["reused"]
    assert (reused["input_units"], reused["chunks"]) == (FILES, 0)
    assert "chunks written before are written again: since that work was staged, --seed 0 -> 7" in proc.stderr
    assert dataset_digest(out) == fresh(tmp_path, reseeded, "reseeded.zarr")
    # Other batch limits change every batch: nothing is reused.
    out2 = tmp_path / "out2.zarr"
    kill_when(args, out2, lambda: shards_recorded(out2) >= 2)
    rebatched = [*args, "--batch_documents", "33"]
    reused = resume([*rebatched, "--overwrite"], out2, tmp_path / "summary.json")
    assert (reused["input_units"], reused["chunks"]) == (0, 0)
    assert dataset_digest(out2) == fresh(tmp_path, rebatched, "rebatched.zarr")


@pytest.mark.slow
def test_restart_throws_the_staged_work_away(job, tmp_path):
    root, args, ref = job
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    assert staged_now(out)[1] > 0
    reused = resume([*args, "--restart"], out, tmp_path / "summary.json")
    assert (reused["input_units"], reused["chunks"]) == (0, 0)
    assert dataset_digest(out) == dataset_digest(ref)


@pytest.mark.slow
def test_no_staging_keeps_nothing_and_throws_found_work_away(job, tmp_path):
    root, args, ref = job
    out = tmp_path / "out.zarr"
    kill_when([*args, "--no_staging"], out, lambda: len(list(out.glob("train/encoded_tokens/[0-9]*"))) >= 3)
    assert [p.name for p in area(out).iterdir()] == [staging.COMMAND]  # no work: the command's record only
    # Rerunning the same command starts over, as docs/reruns.md says (it exited 2, telling to "rerun
    # the command that made it", which had just been done).
    run_pipeline(*args, "--no_staging", "--output", out)
    assert not area(out).exists()
    assert dataset_digest(out) == dataset_digest(ref)
    # Another command still needs --overwrite.
    out = tmp_path / "out1.zarr"
    kill_when([*args, "--no_staging"], out, lambda: len(list(out.glob("train/encoded_tokens/[0-9]*"))) >= 3)
    proc = run_pipeline(*args, "--no_staging", "--seed", "3", "--output", out, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and "--seed 0 -> 3" in proc.stderr
    out = tmp_path / "out2.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    run_pipeline(*args, "--no_staging", "--output", out, "--summary_json", tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text())["reused"] is None
    assert not area(out).exists()
    assert dataset_digest(out) == dataset_digest(ref)


@pytest.mark.slow
def test_a_committed_dataset_is_never_resumed(job, tmp_path):
    root, args, ref = job
    out = tmp_path / "out.zarr"
    shutil.copytree(ref, out)
    before = dataset_digest(out)
    # The same command: already built (the dataset, copied, is what it would build there).
    proc = run_pipeline(*args, "--output", out)
    assert "already built by run" in proc.stderr and "resum" not in proc.stderr + proc.stdout, proc.stderr
    # Another: refused.
    proc = run_pipeline(*args, "--seed", "5", "--output", out, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert not area(out).exists() and dataset_digest(out) == before


# ---------------------------------------------------------------------------------------------
# What is staged, and what is trusted


@pytest.mark.slow
def test_a_batch_that_failed_the_tokenizer_guard_is_never_reused(tmp_path):
    texts = [f"plain text number {i}" for i in range(600)]
    texts[450] = f"a document with {RARE_MARKER} inside"
    for i in range(3):
        write_jsonl(tmp_path / "in" / f"part-{i}.jsonl", texts[i * 200:(i + 1) * 200])
    tok = tmp_path / "tokenizer.json"
    train_byte_level_bpe(texts, 300).save(str(tok))
    args = ["--input", tmp_path / "in", "--tokenizer", tok, "--tokenizer_backend",
            "tests.wrong_backends:wrong_on_rare_documents", "--tokenizer_check_fraction", "1",
            "--batch_documents", "20", "--output", tmp_path / "out.zarr"]
    proc = run_pipeline(*args, check=False)
    assert proc.returncode == 1 and RARE_MARKER in proc.stderr
    listed = staging.StagingArea(str(tmp_path / "out.zarr")).listing()
    marked = tmp_path / "out.zarr" / STAGING / "units"
    for unit in marked.iterdir():  # the marker's batch may have its ids staged, never its documents
        ids = {p.name.split(".")[0] for p in unit.glob("*.ids")}
        documents = {p.name.split(".")[0] for p in unit.glob("*.batch")}
        assert documents <= ids
    assert len(listed.units) < 3
    proc = run_pipeline(*args, check=False)  # the same command: the bad batch is tokenized and checked again
    assert proc.returncode == 1 and RARE_MARKER in proc.stderr


def stage_batches(area, batches):
    """One bundle of TokenizeAndStage (the bytes tokenizer) over `batches`, as a runner drives
    it; returns what it emitted, or raises what finishing the bundle raised."""
    import numpy as np

    from transforms.records import DocumentBatch
    from transforms.tokenize.staged import TokenizeAndStage
    from transforms.tokenize.tokenizer import resolve_tokenizer

    fn = TokenizeAndStage(resolve_tokenizer("bytes"), area)
    fn.setup()
    try:
        fn.start_bundle()
        out = [t for key, texts in batches for t in fn.process(
            DocumentBatch(key, "auto", np.arange(len(texts), dtype=np.uint64) * 100, texts))]
        fn.finish_bundle()
        return out
    finally:
        fn.teardown()


def test_staged_ids_are_written_while_the_next_batch_is_tokenized_and_a_failed_write_fails_the_bundle(tmp_path):
    """A batch goes on naming the file its ids are being written to; once the bundle has
    finished every file holds its batch's ids and each batch is staged whole. A write that
    fails (here: a file stands where the unit's folder goes) fails the bundle, and that
    batch's documents are never staged, so no rerun can trust it."""
    units = {"0:a.jsonl": ([0], ["a" * 32]), "1:b.jsonl": ([0], ["b" * 32])}
    area = staging.StagingArea(str(tmp_path / "out"), unit_keys=units)
    out = stage_batches(area, [("0:a.jsonl", ["one", "two"]), ("1:b.jsonl", ["three", "four", "five"])])
    assert [t.ids_file.path for t in out] == [area.batch_ids_path(u[1][0], 0) for u in units.values()]
    for t in out:
        assert open(t.ids_file.path, "rb").read() == t.ids.tobytes() and t.ids.size > 0 and t.ids_file.sum == Sum.of(t.ids)
        assert os.path.exists(t.ids_file.path.removesuffix(staging.IDS) + staging.BATCH)

    broken = staging.StagingArea(str(tmp_path / "broken"), unit_keys=units)
    folder = tmp_path / "broken" / STAGING / "units"
    folder.mkdir(parents=True)
    (folder / ("b" * 32)).write_text("not a folder")
    with pytest.raises(OSError):
        stage_batches(broken, [("0:a.jsonl", ["one", "two"]), ("1:b.jsonl", ["three"])])
    assert sorted(p.name for p in (folder / ("a" * 32)).iterdir()) == [
        staging.place_name(0) + staging.BATCH, staging.place_name(0) + staging.IDS]
    assert (folder / ("b" * 32)).read_text() == "not a folder"


def test_a_unit_is_trusted_only_with_its_account_and_every_batch(tmp_path):
    a = staging.StagingArea(str(tmp_path / "out"))
    unit = "0" * 32
    (tmp_path / "out" / STAGING / "units" / unit).mkdir(parents=True)
    folder = tmp_path / "out" / STAGING / "units" / unit
    (folder / "unit.2.json").write_text("{}")
    (folder / f"{staging.place_name(0)}.ids").write_bytes(b"")
    (folder / f"{staging.place_name(0)}.batch").write_bytes(b"")
    (folder / f"{staging.place_name(9)}.ids").write_bytes(b"")
    (folder / f"{staging.place_name(9)}.batch.1234.tmp").write_bytes(b"")  # a write a kill cut short
    assert a.listing().units == {}
    (folder / f"{staging.place_name(9)}.batch").write_bytes(b"")
    assert a.listing().units == {unit: "unit.2.json"}
    assert STAGING == staging.FOLDER


# ---------------------------------------------------------------------------------------------
# On gs:// and on a portable runner


def gs_dataset_digest(fs, path: str) -> dict:
    """dataset_digest of a gs:// dataset, from the emulator's own listing."""
    fs.invalidate_cache()
    run_id = json.loads(fs.cat_file(f"{path}/.zattrs"))["run_id"].encode()

    def content(p: str) -> bytes:
        data = fs.cat_file(p)
        if p.endswith("/.zattrs") and p[len(path) + 1:] == ".zattrs":  # the seal left out, as dataset_digest does
            document = json.loads(data)
            document.pop("manifest", None)
            data = json.dumps(document, sort_keys=True).encode()
        return data.replace(run_id, b"<run id>")
    return {p[len(path) + 1:]: hashlib.sha256(content(p)).hexdigest() for p in fs.find(path)
            if not p[len(path) + 1:].startswith(".flat-tokens-run.") and p[len(path) + 1:] != "flat-tokens-manifest.json"}


@pytest.mark.slow
def test_gs_a_killed_run_resumes_to_the_same_bytes(gcs, tmp_path):
    corpus(tmp_path / "in", files=4, per_file=400)
    gcs.fs.put(str(tmp_path / "in") + "/", f"{BUCKET}/resume/in/", recursive=True)
    args = ["--input", f"gs://{BUCKET}/resume/in", "--tokenizer", "bytes", "--num_shards", "6",
            "--validation_fraction", "0.1", "--tokens_chunk_size", "1024", "--seq_starts_chunk_size", "64",
            "--batch_documents", "40", "--rejected_output", f"gs://{BUCKET}/resume/rejected"]
    run_pipeline(*args, "--output", f"gs://{BUCKET}/resume/ref.zarr", env=gcs.env)
    expected = gs_dataset_digest(gcs.fs, f"{BUCKET}/resume/ref.zarr")

    def gs_units_trusted(path: str) -> int:
        """Units a rerun may reuse: an account can land before its last batch (see units_staged).
        Listed with the emulator's own client: this process's default gs:// client would ask
        the emulator for bucket layouts over gRPC."""
        gcs.fs.invalidate_cache()
        root = f"{path}/{STAGING}/"
        names = [p[len(root):] for p in gcs.fs.find(root) if not p.endswith(staging.TEMPORARY)]
        return len(staging.whole_units(names))

    def gs_shards_recorded(path: str) -> int:
        gcs.fs.invalidate_cache()
        return len(gcs.fs.glob(f"{path}/{STAGING}/shards/*/*.rec"))

    env = {**os.environ, **gcs.env}
    for moment, staged, count in (("units read", gs_units_trusted, 2), ("shards written", gs_shards_recorded, 2)):
        path = f"{BUCKET}/resume/{moment.replace(' ', '-')}.zarr"
        cmd = [sys.executable, "-m", "pipeline.run", *args, "--output", f"gs://{path}"]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        while proc.poll() is None and staged(path) < count:
            time.sleep(0.01)
        assert proc.poll() is None, f"the run ended before {moment}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        gcs.fs.invalidate_cache()
        assert not gcs.fs.exists(f"{path}/.zgroup")
        summary = tmp_path / "summary.json"
        run_pipeline(*args, "--output", f"gs://{path}", "--summary_json", summary, env=gcs.env)
        reused = json.loads(summary.read_text())["reused"]
        assert reused["input_units"] >= count and (moment == "units read" or reused["chunks"] > 0), reused
        assert not gcs.fs.exists(f"{path}/{STAGING}")
        assert gs_dataset_digest(gcs.fs, path) == expected, moment


@pytest.mark.slow
def test_a_relaunched_portable_runner_job_resumes(job, tmp_path):
    """The job runs in the job service and its workers: the launcher, the service and the
    workers all die (as when a cluster job fails), then the same command is launched again."""
    root, args, ref = job
    out = tmp_path / "out.zarr"
    with portable_services(tmp_path / "svc1") as svc:
        cmd = [sys.executable, "-m", "pipeline.run", *map(str, args), "--output", str(out), *svc.pipeline_args]
        proc = subprocess.Popen(cmd, cwd=REPO, env=svc.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 600
        while proc.poll() is None and shards_recorded(out) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        for p in (proc, svc.job, svc.pool):
            os.killpg(p.pid, signal.SIGKILL)
        proc.wait()
    assert not committed(out) and shards_recorded(out) >= 2
    units, chunks = staged_now(out)
    with portable_services(tmp_path / "svc2") as svc:
        run_pipeline(*args, "--output", out, "--summary_json", tmp_path / "summary.json", *svc.pipeline_args,
                     env=svc.env, timeout=600)
    reused = json.loads((tmp_path / "summary.json").read_text())["reused"]
    assert (reused["input_units"], reused["chunks"]) == (units, chunks) and chunks > 0
    assert dataset_digest(out) == dataset_digest(ref)


def parquet_corpus(root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    texts = [f"row {i} " + "parquet words " * (i % 19) for i in range(4000)]
    root.mkdir(parents=True)
    for i in range(2):
        pq.write_table(pa.table({"text": texts[i::2]}), root / f"part-{i}.parquet", row_group_size=250)
    return root


def mixture_corpus(root: Path) -> Path:
    corpus(root / "web", files=2, per_file=800)
    corpus(root / "code", files=2, per_file=600)
    (root / "mix.yaml").write_text(f"sources:\n  - {{name: web, input: ['{root / 'web'}'], weight: 2}}\n"
                                   f"  - {{name: code, input: ['{root / 'code'}'], weight: 1, max_epochs: 3}}\n")
    return root


def corpus_and_tokenizer(root: Path) -> Path:
    corpus(root)
    texts = [f"document {i} " + "words and more words " * (i % 23) for i in range(400)]
    train_byte_level_bpe(texts, 500).save(str(root.parent / "tok.json"))  # not among the inputs
    return root


VARIANTS = {
    "a fast backend checked by the guard": (corpus_and_tokenizer, [
        "--tokenizer", "{root}/../tok.json", "--tokenizer_backend", "fastokens", "--tokenizer_check_fraction", "0.3"]),
    "dedup": (corpus, ["--dedup", "exact"]),
    "zarr 3 sharded": (corpus, ["--zarr_format", "3", "--chunks_per_shard", "2", "--codec", "blosc-zstd"]),
    "parquet": (parquet_corpus, []),
    "mixture": (mixture_corpus, ["--mixture", "{root}/mix.yaml"]),
    "length limits and a mixture": (mixture_corpus, [
        "--mixture", "{root}/mix.yaml", "--min_tokens", "20", "--max_tokens", "100"]),
    "two worker processes": (corpus, ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]),
    "four worker threads": (corpus, ["--direct_num_workers", "4", "--direct_running_mode", "multi_threading"]),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.slow
def test_resume_gives_the_same_bytes_with(variant, tmp_path):
    make, extra = VARIANTS[variant]
    make(tmp_path / "in")
    args = job_args(tmp_path, *(e.format(root=tmp_path / "in") for e in extra))
    if "--mixture" in extra:
        args = args[2:]  # no --input
    ref = tmp_path / "ref.zarr"
    run_pipeline(*args, "--output", ref)
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    units, chunks = staged_now(out)
    reused = resume(args, out, tmp_path / "summary.json")
    assert (reused["input_units"], reused["chunks"]) == (units, chunks) and units and chunks
    assert dataset_digest(out) == dataset_digest(ref)
