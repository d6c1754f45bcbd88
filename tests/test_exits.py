"""How a run ends when it is stopped or cannot report: SIGTERM and SIGINT end it like a
failure (its temporary files removed, its workers stopped, one line, exit 143 / 130); a
later run removes what killed runs of this tool left, and nothing else; a --summary_json
that cannot be written is refused before any data is read, and never turns a committed
dataset into a reported failure. Real runs in subprocesses, stopped at observed moments."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.local import scratch
from flat_tokens.tools import verify
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
    # No progress line: on a loaded machine one would come before the stop message these tests read.
    return ["--input", corpus, "--tokenizer", "bytes", "--output", out, "--batch_documents", "200",
            "--progress_interval", "3600", *more]


def start(temp, *run_args):
    """A run in a new session, its temporary directory `temp` (TMPDIR)."""
    cmd = [sys.executable, "-m", "pipeline.run", *map(str, run_args)]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_until_spilled(proc, temp, out):
    """Until the run has tokenized its first batch and written its ids where the shuffle maps
    them: staged under the output (transforms/staging.py), or with --no_staging spilled in
    the temporary directory (transforms/shuffle/spill.py). It is reading, its output not yet
    claimed."""
    def written():
        return any(n.endswith(".ids") for root in (temp, out) for _, _, files in os.walk(root) for n in files)
    while proc.poll() is None and not written():
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be stopped: " + proc.stderr.read()[-2000:]


def processes_with(temp) -> list[int]:
    """Live processes started with TMPDIR=temp: the run's launcher and workers."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TMPDIR={temp}".encode() in f.read().split(b"\0"):
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("signum, to_group, workers", [
    (signal.SIGTERM, False, []),  # a scheduler, `docker stop`, `kill PID`
    (signal.SIGINT, False, []),
    (signal.SIGINT, True, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),  # Ctrl-C
    (signal.SIGTERM, False, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]),
], ids=["sigterm", "sigint", "ctrl-c-with-workers", "sigterm-with-workers"])
@pytest.mark.slow
def test_a_stopped_run_removes_its_temporary_files_and_says_so_in_one_line(tmp_path, corpus, signum, to_group,
                                                                           workers):
    temp = tmp_path / "tmp"
    (temp / "beam-pipeline-tempsomeone").mkdir(parents=True)  # another program's: stays
    out = tmp_path / "out.zarr"
    proc = start(temp, *args(corpus, out, *workers))
    wait_until_spilled(proc, temp, out)
    (os.killpg if to_group else os.kill)(proc.pid, signum)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, stderr
    # A progress line comes every 10 s: on a busy machine one may precede the stop.
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("progress: ")]
    name = signal.Signals(signum).name
    assert lines == [f"flat-tokens: stopped by {name} before the run finished; {out} was not committed by this "
                     f"run (rerun the same command to resume it); its temporary files are removed"], stderr
    assert sorted(os.listdir(temp)) == ["beam-pipeline-tempsomeone"]
    for _ in range(2000):  # the workers were told to stop: they must go
        if not processes_with(temp):
            break
        time.sleep(0.01)
    assert not processes_with(temp)


@pytest.mark.parametrize("more, rerun, advice", [
    ([], [], "rerun the same command to resume it"),
    # The same command, no --overwrite: a --no_staging run's rerun starts over (issue 27.9).
    (["--no_staging"], [], "--no_staging kept nothing to resume: rerunning the same command starts over"),
], ids=["staged", "no-staging"])
@pytest.mark.slow
def test_the_stop_message_says_how_to_go_on_and_that_way_works(tmp_path, corpus, more, rerun, advice):
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "out.zarr"
    proc = start(temp, *args(corpus, out, *more))
    wait_until_spilled(proc, temp, out)
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143 and f"({advice})" in stderr, stderr
    run_pipeline(*args(corpus, out, *more, *rerun), "--quiet")
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_a_later_run_removes_what_killed_runs_of_this_tool_left_and_nothing_else(tmp_path, corpus):
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = start(temp, *args(corpus, tmp_path / "killed.zarr"))
    wait_until_spilled(proc, temp, tmp_path / "killed.zarr")
    os.killpg(proc.pid, signal.SIGKILL)  # nothing can clean up after this but a later run
    proc.wait()
    left = sorted(os.listdir(temp))
    assert [n.split("-")[2] for n in left] == ["progress", "shuffle"], left
    live = temp / "flat-tokens-shuffle-a-live-run"  # a run still going (this process stands for it)
    live.mkdir()
    scratch.mark(str(live))
    older = temp / "flat-tokens-progress-of-an-older-version"  # no owner record: who knows
    older.mkdir()
    (older / "totals.json").write_text("{}")
    for name in ("beam-pipeline-tempother", "my-files"):
        (temp / name).mkdir()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    (temp / "flat-tokens-progress-of-an-ended-run").mkdir()
    (temp / "flat-tokens-progress-of-an-ended-run" / scratch.OWNER).write_text(json.dumps({
        **json.loads((live / scratch.OWNER).read_text()), "pid": ended.pid}))
    src = write_jsonl(tmp_path / "small.jsonl", ["one document", "another one"])
    run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "later.zarr",
                 env={"TMPDIR": str(temp)})
    assert sorted(os.listdir(temp)) == sorted(["beam-pipeline-tempother", "my-files", live.name, older.name])
    assert (older / "totals.json").exists() and (live / scratch.OWNER).exists()


# ---------------------------------------------------------------------------------------------
# --summary_json


@pytest.mark.parametrize("where", ["in a missing directory", "under a file", "a directory"])
@pytest.mark.slow
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
    wait_until_spilled(proc, temp, out)
    reports.rmdir()
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert (f"flat-tokens: warning: --summary_json {reports / 'summary.json'}: cannot be written (No such file or "
            f"directory); {out} is committed") in stderr
    assert f"flat-tokens: wrote {out}" in stdout
    assert verify.verify_dataset(str(out)) == []
