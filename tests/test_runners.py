"""Runners other than the in-process DirectRunner, and the package Dataflow workers install.

* PortableRunner -> Beam's Python job service (the Job API of Beam's Flink and Spark job servers)
  -> an EXTERNAL SDK worker pool: the work runs in worker processes that get the pipeline through
  the Fn API, and must produce the same arrays as the DirectRunner, including with many shards
  and tiny chunks (chunks shared between shards). test_templates.py runs `launch.sh local` on the
  sample and checks that the output verifies; here the arrays are compared, failures must
  propagate through the Job API, and the services' lifecycle is checked.
* `--setup_file` (Dataflow): the sdist Beam's stager builds from setup.py, installed with its
  dependencies into a fresh virtual environment, runs from outside the checkout, on the
  DirectRunner and as the code of EXTERNAL workers.

* `--direct_running_mode multi_threading`: several SDK harnesses on threads of one process, each
  bundle of a stage on a thread of its own (as a Dataflow or portable SDK worker process runs
  them), with small batches and ranges so that bundles are many and long enough to overlap: the
  same arrays as the in-process run. Beam's gRPC data plane split elements there until the
  launcher turned its timed flushing off (pipeline/run.py, whole_elements_on_the_data_plane).

Note: Beam's local job service runs one SDK worker per job (it calls FnApiRunner.run_via_runner_api,
which ignores --direct_num_workers); concurrent writers are covered by the multi_processing
DirectRunner tests in test_pipeline.py.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest
import zarr

from flat_tokens.tools import verify
from tests.beam_services import portable_services, service_env, started_workers
from tests.conftest import sample_texts
from tests.helpers import REPO, check_flat_tokens, run_pipeline, stats, write_jsonl

# Many shards and tiny chunks: chunks are shared between shards, so the writer's merge of shared
# chunks is exercised; every value is far from the defaults.
STRESS = ["--num_shards", "7", "--tokens_chunk_size", "64", "--seq_starts_chunk_size", "16"]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    with portable_services(tmp_path_factory.mktemp("portable-services")) as svc:
        yield svc


@pytest.fixture(scope="module")
def direct_reference(tmp_path_factory, corpus, bpe_tokenizer):
    out = tmp_path_factory.mktemp("direct") / "direct.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer, "--output", out, *STRESS)
    return out


@pytest.mark.slow
def test_portable_runner_with_an_external_worker_pool_matches_the_direct_runner(
        tmp_path, services, direct_reference, corpus, bpe_tokenizer):
    out = tmp_path / "portable.zarr"
    workers_before = started_workers(services.logs.pool)
    proc = run_pipeline("--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer, "--output", out, *STRESS,
                        *services.pipeline_args, env=services.env, timeout=300)
    # The work ran in a worker the pool started, not in the submitting process.
    assert started_workers(services.logs.pool) > workers_before, proc.stderr[-3000:]
    assert verify.verify_dataset(str(out)) == []
    check_flat_tokens(out, "--compare", direct_reference)
    check_flat_tokens(out, "--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer)
    assert zarr.open_group(str(out), mode="r").attrs["stats"]["documents"] == 606


@pytest.mark.slow
def test_portable_runner_makes_the_same_mixture_and_dedup(tmp_path, services, corpus, bpe_tokenizer):
    """The side input of multipliers, the dedup shuffle and the copies, on workers of the pool."""
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(f"sources:\n"
                       f"  - {{name: a, input: ['{corpus}/part-0.jsonl', '{corpus}/part-1.jsonl'], weight: 2,"
                       f" max_epochs: 2}}\n"
                       f"  - {{name: b, input: '{corpus}/*.jsonl', weight: 1, max_epochs: 3}}\n")
    common = ["--mixture", mixture, "--dedup", "exact", "--tokenizer", bpe_tokenizer, *STRESS]
    run_pipeline(*common, "--output", tmp_path / "direct.zarr")
    run_pipeline(*common, "--output", tmp_path / "portable.zarr", *services.pipeline_args, env=services.env,
                 timeout=300)
    check_flat_tokens(tmp_path / "portable.zarr", "--compare", tmp_path / "direct.zarr")
    attrs = zarr.open_group(str(tmp_path / "portable.zarr"), mode="r").attrs
    assert any(s["multiplier"] == s["max_epochs"] for s in attrs["mixture"]["sources"])  # the binding one
    assert attrs["stats"]["duplicates_by_source"]["b"] > 0


@pytest.mark.slow
def test_portable_runner_reports_a_worker_failure_and_commits_nothing(tmp_path, services):
    """The rejected-lines check fails inside the SDK worker: exit 1, the cause in one line, no
    committed dataset: the same contract as on the DirectRunner (test_bad_input.py)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a-bad.jsonl").write_bytes(b'{"text": "fine"}\n{broken\n')
    write_jsonl(tmp_path / "in" / "b-good.jsonl", [f"fine {i}" for i in range(99)])
    out = tmp_path / "fail.zarr"
    proc = run_pipeline("--input", tmp_path / "in", "--output", out, "--tokenizer", "bytes",
                        "--max_rejected_fraction", "0", *services.pipeline_args,
                        env=services.env, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "the pipeline failed" in message and "1 of 101 non-blank input lines were rejected" in message, message
    assert not out.exists() or verify.verify_dataset(str(out))
    assert services.job.poll() is None and services.pool.poll() is None, "a failed job took a service down"


# ---------------------------------------------------------------------------------------------
# --direct_running_mode multi_threading: concurrent bundles on threads of one process

def threads(n: int) -> list[str]:
    return ["--direct_running_mode", "multi_threading", "--direct_num_workers", str(n)]


@pytest.mark.slow
def test_multi_threading_workers_send_whole_elements_to_the_runner():
    """A bundle whose elements take longer to encode than a timer's period (tests/slow_elements.py),
    on the launcher's own runner: with Beam's timed flushing on, the runner got an element's key
    in one message and its value in the next, and failed the job decoding them ("Invalid
    PaneInfoEncoding"), or ran out of memory on a garbage length: hence a process of its own,
    with its address space capped (it needs under 2 GB)."""
    import resource

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-m", "tests.slow_elements", *threads(2)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, preexec_fn=cap_memory)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def larger_corpus(tmp_path_factory):
    """~6 MB of real text in 4 files (the sample, 12 times, each copy's documents marked), so
    that a stage's bundles run for seconds on several threads at once."""
    root = tmp_path_factory.mktemp("larger")
    texts = [f"{copy}: {t}" for copy in range(12) for t in sample_texts()]
    for i in range(4):
        write_jsonl(root / "in" / f"part-{i}.jsonl", texts[i::4])
    return root / "in"


# Small batches and ranges (many bundles' worth of elements), the guard on a twentieth of the
# documents (its thread busy in every bundle), more shards than threads.
MANY_SMALL = ["--batch_documents", "16", "--read_range_mb", "1", "--tokenizer_check_fraction", "0.05",
              "--num_shards", "7", "--tokens_chunk_size", "4096", "--seq_starts_chunk_size", "256"]


@pytest.mark.slow
def test_multi_threading_gives_the_arrays_of_the_in_process_run(tmp_path, larger_corpus, bpe_tokenizer):
    """Before the launcher turned Beam's timed data-plane flushing off, this failed with
    "'utf-8' codec can't decode byte 0x94 in position 18", as the 0.7 GB run of issue 31 did."""
    common = ["--input", larger_corpus, "--tokenizer", bpe_tokenizer, *MANY_SMALL]
    run_pipeline(*common, "--output", tmp_path / "in-process.zarr")
    run_pipeline(*common, "--output", tmp_path / "threads.zarr", *threads(4))
    check_flat_tokens(tmp_path / "threads.zarr", "--compare", tmp_path / "in-process.zarr")
    assert stats(tmp_path / "threads.zarr") == stats(tmp_path / "in-process.zarr")
    assert verify.verify_dataset(str(tmp_path / "threads.zarr")) == []


@pytest.mark.slow
def test_many_small_bundles_on_many_threads(tmp_path, direct_reference, corpus, bpe_tokenizer):
    """Stress: 16 harness threads, four documents a batch, every document compared by the
    guard on its thread, 7 shards of tiny chunks (written and merged concurrently)."""
    out = tmp_path / "threads.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer, "--output", out, *STRESS,
                 "--batch_documents", "4", "--read_range_mb", "1", "--tokenizer_check_fraction", "1", *threads(16))
    check_flat_tokens(out, "--compare", direct_reference)
    check_flat_tokens(out, "--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer)
    assert stats(out) == stats(direct_reference)


def test_services_and_their_workers_are_stopped_even_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with portable_services(tmp_path / "svc") as svc:
            procs = [svc.pool, svc.job]
            raise RuntimeError("boom")
    assert all(p.returncode is not None for p in procs)
    for p in procs:  # nothing is left in their process groups (SDK workers included)
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)


# ---------------------------------------------------------------------------------------------
# Dataflow's --setup_file: the sdist, installed into a fresh virtual environment

SDIST_TIMEOUT = 120
INSTALL_TIMEOUT = 300


def _clean_env(env: dict | None = None) -> dict:
    """No PYTHONPATH: `pipeline` must come from the installed package. Bytecode may be written:
    the install skips compiling (--no-compile), so each module is compiled once, on first use."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in (env if env is not None else os.environ).items() if k not in drop}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The tarball Beam's stager builds for `--setup_file` (Stager._build_setup_package: `python -m
    build --sdist --no-isolation` when `build` is installed, else `setup.py sdist`), built from a
    copy of the checkout so that no egg-info lands in the work tree."""
    root = tmp_path_factory.mktemp("sdist")
    src = root / "src"
    ignore = ("__pycache__", "*.egg-info", ".venv", ".git", ".pytest_cache", ".hypothesis", "build", "dist", "out")
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*ignore), symlinks=True)
    code = ("import sys; from apache_beam.runners.portability.stager import Stager; "
            "print(Stager._build_setup_package(sys.argv[1], sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", code, str(src / "setup.py"), str(root / "dist")], cwd=root,
                          capture_output=True, text=True, timeout=SDIST_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-5000:]
    tarball = Path(proc.stdout.strip().splitlines()[-1])
    assert tarball.is_file() and tarball.name.endswith(".tar.gz"), proc.stdout
    return tarball


@pytest.fixture(scope="module")
def installed(tmp_path_factory, sdist):
    """A fresh venv with the sdist and its declared dependencies (pip's cache and the machine's
    wheel mirrors make this ~0.5-1 min), and a working directory outside the checkout."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile",
                           "--disable-pip-version-check", "--no-input", str(sdist)],
                          cwd=root, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, env=_clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    work = root / "work"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import json, pipeline, transforms; "
                            "print(json.dumps([pipeline.__file__, transforms.__file__]))"],
                           cwd=work, capture_output=True, text=True, timeout=120, env=_clean_env())
    assert where.returncode == 0, where.stderr
    files = [Path(f).resolve() for f in json.loads(where.stdout)]
    package_dir = files[0].parent
    return types.SimpleNamespace(venv=venv, python=python, work=work, files=files, package_dir=package_dir,
                                 sample_glob=str(package_dir / "sample" / "*.jsonl"))


@pytest.mark.slow
def test_sdist_ships_the_code_and_the_sample_data(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for module in ("pipeline/run.py", "pipeline/cli.py", "flat_tokens/tools/verify.py", "transforms/write/chunk_writers.py"):
        assert module in names, module
    for path in [*(REPO / "pipeline").rglob("*.py"), *(REPO / "flat_tokens").rglob("*.py"), *(REPO / "transforms").rglob("*.py")]:
        assert path.relative_to(REPO).as_posix() in names, path
    assert {"pipeline/sample/corpus-1.jsonl", "pipeline/sample/corpus-2.jsonl"} <= names
    assert "pipeline/sample/tokenizer.json" in names


@pytest.fixture(scope="module")
def installed_run(installed, tmp_path_factory):
    """`flat-tokens run` from the installed package on its own sample data, on the DirectRunner."""
    out = tmp_path_factory.mktemp("installed-run") / "installed.zarr"
    proc = subprocess.run([str(installed.venv / "bin" / "flat-tokens"), "run", "--input", installed.sample_glob,
                           "--output", str(out), "--tokenizer", "bytes"],
                          cwd=installed.work, capture_output=True, text=True, timeout=300, env=_clean_env())
    return types.SimpleNamespace(out=out, proc=proc)


@pytest.mark.slow
def test_installed_package_runs_outside_the_checkout(installed, installed_run):
    venv = installed.venv.resolve()
    for f in installed.files:  # `import pipeline` cannot have come from the repository
        assert f.is_relative_to(venv) and not f.is_relative_to(REPO), f
    samples = sorted((installed.package_dir / "sample").glob("*.jsonl"))
    assert [p.name for p in samples] == ["corpus-1.jsonl", "corpus-2.jsonl"]
    proc = installed_run.proc
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "flat-tokens: wrote" in proc.stdout
    check = subprocess.run([str(installed.python), "-m", "flat_tokens.tools.verify", str(installed_run.out)],
                           cwd=installed.work, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    check_flat_tokens(installed_run.out, "--input", installed.sample_glob, "--tokenizer", "bytes")


@pytest.mark.slow
def test_installed_package_as_the_code_of_external_workers(installed, installed_run, tmp_path):
    """What a Dataflow or Flink worker does: the SDK worker's Python is the venv the sdist was
    installed into, with no checkout on its path; same arrays as the DirectRunner run."""
    assert installed_run.proc.returncode == 0
    python = str(installed.python)
    env = _clean_env(service_env(python, pythonpath=None))
    out = tmp_path / "portable.zarr"
    with portable_services(tmp_path / "svc", python=python, env=env, cwd=installed.work) as svc:
        proc = subprocess.run([str(installed.venv / "bin" / "flat-tokens"), "run", "--input", installed.sample_glob,
                               "--output", str(out), "--tokenizer", "bytes", *svc.pipeline_args],
                              cwd=installed.work, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-5000:] + svc.logs.pool.read_text()[-3000:]
        assert started_workers(svc.logs.pool) >= 1
    check_flat_tokens(out, "--compare", installed_run.out)


class _RecordingProxy:
    """An HTTP(S) proxy on loopback that answers nothing and remembers who connected."""

    def __init__(self):
        import socket
        import threading
        self.requests: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(4096))

    def close(self):
        self._server.close()


@pytest.mark.slow
def test_the_default_runner_runs_in_process_and_never_fetches_another_runner(tmp_path):
    """Beam's DirectRunner switches to the Prism runner (a Go binary it downloads at run
    time) whenever the network allows, so the same command would run on an untested runner
    online and on FnApiRunner offline. The default must be FnApiRunner everywhere: with every
    HTTP(S) request sent to a recording proxy, a default run must send none."""
    proxy = _RecordingProxy()
    try:
        proxy_env = {k: proxy.url for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
        run_pipeline("--input", f"{REPO}/pipeline/sample/corpus-1.jsonl", "--tokenizer", "bytes",
                     "--output", tmp_path / "out.zarr", env={**proxy_env, "NO_PROXY": "", "no_proxy": ""})
    finally:
        proxy.close()
    assert proxy.requests == [], f"the run tried to download something: {proxy.requests[:1]}"
    assert verify.verify_dataset(str(tmp_path / "out.zarr")) == []
