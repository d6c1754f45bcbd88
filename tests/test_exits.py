"""How a run ends when it cannot report: a --summary_json that cannot be written is refused
before any data is read, and never turns a committed dataset into a reported failure. Real
runs in subprocesses, changed at observed moments."""
import os
import subprocess
import sys
import time

import pytest

from pipeline import verify
from tests.helpers import REPO, run_pipeline, write_jsonl


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Enough documents, in small batches, that a run is still reading well after it spills
    its first batch (the moment the tests stop it)."""
    root = tmp_path_factory.mktemp("exits")
    texts = [f"document {i} " + "words and more words " * (i % 37) for i in range(30000)]
    for i in range(3):
        write_jsonl(root / "in" / f"part-{i}.jsonl", texts[i::3])
    return root / "in"


def args(corpus, out, *more):
    return ["--input", corpus, "--tokenizer", "bytes", "--output", out, "--batch_documents", "200", *more]


def start(temp, *run_args):
    """A run in a new session, its temporary directory `temp` (TMPDIR)."""
    cmd = [sys.executable, "-m", "pipeline.run", *map(str, run_args)]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_until_spilled(proc, temp):
    """Until the run has tokenized and spilled its first batch (transforms/shuffle/spill.py):
    it is reading, its output not yet touched."""
    while proc.poll() is None and not any(n.endswith(".ids") for _, _, files in os.walk(temp) for n in files):
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be stopped: " + proc.stderr.read()[-2000:]



# ---------------------------------------------------------------------------------------------
# --summary_json


@pytest.mark.parametrize("where", ["in a missing directory", "under a file", "a directory"])
def test_a_summary_json_that_cannot_be_written_is_refused_before_reading(tmp_path, where):
    (tmp_path / "file.txt").write_text("a file\n")
    (tmp_path / "dir").mkdir()
    path = {"in a missing directory": tmp_path / "missing" / "s.json", "under a file": tmp_path / "file.txt" / "s.json",
            "a directory": tmp_path / "dir"}[where]
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    out = tmp_path / "out.zarr"
    proc = run_pipeline("--input", src, "--tokenizer", "bytes", "--output", out, "--summary_json", path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"flat-tokens: error: --summary_json {path}: cannot be written "
        f"({ {'in a missing directory': 'No such file or directory', 'under a file': 'Not a directory', 'a directory': 'Is a directory'}[where] }); "
        f"choose a path in a writable directory"], proc.stderr
    assert not out.exists() and sorted(os.listdir(tmp_path / "dir")) == []


def test_a_summary_json_that_fails_after_the_commit_is_a_warning_not_a_failure(tmp_path, corpus):
    """The path was writable at launch and is not by the end: the dataset is committed, so
    the run says so, warns, and exits 0."""
    temp, reports = tmp_path / "tmp", tmp_path / "reports"
    temp.mkdir()
    reports.mkdir()
    out = tmp_path / "out.zarr"
    proc = start(temp, *args(corpus, out, "--summary_json", reports / "summary.json"))
    wait_until_spilled(proc, temp)
    reports.rmdir()
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert (f"flat-tokens: warning: --summary_json {reports / 'summary.json'}: cannot be written (No such file or "
            f"directory); {out} is committed") in stderr
    assert f"flat-tokens: wrote {out}" in stdout
    assert verify.verify_dataset(str(out)) == []
