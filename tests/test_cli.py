"""What a user sees: the console script, progress lines, the summary and its JSON twin."""
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

from flat_tokens.tools import verify
from tests.helpers import REPO, SAMPLE, check_flat_tokens, refused, run_pipeline, stats, write_jsonl
from tests.paced_backends import HOLD_MARKER, RELEASE_FILE_ENV
from tests.test_parquet import sequences
from transforms.records import DocumentBatch


@pytest.mark.slow
def test_progress_lines_and_a_summary_with_the_exact_numbers(tmp_path, corpus, bpe_tokenizer):
    write_jsonl(tmp_path / "bad" / "x.jsonl", ["fine", HOLD_MARKER])
    with open(tmp_path / "bad" / "x.jsonl", "a") as f:
        f.write("{broken\n\n")
    out, release = tmp_path / "out.zarr", tmp_path / "release"
    # The run holds at the marker document (after the 256 the launcher peeks at) until this
    # test has seen a progress line: the line is asserted however fast the machine is.
    cmd = [sys.executable, "-m", "pipeline.run", "--input", f"{corpus}/*.jsonl", "--input", str(tmp_path / "bad"),
           "--output", str(out), "--tokenizer", str(bpe_tokenizer), "--progress_interval", "0.2",
           "--tokenizer_backend", "tests.paced_backends:holds_at_marker",
           "--max_rejected_fraction", "0.01", "--summary_json", str(tmp_path / "summary.json")]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, RELEASE_FILE_ENV: str(release)})
    progress = []
    for line in run.stderr:
        if line.startswith("progress:"):
            progress.append(line)
            release.touch()
    stdout, _ = run.communicate(timeout=600)
    assert run.returncode == 0 and progress, stdout
    # One unit, named as it is counted: 2**20 bytes is a MiB, in the progress line and the summary.
    assert "MiB input read" in progress[0] and "MiB/s" in progress[0] and " MB" not in progress[0]
    assert "tokens/s" in progress[0] and "documents" in progress[0]
    assert re.search(r"output: [0-9.,]+ MiB, ", stdout) and " MB" not in stdout, stdout
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert f"train: {stats['train']['sequences']:,} sequences, {stats['train']['tokens']:,} tokens" in stdout
    assert f"{stats['documents']:,} documents, 1 blank lines, 1 rejected lines" in stdout
    assert "out.zarr.rejected/" in stdout and "bytes/token" in stdout and "tokens/s" in stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stats"] == stats
    assert summary["tokens"] == stats["train"]["tokens"] + stats["validation"]["tokens"]
    assert summary["output_bytes"] > 0 and summary["wall_seconds"] > 0
    assert summary["rejected_output"].endswith("out.zarr.rejected")


@pytest.mark.slow
def test_quiet_prints_no_progress(tmp_path, corpus):
    proc = run_pipeline("--input", f"{corpus}/*.jsonl", "--output", tmp_path / "o.zarr", "--tokenizer", "bytes",
                        "--progress_interval", "0.1", "--quiet")
    assert "progress:" not in proc.stderr and "flat-tokens: wrote" in proc.stdout


def test_the_console_script_dispatches_and_helps(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True)
    top = cli("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("run", "verify", "inspect"))
    helped = cli("run", "--help")
    for group in ("input:", "tokenization:", "split and shuffle:", "output:", "limits and tuning:", "reporting:"):
        assert group in helped.stdout
    assert "example" in helped.stdout and "--runner" in helped.stdout
    assert cli("frobnicate").returncode == 2


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True)


def test_the_usage_line_shows_the_required_options_as_required():
    usage = cli("run", "--help").stdout.split("\n\n")[0]
    assert usage.startswith("usage: flat-tokens run")
    outside_brackets = re.sub(r"\[[^\]]*\]", "", usage)  # argparse writes optional ones as [--name NAME]
    for name in ("--input", "--tokenizer", "--output"):
        assert name in outside_brackets, usage


@pytest.mark.slow
def test_version_is_printed_by_the_console_script_and_by_run():
    from pipeline import __version__
    for args in (["--version"], ["run", "--version"], ["verify", "--version"], ["inspect", "--version"]):
        proc = cli(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"flat-tokens-beam {__version__}\n", ""), args
    assert "--version" in cli("--help").stdout and "--version" in cli("run", "--help").stdout


def run_with_stdout_closed(*args):
    """Runs a command whose reader has gone before it writes (as `| head -0` leaves it)."""
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=300)
    return proc.returncode, stderr


@pytest.mark.slow
def test_a_closed_stdout_ends_every_command_quietly_like_a_unix_tool(tmp_path, corpus):
    out, summary = tmp_path / "o.zarr", tmp_path / "summary.json"
    code, stderr = run_with_stdout_closed("-m", "pipeline.run", "--input", f"{corpus}/*.jsonl", "--output", out,
                                          "--tokenizer", "bytes", "--quiet", "--summary_json", summary)
    assert (code, stderr) == (141, ""), stderr  # 128 + SIGPIPE, no BrokenPipeError traceback
    assert verify.verify_dataset(str(out)) == [] and json.loads(summary.read_text())["tokens"] > 0
    for args in (["-m", "flat_tokens.tools.verify", out], ["-m", "flat_tokens.tools.inspect", out], ["-m", "pipeline.cli", "verify", out],
                 ["-m", "pipeline.cli", "inspect", out, "--json"], ["-m", "pipeline.cli", "--help"]):
        code, stderr = run_with_stdout_closed(*map(str, args))
        assert (code, stderr) == (141, ""), (args, stderr)


def test_progress_is_reported_within_a_range_and_in_full_when_it_ends(tmp_path):
    """One range of one file: bytes show as they are read, before any batch is complete, and
    the whole range shows as soon as it is read (it used to wait for the workers to stop)."""
    from transforms.progress import read_totals
    from transforms.read.inputs import list_input_files, read_ranges
    from transforms.read.jsonl_documents import PROGRESS_BYTES, ReadRangeFn

    path = tmp_path / "one.jsonl"
    no_text = (json.dumps({"body": "x" * 1000}) + "\n").encode()  # rejected lines: no document, no batch
    path.write_bytes(no_text * (3 * PROGRESS_BYTES // len(no_text)) + b"".join(
        (json.dumps({"text": f"document {i}"}) + "\n").encode() for i in range(100)))
    (rng,) = read_ranges(list_input_files([str(path)], "auto"), 1 << 30)
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    fn = ReadRangeFn("text", batch_bytes=1 << 23, batch_documents=8192, storage_options=None,
                     progress_dir=str(progress_dir))
    fn.setup()
    outputs = fn.process(rng)
    for out in outputs:  # the rejected lines' reports, line by line, until 2 MB are read
        if out.value["offset"] >= 2 * PROGRESS_BYTES:
            break
    read = read_totals(str(progress_dir)).get("bytes", 0)
    assert PROGRESS_BYTES <= read < 2 * PROGRESS_BYTES + len(no_text)
    rest = list(outputs)  # the range is read to its end; the DoFn is not torn down
    assert sum(isinstance(o, DocumentBatch) for o in rest) == 1
    assert read_totals(str(progress_dir)) == {"bytes": path.stat().st_size, "documents": 100}


@pytest.mark.slow
def test_progress_moves_while_one_large_file_is_read(tmp_path):
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in p.open(encoding="utf-8")]
    path = tmp_path / "large.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < 24 << 20:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    proc = run_pipeline("--input", path, "--output", tmp_path / "o.zarr", "--tokenizer", SAMPLE / "tokenizer.json",
                        "--progress_interval", "0.1", "--batch_documents", "1024")
    percents = {float(p) for p in re.findall(r"^progress: .* \(([\d.]+)%\)", proc.stderr, flags=re.M)}
    assert len({p for p in percents if 0 < p < 100}) >= 2, proc.stderr


MULTI_PROCESS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


@pytest.mark.slow
def test_worker_processes_are_quiet_too(tmp_path, corpus):
    """Each multi_processing worker used to print ~24 lines of Beam INFO, and 'Discarding
    unparseable args: [..., --output=...]', whatever --quiet said."""
    proc = run_pipeline("--input", f"{corpus}/*.jsonl", "--output", tmp_path / "o.zarr", "--tokenizer", "bytes",
                        "--quiet", *MULTI_PROCESS)
    assert proc.stderr == "" and "flat-tokens: wrote" in proc.stdout, proc.stderr[-3000:]
    # without --quiet: progress lines only
    proc = run_pipeline("--input", f"{corpus}/*.jsonl", "--output", tmp_path / "p.zarr", "--tokenizer", "bytes",
                        "--progress_interval", "0.2", *MULTI_PROCESS)
    assert [line for line in proc.stderr.splitlines() if not line.startswith("progress: ")] == [], proc.stderr[-3000:]
    # a failure in a worker is told once, in one line (--verbose shows the tracebacks)
    write_jsonl(tmp_path / "bad.jsonl", ["fine"] + [None] * 3)
    proc = run_pipeline("--input", tmp_path / "bad.jsonl", "--output", tmp_path / "q.zarr", "--tokenizer", "bytes",
                        *MULTI_PROCESS, check=False)
    told = [line for line in proc.stderr.strip().splitlines() if not line.startswith("progress: ")]  # a busy machine
    assert proc.returncode == 1 and len(told) == 1, proc.stderr[-3000:]
    assert "3 of 4 non-blank input lines were rejected" in proc.stderr


# ---------------------------------------------------------------------------------------------
# The command line: nothing Beam would discard

SAMPLE_FILES = sorted(str(p) for p in SAMPLE.glob("*.jsonl"))
SAMPLE_DOCUMENTS = sum(len(open(p, encoding="utf-8").read().splitlines()) for p in SAMPLE_FILES)
BYTES = ["--tokenizer", "bytes"]


@pytest.mark.slow
def test_an_unquoted_glob_reads_every_file_the_shell_expanded_it_to(tmp_path):
    """`--input data/*.jsonl` unquoted: the shell passes one path per file. Beam used to keep
    the first and drop the rest with a warning (469 of the sample's 938 documents, exit 0)."""
    quoted = tmp_path / "quoted.zarr"
    run_pipeline("--input", f"{SAMPLE}/*.jsonl", *BYTES, "--output", quoted)
    unquoted = tmp_path / "unquoted.zarr"
    run_pipeline("--input", *SAMPLE_FILES, *BYTES, "--output", unquoted, "--quiet")
    assert stats(unquoted)["documents"] == stats(quoted)["documents"] == SAMPLE_DOCUMENTS
    assert sequences(unquoted) == sequences(quoted)
    assert zarr.open_group(str(unquoted), mode="r").attrs["inputs"] == SAMPLE_FILES

    valid = write_jsonl(tmp_path / "v" / "a.jsonl", [f"validation {i}" for i in range(5)])
    write_jsonl(tmp_path / "v" / "b.jsonl", [f"validation {i}" for i in range(5, 12)])
    split = tmp_path / "split.zarr"
    run_pipeline("--input", *SAMPLE_FILES, "--validation_input", valid, tmp_path / "v" / "b.jsonl", *BYTES,
                 "--output", split)
    assert stats(split)["validation"]["sequences"] == 12 and stats(split)["documents"] == SAMPLE_DOCUMENTS + 12


@pytest.mark.slow
def test_the_same_files_however_named_give_byte_identical_arrays(tmp_path):
    """A quoted glob and the shell's expansion of it gave different datasets (1,240 vs 1,201
    validation sequences): a document's key held its argument's position. Now a quoted glob,
    a list in any order, a directory, and the corpus moved elsewhere, give the same bytes."""
    texts = [f"document {i}: " + "some words " * (i % 13) for i in range(3000)]
    data = tmp_path / "data"
    for i in range(4):
        write_jsonl(data / ("web" if i < 2 else "code") / f"part-{i}.jsonl", texts[i::4])
    files = sorted(data.glob("*/*.jsonl"))
    common = ["--tokenizer", "bytes", "--validation_fraction", "0.05", "--num_shards", "3"]
    namings = {"glob": [f"{data}/*/*.jsonl"], "list": [str(f) for f in files],
               "reversed": [str(f) for f in reversed(files)], "directory": [str(data)],
               "flags": [x for f in (files[2], files[0], files[3], files[1]) for x in ("--input", str(f))][1:]}
    for name, inputs in namings.items():
        run_pipeline("--input", *inputs, *common, "--output", tmp_path / f"{name}.zarr", "--quiet")
    moved = tmp_path / "elsewhere" / "corpus"
    shutil.copytree(data, moved)
    run_pipeline("--input", f"{moved}/code", f"{moved}/web", *common, "--output", tmp_path / "moved.zarr")
    reference = tmp_path / "glob.zarr"
    assert stats(reference)["validation"]["sequences"] > 0
    for name in [*namings, "moved"]:
        check_flat_tokens(tmp_path / f"{name}.zarr", "--compare", reference)
    # Provenance still says how the files were named.
    assert zarr.open_group(str(tmp_path / "reversed.zarr"), mode="r").attrs["inputs"] == namings["reversed"]


@pytest.mark.parametrize("mode", [[], ["--quiet"], ["--verbose"]])
@pytest.mark.slow
def test_an_argument_no_option_takes_is_refused_in_every_mode(tmp_path, mode):
    """`--tokenizer bytes stray`: Beam discards `stray` with a warning (which --quiet hid)."""
    proc = run_pipeline("--input", SAMPLE_FILES[0], *BYTES, "stray.jsonl", "--output", tmp_path / "o.zarr", *mode,
                        check=False)
    message = refused(proc)
    assert "unexpected argument stray.jsonl (after --tokenizer bytes)" in message, message
    assert "quote a glob" in message
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.slow
def test_a_misspelt_option_is_refused_with_a_suggestion(tmp_path):
    common = ["--input", SAMPLE_FILES[0], *BYTES, "--output", tmp_path / "o.zarr"]
    message = refused(run_pipeline(*common, "--text-key", "text", check=False))
    assert "unknown option --text-key; did you mean --text_key?" in message, message
    message = refused(run_pipeline(*common, "--validation_fracton=0.1", check=False))
    assert "unknown option --validation_fracton; did you mean --validation_fraction?" in message, message
    assert "did you mean" not in refused(run_pipeline(*common, "--frobnicate", check=False))


def test_a_bad_value_of_an_option_gets_one_line_as_a_misspelt_name_does(tmp_path):
    """A value argparse refuses (a choice the option does not offer, a number that is not one):
    one error line naming the option and what it takes, not argparse's whole usage block."""
    common = ["--input", SAMPLE_FILES[0], *BYTES, "--output", tmp_path / "o.zarr"]
    for args, said in ((["--dedup", "nearr"], "--dedup: invalid choice: 'nearr' (choose from 'none', 'exact', 'near')"),
                       (["--near_hashes", "100"], "--near_hashes: invalid choice: 100 (choose from 64, 128, 256"),
                       (["--near_hashes", "many"], "--near_hashes: invalid int value: 'many'")):
        proc = run_pipeline(*common, *args, check=False)
        assert said in refused(proc), proc.stderr
        assert "usage:" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "o.zarr").exists()


def test_run_help_names_every_compression_the_inputs_decompress():
    from transforms.read.inputs import COMPRESSED_SUFFIXES

    proc = subprocess.run([sys.executable, "-m", "pipeline.run", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    text = " ".join(proc.stdout.split())
    said = text[text.index("--input INPUT"):text.index("--text_key")]  # the option's own help
    assert all(suffix in said for suffix in COMPRESSED_SUFFIXES if suffix != ".zstd"), said




def test_verify_and_inspect_name_themselves_as_the_console_script_does():
    for command in ("verify", "inspect"):
        usage = cli(command, "--help").stdout
        assert usage.startswith(f"usage: flat-tokens {command} "), usage


@pytest.mark.slow
def test_a_seed_the_reader_would_refuse_is_refused(tmp_path):
    common = ["--input", SAMPLE_FILES[0], *BYTES, "--output", tmp_path / "o.zarr"]
    for seed in ("-1", str(1 << 64)):
        assert f"--seed {seed}: must be in [0, 2**64)" in refused(run_pipeline(*common, "--seed", seed, check=False))
    run_pipeline(*common, "--seed", str((1 << 64) - 1))
    from flat_tokens.reader import open_dataset
    train = open_dataset(str(tmp_path / "o.zarr"))["train"]
    next(iter(train.packed_batches(16, 2, seed=zarr.open_group(str(tmp_path / "o.zarr"), mode="r").attrs["seed"])))


@pytest.mark.slow
def test_provenance_is_absolute_so_inspect_decodes_from_another_directory(tmp_path):
    """Relative paths were recorded as given: `inspect` run elsewhere could not load the
    recorded tokenizer, and showed token ids."""
    work = tmp_path / "work"
    write_jsonl(work / "data" / "in.jsonl", ["a recognisable sentence about lighthouses"] * 3)
    shutil.copy(SAMPLE / "tokenizer.json", work / "tok.json")
    subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--input", "data/in.jsonl", "--tokenizer", "tok.json",
                    "--output", "o.zarr", "--quiet"], cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True,
                   capture_output=True, timeout=300)
    attrs = zarr.open_group(str(work / "o.zarr"), mode="r").attrs
    assert attrs["inputs"] == [str(work / "data" / "in.jsonl")]
    assert attrs["tokenizer"]["spec"] == str(work / "tok.json")
    assert attrs["rejected_output"] == str(work / "o.zarr.rejected")
    shown = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(work / "o.zarr"), "--sequences", "1"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and "lighthouses" in shown.stdout, shown.stdout + shown.stderr


def test_an_address_space_limit_too_small_to_run_is_one_line(tmp_path):
    """Under `ulimit -v` 500 MB the tokenizer's Rust code aborted the process with a backtrace
    (or an import raised MemoryError)."""
    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (500 << 20, 500 << 20))
    for command in ([sys.executable, "-m", "pipeline.run"], [str(Path(sys.executable).parent / "flat-tokens"), "run"]):
        proc = subprocess.run([*command, "--input", SAMPLE_FILES[0], "--tokenizer", str(SAMPLE / "tokenizer.json"),
                               "--output", str(tmp_path / "o.zarr")], cwd=REPO, capture_output=True, text=True,
                              preexec_fn=limited, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.startswith("flat-tokens: error: the address-space limit (ulimit -v) is 500 MiB, below the "
                                      "1,024 MiB a run needs"), proc.stderr[-2000:]
        assert len(proc.stderr.splitlines()) == 1
