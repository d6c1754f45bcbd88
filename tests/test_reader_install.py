"""The reader in a trainer's environment: numpy, zarr and fsspec, nothing of the pipeline's
own stack (no Beam, tokenizers, zstandard, orjson or pyarrow). A fresh virtual environment
with only those three reads a dataset the pipeline wrote, as the README's install line says."""
import json
import subprocess
import sys

import numpy as np
import pytest

from pipeline.blend import Blend
from pipeline.reader import open_dataset
from tests.helpers import REPO, run_pipeline

TRAINER = """
import json, sys
from pipeline.blend import Blend
from pipeline.reader import open_dataset
splits = open_dataset(sys.argv[1])
train = splits["train"]
batch = next(train.packed_batches(64, 4, seed=3, rank=1, world_size=2, segments=True))
blended = next(Blend([train, splits["validation"]], [3, 1], seed=1).packed_batches(64, 4))
out = {"sequences": [s.tolist() for s in train.iter_sequences(0, 5)], "targets": batch.targets.tolist(),
       "segment_ids": batch.segment_ids.tolist(), "blended": blended[1].tolist()}
for name in ("apache_beam", "tokenizers", "zstandard", "orjson", "pyarrow", "gcsfs"):
    try:
        __import__(name)
        out.setdefault("importable", []).append(name)
    except ImportError:
        pass
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def trainer_python(tmp_path_factory):
    venv = tmp_path_factory.mktemp("trainer") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "numpy", "zarr>=3.1", "fsspec"], check=True,
                   timeout=600, capture_output=True)
    return venv / "bin" / "python"


def test_a_numpy_zarr_fsspec_environment_reads_and_blends(trainer_python, tmp_path, corpus):
    out = tmp_path / "d.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction", "0.1")
    proc = subprocess.run([str(trainer_python), "-c", TRAINER, str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert "importable" not in got, got["importable"]  # not even installed there
    splits = open_dataset(str(out))
    train = splits["train"]
    batch = next(train.packed_batches(64, 4, seed=3, rank=1, world_size=2, segments=True))
    assert got["sequences"] == [s.tolist() for s in train.iter_sequences(0, 5)]
    assert np.array_equal(got["targets"], batch.targets) and np.array_equal(got["segment_ids"], batch.segment_ids)
    blended = next(Blend([train, splits["validation"]], [3, 1], seed=1).packed_batches(64, 4))
    assert np.array_equal(got["blended"], blended[1])
