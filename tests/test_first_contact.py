"""First contact with gs://: without network, without credentials, or with an emulator that
is not running, `flat-tokens run` fails before reading anything, with exit 2 and one line
naming the URL and what to do. (It used to retry for ~50 s and end with exit 1 and a
150-line aiohttp traceback; without credentials it went on anonymously.)

No real cloud is contacted: "no network" is an empty network namespace (`unshare --net`,
root only), and "a reachable endpoint without credentials" is a listening socket on
loopback named as the storage endpoint, with every source of credentials out of reach.
"""
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO

GCS_SETTINGS = ("GOOGLE_", "GCE_", "GCLOUD", "CLOUDSDK_", "STORAGE_EMULATOR", "GCSFS_", "FSSPEC_")


def plain_env(tmp_path, **extra) -> dict:
    """This process's environment without any Google Cloud or fsspec setting; a home and a
    gcloud configuration directory without credentials; the VM metadata server out of reach."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GCS_SETTINGS)}
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**env, "HOME": str(tmp_path / "home"), "CLOUDSDK_CONFIG": str(tmp_path / "home"),
            "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", **extra}


def run(args, env, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "pipeline.run", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def one_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture
def listening():
    """A loopback port that accepts connections (and never answers them)."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --net needs root (CI runs as root)")
def test_no_network(tmp_path):
    proc = run(["--input", "gs://corpus-bucket/web/*.jsonl", "--tokenizer", "bytes",
                "--output", "gs://datasets-bucket/web.zarr"], plain_env(tmp_path), prefix=("unshare", "--net"))
    line = one_line(proc)
    assert line.startswith("flat-tokens: error: --output gs://datasets-bucket/web.zarr: cannot reach Google Cloud "
                           "Storage at storage.googleapis.com ("), line
    assert "check the network" in line and "STORAGE_EMULATOR_HOST" in line


@pytest.mark.parametrize("where", ["output", "input"])
@pytest.mark.slow
def test_no_credentials(where, tmp_path, listening):
    """The endpoint answers, but nothing says who is asking: refused before reading, naming
    the first gs:// URL; gcsfs would have gone on anonymously."""
    (tmp_path / "in.jsonl").write_text('{"text": "a document"}\n')
    if where == "output":
        args = ["--input", tmp_path / "in.jsonl", "--output", "gs://datasets-bucket/out.zarr"]
    else:
        args = ["--input", "gs://corpus-bucket/in.jsonl", "--output", tmp_path / "out.zarr"]
    proc = run([*args, "--tokenizer", "bytes"], plain_env(tmp_path, FSSPEC_GS_ENDPOINT_URL=listening))
    line = one_line(proc)
    url = "gs://datasets-bucket/out.zarr" if where == "output" else "gs://corpus-bucket/in.jsonl"
    assert line.startswith(f"flat-tokens: error: --{where} {url}: no Google Cloud credentials were found"), line
    for advice in ("gcloud auth application-default login", "GOOGLE_APPLICATION_CREDENTIALS", "FSSPEC_GS_TOKEN=anon",
                   "docs/scale.md, 'Real Google Cloud Storage'"):  # where the details are (test_docs checks the page)
        assert advice in line
    assert not (tmp_path / "out.zarr").exists()


def test_an_emulator_that_is_not_running(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed = s.getsockname()[1]  # free again once closed: nothing listens there
    proc = run(["--input", "gs://bucket/in.jsonl", "--tokenizer", "bytes", "--output", "gs://bucket/out.zarr"],
               plain_env(tmp_path, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed}"))
    line = one_line(proc)
    assert line.startswith(f"flat-tokens: error: --output gs://bucket/out.zarr: the GCS emulator at "
                           f"STORAGE_EMULATOR_HOST=127.0.0.1:{closed} does not answer ("), line
