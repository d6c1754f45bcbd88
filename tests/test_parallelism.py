"""How many processes a local run uses (--local_parallelism), the worker processes forked from
the launcher, and the one promise whatever the parallelism: the same bytes."""
import json
import os
import subprocess
import sys
import time

import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pipeline.local import parallelism
from pipeline.options import OptionError
from tests.helpers import REPO, SAMPLE, check_flat_tokens, refused, run_pipeline, write_jsonl
from transforms import cores

# Many shards and tiny chunks: each worker writes shards, and chunks shared by shards that
# different workers wrote are merged; every value is far from the defaults.
STRESS = ["--num_shards", "7", "--tokens_chunk_size", "64", "--seq_starts_chunk_size", "16"]
GiB = 1 << 30


def summary(path) -> dict:
    return json.loads(path.read_text())["parallelism"]


@pytest.mark.slow
def test_the_output_is_the_same_bytes_whatever_the_parallelism(tmp_path, corpus, bpe_tokenizer):
    """One process, two and three forked worker processes, and two workers started as new
    interpreters (Beam's way): identical arrays, and each summary says what was used."""
    common = ["--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer, *STRESS]
    runs = {"auto": [], "1": ["--local_parallelism", "1"], "2": ["--local_parallelism", "2"],
            "3": ["--local_parallelism", "3"]}
    used = {}
    for name, extra in runs.items():
        run_pipeline(*common, *extra, "--output", tmp_path / f"{name}.zarr", "--summary_json",
                     tmp_path / f"{name}.json", "--quiet")
        used[name] = summary(tmp_path / f"{name}.json")
    run_pipeline(*common, "--local_parallelism", "2", "--output", tmp_path / "exec.zarr", "--summary_json",
                 tmp_path / "exec.json", env={"FLAT_TOKENS_FORK_WORKERS": "0"})
    used["exec"] = summary(tmp_path / "exec.json")
    check_flat_tokens(tmp_path / "auto.zarr", "--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer)
    for name in ("1", "2", "3", "exec"):
        check_flat_tokens(tmp_path / f"{name}.zarr", "--compare", tmp_path / "auto.zarr")
    # a small input on any machine: one process (auto's rule below)
    assert (used["auto"]["mode"], used["auto"]["workers"], used["auto"]["chosen_by"]) == ("in_memory", 1, "auto")
    assert (used["1"]["mode"], used["1"]["workers"], used["1"]["chosen_by"]) == ("in_memory", 1, "--local_parallelism")
    for name, n in (("2", 2), ("3", 3), ("exec", 2)):
        assert (used[name]["mode"], used[name]["workers"]) == ("multi_processing", n), used[name]
        assert used[name]["cores_per_worker"] == max(1, cores.available() // n)


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live descendant of `pid` (Linux /proc)."""
    parents, lines = {}, {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                lines[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            parents[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = {}, {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p not in found}
        found.update({p: lines.get(p, "") for p in frontier})
    return {p: line for p, line in found.items() if line}  # a zombie's command line is empty


def processes_of_a_run(tmp_path, *extra, env=None) -> dict[int, str]:
    """Every process a successful two-worker run started (seen while it ran)."""
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    src = write_jsonl(tmp_path / "in.jsonl", texts * 20)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--input", str(src), "--tokenizer", "bytes",
                             "--output", str(tmp_path / "o.zarr"), "--quiet", "--local_parallelism", "2", *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    seen = {}
    while proc.poll() is None:
        seen = {**descendants(proc.pid), **seen}
        time.sleep(0.02)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
@pytest.mark.slow
def test_worker_processes_are_forked_from_the_launcher_not_started_anew(tmp_path):
    """Forked: the fork server and its two workers run the launcher's own command line (no
    new interpreter, no `pipeline.local.worker`). With FLAT_TOKENS_FORK_WORKERS=0 Beam's way:
    a shell starting `python -m pipeline.local.worker` for each worker."""
    seen = processes_of_a_run(tmp_path / "forked")
    assert len(seen) >= 3 and all("-m pipeline.run" in line for line in seen.values()), seen
    seen = processes_of_a_run(tmp_path / "exec", env={"FLAT_TOKENS_FORK_WORKERS": "0"})
    started = [line for line in seen.values() if line.endswith("-m pipeline.local.worker")]
    assert len(started) >= 2, seen


def test_auto_takes_one_process_on_few_cores_or_a_small_input_else_one_worker_per_core():
    few = parallelism.MULTI_PROCESS_MIN_CORES - 1
    many = max(16, parallelism.MULTI_PROCESS_MIN_CORES)
    big = max(parallelism.MULTI_PROCESS_MIN_BYTES, 4 * GiB)
    assert parallelism.auto_workers(few, 100 * GiB, 1000)[0] == 1
    assert parallelism.auto_workers(many, parallelism.MULTI_PROCESS_MIN_BYTES - 1, 1000)[0] == 1
    assert parallelism.auto_workers(many, big, 1000) == (many, "one per core")
    assert parallelism.auto_workers(many, big, 5) == (5, "one per read range (5)")
    # 2 cores and a big input: two forked workers were faster, for less CPU, than one process
    # (docs/performance.md, "The local default uses the machine")
    assert parallelism.auto_workers(2, big, 1000) == (2, "one per core")


def options(*argv) -> PipelineOptions:
    return PipelineOptions(list(argv))


def test_beam_options_win_and_auto_sets_beams_options_for_the_in_process_runner():
    o = options("--direct_running_mode", "multi_processing", "--direct_num_workers", "3")
    p = parallelism.choose(2, ["--direct_running_mode", "multi_processing", "--direct_num_workers", "3"], o, True,
                           10 * GiB, 100)
    assert (p.mode, p.workers, p.chosen_by) == ("multi_processing", 3, "Beam options")
    assert "ignored" in p.reason
    o = options()
    p = parallelism.choose(3, [], o, True, 10, 1)
    assert (p.mode, p.workers, p.chosen_by) == ("multi_processing", 3, "--local_parallelism")
    direct = o.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("multi_processing", 3)
    o = options()
    p = parallelism.choose(parallelism.AUTO, [], o, True, 10, 1)
    assert (p.mode, p.workers, p.chosen_by) == ("in_memory", 1, "auto")
    assert o.view_as(DirectOptions).direct_running_mode == "in_memory"


def test_another_runner_decides_its_own_parallelism_and_refuses_an_explicit_one():
    p = parallelism.choose(parallelism.AUTO, [], options(), False, 10 * GiB, 100)
    assert (p.mode, p.chosen_by) == ("runner", "the runner")
    with pytest.raises(OptionError, match="--local_parallelism 4: only the in-process runner"):
        parallelism.choose(4, [], options(), False, 10 * GiB, 100)


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5"])
@pytest.mark.slow
def test_a_bad_value_is_refused_before_anything_is_read(tmp_path, value):
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    proc = run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                        f"--local_parallelism={value}", check=False)
    assert refused(proc) == (f"flat-tokens: error: --local_parallelism {value}: use auto, or a number of "
                             f"processes >= 1 (1: one process)")
    assert not (tmp_path / "o.zarr").exists()


def test_worker_processes_get_their_share_of_the_cores(monkeypatch):
    monkeypatch.setenv(cores.ENVIRONMENT, "1")
    assert cores.share() == 1
    monkeypatch.setenv(cores.ENVIRONMENT, str(cores.available() + 5))
    assert cores.share() == cores.available()  # never more than the process may run on
    monkeypatch.delenv(cores.ENVIRONMENT)
    assert cores.share() == cores.available()


def test_far_more_worker_processes_than_cores_are_refused_before_any_is_started(tmp_path):
    """`--local_parallelism 1000` on 2 cores forked 1000 processes, read nothing for 240 s and
    died with gRPC tracebacks. Up to MAX_WORKERS_PER_CORE per core is taken; more: exit 2,
    naming the option and the cores."""
    available = cores.available()
    limit = parallelism.MAX_WORKERS_PER_CORE * available
    assert parallelism.choose(limit, [], PipelineOptions([]), True, 10, 1).workers == limit
    with pytest.raises(OptionError, match=f"--local_parallelism {limit + 1}: .*{available} core"):
        parallelism.choose(limit + 1, [], PipelineOptions([]), True, 10, 1)
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    proc = run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                        "--local_parallelism", "1000", check=False)
    message = refused(proc)
    assert f"--local_parallelism 1000: more than {parallelism.MAX_WORKERS_PER_CORE} worker processes per core " \
           f"({available} core" in message, message
    assert not (tmp_path / "o.zarr").exists()
