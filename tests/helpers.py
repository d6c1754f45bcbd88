"""Shared test helpers: real tokenizers, real corpora on disk, real pipeline runs."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import zarr
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests import warm_python

REPO = Path(__file__).resolve().parent.parent
# The tests' own format checker: independent of the pipeline and of `verify`, and inside the
# repository, so the tests need nothing beside the clone.
CHECKER = REPO / "tests" / "flat_tokens_checker.py"
SAMPLE = REPO / "pipeline" / "sample"


def train_byte_level_bpe(texts, vocab_size: int = 1000) -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on `texts` (deterministic for the same texts)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_jsonl(path: Path, texts, key: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({key: t}, ensure_ascii=False) + "\n")
    return path


def run_pipeline(*args, check: bool = True, env=None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Runs `python -m pipeline.run` in a subprocess, as a user would."""
    cmd = [sys.executable, "-m", "pipeline.run", *map(str, args)]
    proc = warm_python.run([*map(str, args)], "pipeline.run", REPO, timeout, env)  # tests/warm_python.py: why
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def check_flat_tokens(*args) -> subprocess.CompletedProcess:
    """Runs the independent checker (tests/flat_tokens_checker.py); asserts it says OK."""
    proc = warm_python.run([str(CHECKER), *map(str, args)], None, os.getcwd(), 600)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("OK"), proc.stdout + proc.stderr
    return proc


def stats(out) -> dict:
    """The committed dataset's `stats` root attribute."""
    return zarr.open_group(str(out), mode="r").attrs["stats"]


def refused(proc) -> str:
    """The one error line of a run refused at launch (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("flat-tokens: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def remove_manifest(root: Path) -> None:
    """Makes `root` a dataset as written before manifests (issue 37), or by another tool: the
    manifest object and its seal in the root attributes removed (zarr 2 or 3). Tests of the
    checks that stand without a manifest start from it (with one, the manifest refuses any
    edited object first)."""
    root = Path(root)
    (root / "flat-tokens-manifest.json").unlink()
    if (root / ".zattrs").exists():
        attrs = json.loads((root / ".zattrs").read_text())
        attrs.pop("manifest")
        (root / ".zattrs").write_text(json.dumps(attrs))
    else:
        meta = json.loads((root / "zarr.json").read_text())
        meta["attributes"].pop("manifest")
        (root / "zarr.json").write_text(json.dumps(meta))


class CountingReads:
    """Stands in for a split's encoded_tokens array: counts the tokens each read asks for, and
    the stored (compressed) bytes of the chunks it decompresses (what a host or a DataLoader
    worker downloads from gs://)."""

    def __init__(self, arr, chunk_bytes):
        self.arr, self.shape, self.chunks, self.chunk_bytes = arr, arr.shape, arr.chunks, chunk_bytes
        self.tokens = self.bytes = 0
        self._lock = threading.Lock()

    def __getitem__(self, key):
        c = self.chunks[0]
        with self._lock:
            self.tokens += key.stop - key.start
            self.bytes += sum(self.chunk_bytes[i] for i in range(key.start // c, (key.stop - 1) // c + 1))
        return self.arr[key]
