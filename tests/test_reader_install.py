"""The reader-only install (reader/setup.py: the distribution flat-tokens-reader) in a trainer's
fresh environment: `pip install ./reader` brings numpy, zarr and fsspec and nothing of the
pipeline's own stack (no Beam, tokenizers, zstandard, orjson, pyarrow or gcsfs) and none of the
job's packages (`pipeline`, `transforms`: only `flat_tokens`), and from it
a trainer reads a dataset the pipeline wrote, takes a training step's batches on two hosts,
trains one step on them, blends, splits a stream over loader workers, and runs `flat-tokens
verify` and `inspect`; `flat-tokens run` says it needs the full install."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flat_tokens.blend import Blend
from flat_tokens.reader import open_dataset
from tests.helpers import REPO, SAMPLE, run_pipeline

TRAINER = """
import json, sys
import numpy as np
import flat_tokens.reader
from flat_tokens import Blend, open_dataset  # what a trainer writes
from flat_tokens.loaders import PackedBatchStream

splits = open_dataset(sys.argv[1])
train = splits["train"]
# One training step of a two-host job: each host's batch of step 0, from its own share.
hosts = [next(train.packed_batches(64, 8, seed=3, rank=r, world_size=2, segments=True)) for r in range(2)]
inputs = np.concatenate([b.inputs for b in hosts])
targets = np.concatenate([b.targets for b in hosts])
# A bigram model, trained one step of gradient descent on that batch (numpy alone).
vocab = train.max_token_id + 1
weights = np.zeros((vocab, vocab))

def loss_and_grad(w):
    logits = w[inputs]
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    loss = -np.log(np.take_along_axis(p, targets[..., None], -1)).mean()
    p[np.arange(inputs.shape[0])[:, None], np.arange(inputs.shape[1]), targets] -= 1
    grad = np.zeros_like(w)
    np.add.at(grad, inputs, p / inputs.size)
    return loss, grad

before, grad = loss_and_grad(weights)
after, _ = loss_and_grad(weights - 50 * grad)
worker = next(PackedBatchStream(train, 64, 8, seed=3, rank=1, world_size=2).batches(1, 2))  # step 1
blended = next(Blend([train, splits["validation"]], [3, 1], seed=1).packed_batches(64, 4))
out = {"reader": flat_tokens.reader.__file__, "sequences": [s.tolist() for s in train.iter_sequences(0, 5)],
       "targets": targets.tolist(), "segment_ids": hosts[1].segment_ids.tolist(), "losses": [before, after],
       "worker": worker[1].tolist(), "blended": blended[1].tolist()}
for name in ("apache_beam", "tokenizers", "zstandard", "orjson", "pyarrow", "gcsfs", "pipeline", "transforms"):
    try:
        __import__(name)
        out.setdefault("importable", []).append(name)
    except ImportError:
        pass
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reader_venv(tmp_path_factory):
    """A fresh virtual environment with `pip install ./reader`, from a copy of the clone's
    reader/ and flat_tokens/ (so no build output lands in the clone)."""
    root = tmp_path_factory.mktemp("trainer")
    source = root / "clone"
    for name in ("reader", "flat_tokens"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("build", "__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source / "reader")], timeout=900,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(source)  # the install stands on its own
    return venv / "bin"


def in_venv(bin_dir, *args, cwd, env=None):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", **(env or {})})


@pytest.mark.slow  # builds a virtual environment and installs into it
def test_the_reader_install_trains_a_step_blends_and_verifies(reader_venv, tmp_path, corpus):
    out = tmp_path / "d.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction", "0.1")
    proc = in_venv(reader_venv, reader_venv / "python", "-c", TRAINER, out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert "importable" not in got, got["importable"]  # not even installed there
    assert str(reader_venv.parent) in got["reader"]  # the installed package, not the clone
    splits = open_dataset(str(out))
    train = splits["train"]
    hosts = [next(train.packed_batches(64, 8, seed=3, rank=r, world_size=2, segments=True)) for r in range(2)]
    assert got["sequences"] == [s.tolist() for s in train.iter_sequences(0, 5)]
    assert np.array_equal(got["targets"], np.concatenate([b.targets for b in hosts]))
    assert np.array_equal(got["segment_ids"], hosts[1].segment_ids)
    before, after = got["losses"]
    assert before == pytest.approx(np.log(train.max_token_id + 1)) and after < before - 0.1  # it learned
    step1 = list(zip(range(2), train.packed_batches(64, 8, seed=3, rank=1, world_size=2)))[1][1]
    assert np.array_equal(got["worker"], step1[1])
    blended = next(Blend([train, splits["validation"]], [3, 1], seed=1).packed_batches(64, 4))
    assert np.array_equal(got["blended"], blended[1])
    verify = in_venv(reader_venv, reader_venv / "flat-tokens", "verify", out, cwd=tmp_path)
    assert verify.returncode == 0 and "OK: train" in verify.stdout, verify.stdout + verify.stderr
    inspect = in_venv(reader_venv, reader_venv / "flat-tokens", "inspect", out, "--sequences", "1", cwd=tmp_path)
    assert inspect.returncode == 0 and "train" in inspect.stdout, inspect.stderr[-2000:]
    report = in_venv(reader_venv, reader_venv / "flat-tokens", "report", out, "--html", tmp_path / "r.html", cwd=tmp_path)
    assert report.returncode == 0 and "</html>" in (tmp_path / "r.html").read_text(), report.stderr[-2000:]
    run = in_venv(reader_venv, reader_venv / "flat-tokens", "run", "--help", cwd=tmp_path)
    assert run.returncode == 2 and "Install flat-tokens-beam for `run`, `export` and `index`" in run.stderr, run.stderr


@pytest.mark.slow  # builds a virtual environment and installs into it
def test_the_reader_install_reports_a_bpe_dataset_as_token_ids(reader_venv, tmp_path, corpus, bpe_tokenizer):
    """No `tokenizers` there: the report of a dataset written with a tokenizer.json still renders,
    and says why it shows ids; asking for that tokenizer is one error line."""
    out = tmp_path / "bpe.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", bpe_tokenizer)
    html = tmp_path / "r.html"
    proc = in_venv(reader_venv, reader_venv / "flat-tokens", "report", out, "--html", html, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = html.read_text()
    assert "showing token ids" in page and "pip install tokenizers" in page
    proc = in_venv(reader_venv, reader_venv / "flat-tokens", "report", out, "--html", html, "--tokenizer",
                   bpe_tokenizer, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(f"--tokenizer {bpe_tokenizer}: decoding a "
                                                                  f"tokenizer.json needs the `tokenizers` package: "
                                                                  f"pip install tokenizers"), proc.stderr


@pytest.mark.slow  # builds a virtual environment and installs into it
def test_inspect_in_the_reader_install_shows_ids_says_how_to_decode_and_decodes_with_tokenizers(reader_venv,
                                                                                             tmp_path):
    """A dataset tokenized with a tokenizer.json: the reader-only install has no `tokenizers`, so
    `inspect` shows the token ids and says how to decode them (text and --json alike); with
    `tokenizers` importable there, it decodes."""
    out = tmp_path / "bpe.zarr"
    run_pipeline("--input", SAMPLE / "corpus-1.jsonl", "--output", out, "--tokenizer", SAMPLE / "tokenizer.json",
                 "--validation_fraction", "0")
    first = open_dataset(str(out))["train"].sequence(0)
    inspect = [reader_venv / "flat-tokens", "inspect", out, "--sequences", "1", "--max_chars", "0"]
    text = in_venv(reader_venv, *inspect, cwd=tmp_path)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "pip install tokenizers" in text.stdout and " ".join(map(str, first[:8].tolist())) in text.stdout
    as_json = in_venv(reader_venv, *inspect, "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    report = json.loads(as_json.stdout)
    assert report["decoder"] is None and "pip install tokenizers" in report["decoder_note"]
    assert report["sequences"][0]["ids"] == first.tolist()
    import tokenizers  # the test's own environment has it: put it (alone) on the reader install's path
    site = tmp_path / "site"
    site.mkdir()
    (site / "tokenizers").symlink_to(Path(tokenizers.__file__).parent)
    decoded = in_venv(reader_venv, *inspect, "--json", cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    report = json.loads(decoded.stdout)
    want = tokenizers.Tokenizer.from_file(str(SAMPLE / "tokenizer.json")).decode(first.tolist(),
                                                                                skip_special_tokens=False)
    assert report["decoder"] and report["sequences"][0]["text"] == want


def test_the_full_install_keeps_its_setup():
    """The repository root's setup.py stays the full distribution (Dataflow's --setup_file, the
    Flink and scheduled templates, `pip install -e '.[test,fast]'`), and reader/setup.py names
    exactly the reader's dependencies."""
    full = (REPO / "setup.py").read_text()
    reader = (REPO / "reader" / "setup.py").read_text()
    assert 'name="flat-tokens-beam"' in full and "apache-beam" in full and "tokenizers" in full
    assert 'name="flat-tokens-reader"' in reader
    for name in ("apache-beam", "tokenizers", "orjson", "zstandard", "pyyaml", "pyarrow"):
        assert f'"{name}' not in reader
    for name in ("numpy", "zarr", "fsspec", "gcsfs"):
        assert f'"{name}' in reader
