"""gs:// end to end against a real GCS emulator (fake-gcs-server): inputs by glob (one of them
gzipped), the tokenizer, the output and the rejected-lines report all on gs://, on the
in-process DirectRunner, on two worker processes and on four SDK harness threads of one
process; the result must equal a local run of the same input, pass `flat_tokens.tools.verify`, and
exit without interpreter-exit noise."""
import json
import os
import subprocess
import sys

import pytest

from tests.gcs_emulator import BUCKET, gcs, gcs_corpus  # noqa: F401 - pytest fixtures
from tests.helpers import REPO, check_flat_tokens, run_pipeline

GS = f"gs://{BUCKET}"
INPUT = f"{GS}/corpus/*.jsonl*"
# What gcsfs/aiohttp print when sessions are left to the garbage collector at exit.
EXIT_NOISE = ("Traceback", "Exception ignored", "Unclosed", "Task was destroyed")
COMMON = ["--seed", "7", "--validation_fraction", "0.05", "--max_rejected_fraction", "0.01"]
MULTI_PROCESS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def assert_quiet(stderr: str):
    noisy = [line for line in stderr.splitlines() if any(n in line for n in EXIT_NOISE)]
    assert not noisy, "interpreter-exit noise on stderr:\n" + stderr[-4000:]


def gs_run(gcs, output: str, *extra):
    return run_pipeline("--input", INPUT, "--tokenizer", f"{GS}/tok.json", "--output", f"{GS}/{output}",
                        "--rejected_output", f"{GS}/{output}.rejected-lines", *COMMON, *extra,
                        env=gcs.env, timeout=100)


def fetch(gcs, output: str, dest):
    """Copies a gs:// dataset to a local directory (gcsfs `get`)."""
    gcs.fs.get(f"{BUCKET}/{output}/", str(dest) + "/", recursive=True)
    return dest


def report_rows(fs_open, paths):
    rows = []
    for p in paths:
        with fs_open(p, "rb") as f:
            rows += [json.loads(line) for line in f.read().decode().splitlines()]
    return sorted((r["line"], r["reason"], r["byte_offset"], r["file"].rsplit("/", 1)[-1]) for r in rows)


@pytest.fixture(scope="module")
def local_run(gcs_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "out.zarr"
    run_pipeline("--input", gcs_corpus / "corpus" / "*.jsonl*", "--tokenizer", gcs_corpus / "tok.json",
                 "--output", out, *COMMON, timeout=100)
    return out


@pytest.fixture(scope="module")
def gs_direct(gcs, gcs_corpus):
    return gs_run(gcs, "out.zarr")


@pytest.mark.slow
def test_in_process_runner_reads_and_writes_gs(gcs, gs_direct, local_run, tmp_path):
    assert_quiet(gs_direct.stderr)
    check_flat_tokens(fetch(gcs, "out.zarr", tmp_path / "out.zarr"), "--compare", local_run)
    # The report is written on gs:// too, and says the same as the local run's.
    gs_reports = gcs.fs.glob(f"{BUCKET}/out.zarr.rejected-lines/rejected-*.jsonl")
    local_reports = sorted(local_run.parent.glob("out.zarr.rejected/rejected-*.jsonl"))
    assert len(gs_reports) == len(local_reports) == 1
    assert report_rows(gcs.fs.open, gs_reports) == report_rows(open, local_reports)


@pytest.mark.slow
def test_two_worker_processes_overwrite_gs_output(gcs, gcs_corpus, local_run, tmp_path):
    # An earlier run's unfinished output (its claim and a chunk), replaced with --overwrite by
    # workers in other processes. (Anything not this tool's would be refused: test_output_safety.)
    gcs.fs.pipe({f"{BUCKET}/out-mp.zarr/.flat-tokens-run.1": b'{"run_id": "an-earlier-run"}',
                 f"{BUCKET}/out-mp.zarr/train/encoded_tokens/0": b"from an earlier run"})
    proc = gs_run(gcs, "out-mp.zarr", "--overwrite", *MULTI_PROCESS)
    assert_quiet(proc.stderr)
    gcs.fs.invalidate_cache()
    assert not gcs.fs.exists(f"{BUCKET}/out-mp.zarr/.flat-tokens-run.1")
    check_flat_tokens(fetch(gcs, "out-mp.zarr", tmp_path / "out-mp.zarr"), "--compare", local_run)


@pytest.mark.slow
def test_worker_threads_of_one_process_read_and_write_gs(gcs, local_run, tmp_path):
    """Bundles on four threads at once (multi_threading) share one gcsfs client and its event
    loop: small batches, so that each thread reads, stages and writes many objects."""
    proc = gs_run(gcs, "out-mt.zarr", "--direct_running_mode=multi_threading", "--direct_num_workers=4",
                  "--batch_documents", "8")
    assert_quiet(proc.stderr)
    check_flat_tokens(fetch(gcs, "out-mt.zarr", tmp_path / "out-mt.zarr"), "--compare", local_run)


def test_verify_reads_gs_through_the_emulator(gcs, gs_direct):
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", f"{GS}/out.zarr"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **gcs.env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("OK: train ")
    assert_quiet(proc.stderr)


@pytest.mark.slow
def test_existing_gs_output_is_refused_without_overwrite(gcs, gs_direct):
    before = gcs.fs.cat(f"{BUCKET}/out.zarr/.zattrs")
    proc = run_pipeline("--input", INPUT, "--tokenizer", f"{GS}/tok.json", "--output", f"{GS}/out.zarr",
                        *COMMON, env=gcs.env, check=False, timeout=100)
    assert proc.returncode == 2, proc.stderr
    assert "exists and is not empty; pass --overwrite" in proc.stderr
    assert gcs.fs.cat(f"{BUCKET}/out.zarr/.zattrs") == before
    assert_quiet(proc.stderr)


@pytest.mark.slow
def test_a_mixture_file_on_gs_reads_its_sources_relative_to_itself(gcs, gcs_corpus, tmp_path):
    """The same mixture text, on gs:// and locally: relative inputs resolve next to the file,
    so both runs read the same files and write the same arrays."""
    text = ("sources:\n"
            "  - {name: even, input: ['corpus/part-0.jsonl', 'corpus/part-2.jsonl'], weight: 2}\n"
            "  - {name: odd, input: 'corpus/part-[13].jsonl*', weight: 1, max_epochs: 2}\n")
    (gcs_corpus / "mix.yaml").write_text(text)
    gcs.fs.pipe(f"{BUCKET}/mix.yaml", text.encode())
    common = ["--tokenizer", f"{GS}/tok.json", "--dedup", "exact", *COMMON]
    run_pipeline("--mixture", gcs_corpus / "mix.yaml", "--output", tmp_path / "local.zarr", *common,
                 env=gcs.env, timeout=100)
    proc = run_pipeline("--mixture", f"{GS}/mix.yaml", "--output", f"{GS}/mixed.zarr", *common, env=gcs.env,
                        timeout=100)
    assert_quiet(proc.stderr)
    check_flat_tokens(fetch(gcs, "mixed.zarr", tmp_path / "mixed.zarr"), "--compare", tmp_path / "local.zarr")
    sources = json.loads(gcs.fs.cat(f"{BUCKET}/mixed.zarr/.zattrs"))["mixture"]["sources"]
    assert sources[1]["inputs"] == [f"{GS}/corpus/part-[13].jsonl*"]
    assert all(s["train_tokens"] > 0 for s in sources)


def user_env(gcs) -> dict:
    """This process's environment with only STORAGE_EMULATOR_HOST set for GCS: no gcsfs
    settings, no credentials."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GCSFS_", "STORAGE_EMULATOR", "GOOGLE_APPLICATION_CREDENTIALS", "FSSPEC_"))}
    return {**env, "STORAGE_EMULATOR_HOST": gcs.url}


@pytest.mark.slow
def test_only_storage_emulator_host_is_needed_and_the_run_is_quiet(gcs, gcs_corpus, local_run, tmp_path):
    """It used to print ~200 lines of 'Could not determine bucket type ... default credentials
    were not found' (gcsfs's zonal/HNS probe, for every file opened)."""
    cmd = [sys.executable, "-m", "pipeline.run", "--input", INPUT, "--tokenizer", f"{GS}/tok.json",
           "--output", f"{GS}/out-plain.zarr", "--rejected_output", f"{GS}/out-plain.rejected-lines", *COMMON]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=100, env=user_env(gcs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if not line.startswith("progress: ")] == [], proc.stderr[-3000:]
    check_flat_tokens(fetch(gcs, "out-plain.zarr", tmp_path / "out.zarr"), "--compare", local_run)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", f"{GS}/out-plain.zarr"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=user_env(gcs))
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr[-3000:]
