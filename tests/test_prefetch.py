"""The launcher's head start: the tokenizer loads on a thread while Beam is imported."""
import hashlib
import threading
import time
from pathlib import Path

import pytest

from pipeline import prefetch
from tests.helpers import REPO, SAMPLE
from transforms.tokenize import backends


def test_the_last_tokenizer_flag_is_the_one_prefetched(tmp_path):
    argv = ["--input", "x", "--tokenizer", "a.json", "--tokenizer_backend=hf", "--tokenizer=b.json"]
    assert prefetch._last_value(argv, "--tokenizer") == "b.json"
    assert prefetch._last_value(argv, "--tokenizer_backend") == "hf"
    assert prefetch._last_value(["--tokenizer"], "--tokenizer") is None
    assert prefetch.tokenizer_from_argv(["--tokenizer", "bytes"]) is None  # not a file: nothing to load
    assert prefetch.tokenizer_from_argv(["--tokenizer", str(tmp_path / "missing.json")]) is None


def test_a_prefetched_tokenizer_is_the_one_the_run_gets():
    text = (SAMPLE / "tokenizer.json").read_text(encoding="utf-8")
    thread = prefetch.tokenizer_from_argv(["--tokenizer", str(SAMPLE / "tokenizer.json"), "--tokenizer_backend", "hf"])
    thread.join(60)
    loaded = backends.hf_tokenizer(text)
    assert backends.hf_tokenizer(text) is loaded
    ids, lengths = backends.make_encoder(backends.HF, text)(["hello world"])
    assert lengths.tolist() == [len(loaded.encode("hello world", add_special_tokens=False).ids)]


def test_a_prefetch_of_a_broken_tokenizer_leaves_the_error_to_the_run():
    thread = backends.prefetch("{not a tokenizer", backends.AUTO)
    thread.join(60)
    assert not thread.is_alive()
    with pytest.raises(Exception):  # tokenizers' own exception type, raised to the run as before
        backends.hf_tokenizer("{not a tokenizer")
    assert not any(key[1] == hashlib.sha256(b"{not a tokenizer").hexdigest() for key in backends._ENCODERS)


def test_concurrent_requests_build_a_tokenizer_once():
    builds = []

    def slow_build():
        builds.append(1)
        time.sleep(0.2)
        return object()

    key = ("test", "concurrent")
    got = []
    threads = [threading.Thread(target=lambda: got.append(backends._cached(key, slow_build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 4 and all(g is got[0] for g in got)


@pytest.mark.parametrize("preset", [None, "4"])
def test_the_command_line_runs_numpy_with_one_blas_thread_unless_told_otherwise(preset):
    """numpy's OpenBLAS threads only spin in this pipeline, which never calls BLAS: both
    entry points ask for one (prefetch.head_start) before numpy is imported, but a user's
    setting stands."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset:
        env["OPENBLAS_NUM_THREADS"] = preset
    probe = ("import os, sys; from pipeline import prefetch; prefetch.no_blas_threads(); import numpy; "
             "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    setting, threads = out.stdout.split()
    assert setting == (preset or "1")
    if not preset:
        assert threads == "1", "numpy started BLAS threads"
    run = (Path(prefetch.__file__).parent / "run.py").read_text(encoding="utf-8")
    assert run.index("prefetch.head_start(") < run.index("import apache_beam")
    # The console script: pipeline/cli.py's hook, which flat_tokens/tools/cli.py's dispatch calls
    # before it imports the command's module.
    assert "prefetch.head_start(" in (Path(prefetch.__file__).parent / "cli.py").read_text(encoding="utf-8")
    dispatch = (REPO / "flat_tokens" / "tools" / "cli.py").read_text(encoding="utf-8")
    assert dispatch.index("before(argv[0]") < dispatch.index("importlib.import_module(")
    head_start = prefetch.head_start.__code__.co_names
    assert head_start.index("no_blas_threads") < head_start.index("tokenizer_from_argv")
