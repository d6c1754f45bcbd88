"""A cluster on one machine: the job on two SDK worker processes that share no disk with the
launcher or with each other, and the same bytes as the in-process run.

Each worker is started by the command docs/scale.md gives ("A cluster on one machine"):
Beam's FnApiRunner starts it through `--environment_type beam:env:harness_subprocess_python:v1`,
and it runs in a mount namespace of its own with an empty private /tmp (`unshare --mount`,
root only). The launcher is a third process. All that the three share is the GCS emulator:
the JSONL and Parquet inputs, the tokenizer, the mixture file, the output and the
rejected-lines report are gs:// URLs. Anything the launcher left in its own temporary
directory for the workers (a shuffle spill directory, progress files) would be out of their
sight, and the run would fail or differ from the in-process one.
"""
import json
import os
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gcs_emulator import BUCKET, corpus_texts, gcs, gcs_corpus  # noqa: F401 - pytest fixtures
from tests.helpers import REPO, run_pipeline

GS = f"gs://{BUCKET}"
HERE = f"{GS}/cluster"
# Many shards and small chunks: most chunks are shared by two shards, whose writers may run
# on different workers.
COMMON = ["--tokenizer", f"{GS}/tok.json", "--seed", "11", "--validation_fraction", "0.05",
          "--max_rejected_fraction", "0.02", "--num_shards", "5", "--tokens_chunk_size", "512",
          "--seq_starts_chunk_size", "64"]
INPUTS = ["--input", f"{GS}/corpus/*.jsonl*", "--input", f"{HERE}/parquet/*.parquet"]
# docs/scale.md's command, with one line of evidence from inside each worker's namespace: its
# mount namespace and how many entries its /tmp held when it started.
EVIDENCE = 'echo "isolated worker: $(readlink /proc/self/ns/mnt) tmp entries: $(ls -A /tmp | wc -l)" >&2'
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="unshare --mount needs root (CI runs as root)")


def isolated_worker_command(python: str = sys.executable, evidence: str = "") -> str:
    """The command that starts one SDK worker in a mount namespace of its own with an empty /tmp.

    When the repository itself (the code and its .venv) lies under /tmp, as a clone made
    there does, the empty /tmp would hide the code: it is bound back in place, and only it,
    after the evidence of an empty /tmp is taken (the shell's working directory still
    reaches the hidden original, through /proc/self/cwd)."""
    repo = os.path.realpath(REPO)
    under_tmp = repo == "/tmp" or repo.startswith("/tmp/")
    steps = ([f"cd {shlex.quote(repo)}"] if under_tmp else []) + ["mount -t tmpfs tmpfs /tmp"]
    steps += [evidence] if evidence else []
    if under_tmp:
        steps += [f"mkdir -p {shlex.quote(repo)}",
                  f"mount --no-canonicalize --bind /proc/self/cwd {shlex.quote(repo)}"]
    inner = " && ".join(steps + [f"exec {shlex.quote(python)} -m pipeline.local.worker"])
    return f"unshare --mount --propagation private sh -c {shlex.quote(inner)}"


def isolated_workers(n: int = 2) -> list[str]:
    return [f"--direct_num_workers={n}", "--environment_type=beam:env:harness_subprocess_python:v1",
            f"--environment_config={isolated_worker_command(evidence=EVIDENCE)}"]


@pytest.fixture(scope="module")
def cluster_inputs(gcs, gcs_corpus, tmp_path_factory):
    """gs://bucket/cluster/: a Parquet file (two row groups, a null row) beside the JSONL corpus
    of gcs_corpus, and a mixture of the two (the Parquet source relative to the mixture file)."""
    root = tmp_path_factory.mktemp("cluster")
    texts = corpus_texts()[400:700]
    texts.insert(17, None)
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), root / "docs.parquet", row_group_size=200)
    gcs.fs.put(str(root / "docs.parquet"), f"{BUCKET}/cluster/parquet/docs.parquet")
    gcs.fs.pipe(f"{BUCKET}/cluster/mix.yaml", (
        "sources:\n"
        f"  - {{name: jsonl, input: ['{GS}/corpus/*.jsonl*'], weight: 2}}\n"
        "  - {name: parquet, input: 'parquet/*.parquet', weight: 1, max_epochs: 2}\n").encode())


def objects(gcs, output: str) -> dict[str, bytes]:
    """Every object of a dataset's splits, by key relative to the output, except each split
    group's attributes (they name the run)."""
    base = f"{BUCKET}/cluster/{output}"
    found = {}
    for path in gcs.fs.find(base):
        key = path[len(base) + 1:]
        if "/" in key and not key.endswith("/.zattrs"):
            found[key] = gcs.fs.cat_file(path)
    return found


def report_rows(gcs, output: str) -> list[tuple]:
    rows = []
    for path in gcs.fs.glob(f"{BUCKET}/cluster/{output}.rejected/rejected-*.jsonl"):
        rows += [json.loads(line) for line in gcs.fs.cat_file(path).decode().splitlines()]
    return sorted((r["file"], r.get("line"), r.get("row"), r["reason"], r["excerpt"]) for r in rows)


def run_both(gcs, name: str, *args):
    """The same job in-process and on isolated workers; returns (in-process, isolated) names
    and the isolated run's process."""
    gcs.fs.invalidate_cache()
    run_pipeline(*args, "--output", f"{HERE}/{name}-in-process.zarr", *COMMON, env=gcs.env, timeout=300)
    # The launcher's temporary directory is /tmp, which no worker sees.
    proc = run_pipeline(*args, "--output", f"{HERE}/{name}-isolated.zarr", *COMMON, *isolated_workers(),
                        env={**gcs.env, "TMPDIR": "/tmp"}, timeout=300)
    gcs.fs.invalidate_cache()
    return f"{name}-in-process.zarr", f"{name}-isolated.zarr", proc


def assert_isolated(stderr: str, workers: int = 2):
    """The work ran in `workers` processes, each in a mount namespace that is neither the
    launcher's nor another worker's, with nothing in its /tmp at start."""
    found = [line.split() for line in stderr.splitlines() if line.startswith("isolated worker: ")]
    assert len(found) == workers, stderr[-3000:]
    namespaces = {words[2] for words in found}
    assert len(namespaces) == workers and os.readlink("/proc/self/ns/mnt") not in namespaces, found
    assert all(words[-1] == "0" for words in found), found


@needs_root
@pytest.mark.parametrize("dedup_and_mixture", [False, True], ids=["plain", "dedup-and-mixture"])
@pytest.mark.slow
def test_workers_that_share_no_disk_write_the_same_bytes(gcs, cluster_inputs, dedup_and_mixture):
    args = ["--mixture", f"{HERE}/mix.yaml", "--dedup", "near"] if dedup_and_mixture else INPUTS
    name = "mixed" if dedup_and_mixture else "plain"
    reference, isolated, proc = run_both(gcs, name, *args)
    assert_isolated(proc.stderr)
    assert "flat-tokens: wrote" in proc.stdout
    expected, got = objects(gcs, reference), objects(gcs, isolated)
    assert len(expected) > 20 and sorted(got) == sorted(expected)
    different = [key for key in expected if got[key] != expected[key]]
    assert not different, f"{len(different)} objects differ, e.g. {different[:5]}"
    attrs = [json.loads(gcs.fs.cat_file(f"{BUCKET}/cluster/{o}/.zattrs")) for o in (reference, isolated)]
    assert attrs[0]["stats"] == attrs[1]["stats"]
    if dedup_and_mixture:  # the near-duplicate graph ran on workers without the launcher's spill directory
        assert attrs[1]["stats"]["near_dedup"]["candidate_pairs"] > 0
    assert attrs[1]["stats"]["rejected"] == 2  # gcs_corpus's broken JSON line and the Parquet null
    assert attrs[1].get("mixture") == attrs[0].get("mixture")
    assert report_rows(gcs, isolated) == report_rows(gcs, reference)
    assert len(report_rows(gcs, isolated)) == 2
    verify = run_verify(gcs, f"{HERE}/{isolated}")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def run_verify(gcs, url: str):
    return subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", url], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **gcs.env})


@pytest.mark.parametrize("kind", ["PROCESS", "LOOPBACK"])
def test_a_worker_environment_the_default_runner_cannot_start_is_refused_before_reading(kind, tmp_path):
    """PROCESS and LOOPBACK are the portable runner's; the default runner used to fail the
    pipeline with the bare URN as its cause."""
    proc = run_pipeline("--input", REPO / "pipeline" / "sample" / "corpus-1.jsonl", "--tokenizer", "bytes",
                        "--output", tmp_path / "out.zarr", f"--environment_type={kind}",
                        "--environment_config=/bin/true", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"flat-tokens: error: --environment_type {kind}: the default runner cannot start workers that way; it "
        f"starts them with beam:env:harness_subprocess_python:v1 (a command that starts one worker, in "
        f"--environment_config), EXTERNAL (a worker pool) or DOCKER. PROCESS and LOOPBACK are for "
        f"--runner=PortableRunner"]
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("which", ["every worker", "one worker"])
@pytest.mark.slow
def test_workers_that_cannot_start_fail_the_run_with_their_own_message(tmp_path, which):
    """`exec: ... not found` (return code 127) in the one-machine recipe: the launcher used to
    wait forever for workers that had died. The run fails (exit 1) with the worker's message;
    one dead worker of two is enough, since the runner would wait for its answers."""
    lock = tmp_path / "first-worker-started"
    bad = "exec /nonexistent/python -m pipeline.local.worker"
    good = f"exec {shlex.quote(sys.executable)} -m pipeline.local.worker"
    inner = bad if which == "every worker" else f"if mkdir {shlex.quote(str(lock))} 2>/dev/null; then {good}; else {bad}; fi"
    proc = run_pipeline("--input", REPO / "pipeline" / "sample" / "corpus-1.jsonl", "--tokenizer", "bytes",
                        "--output", tmp_path / "out.zarr", "--direct_num_workers=2",
                        "--environment_type=beam:env:harness_subprocess_python:v1",
                        f"--environment_config=sh -c {shlex.quote(inner)}", check=False,
                        timeout=240)  # a hang guard: it used to wait forever
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flat-tokens: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "an SDK worker exited with return code 127" in errors[0], errors
    assert "exec: /nonexistent/python: not found" in errors[0], errors
    assert "see docs/scale.md, 'A cluster on one machine'" in errors[0], errors  # the recipe that works
    assert not (tmp_path / "out.zarr" / ".zgroup").exists()
