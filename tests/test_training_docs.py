"""docs/training.md stays runnable: every snippet runs as written on the quickstart's dataset,
each where its framework is installed (torch and jax are not dependencies: a snippet whose
framework is missing is skipped, saying so); the Megatron export's files are read back, with
Megatron-core's IndexedDataset where it is installed; seqax's configuration is checked against
the dataset the way seqax's ShufflingLoader reads it (seqax itself is not installable here)."""
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
import zarr

from tests.helpers import REPO, SAMPLE, run_pipeline
from tests.test_export import read_indexed_dataset

PAGE = REPO / "docs" / "training.md"


def section(title: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def blocks(title: str, kind: str) -> list[str]:
    found = re.findall(rf"```{kind}\n(.*?)```", section(title), re.S)
    assert found, (title, kind)
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """out/sample.zarr, as the quickstart writes it."""
    root = tmp_path_factory.mktemp("training")
    run_pipeline("--input", f"{SAMPLE}/*.jsonl", "--tokenizer", SAMPLE / "tokenizer.json", "--output",
                 root / "out" / "sample.zarr")
    return root


def run(cmd, workdir, **env):
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def needs(module: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed here: this snippet is not run (this package does not depend on it)")


def learned(out: str) -> bool:
    first, last = map(float, re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", out).groups())
    return last < first - 0.5


def test_the_install_line_is_the_reader_distribution():
    assert blocks("Install in the trainer's environment", "bash")[0].startswith("pip install ./reader ")
    assert (REPO / "reader" / "setup.py").exists()  # tests/test_reader_install.py builds it in a fresh venv


def test_the_trainers_imports_import(tmp_path):
    """The page's import lines, each where its framework is installed: the flat_tokens one always."""
    lines = [line for line in blocks("Install in the trainer's environment", "python")[0].splitlines() if line]
    runnable = [line for line in lines if not any(f"{m}_data" in line and importlib.util.find_spec(m) is None
                                                  for m in ("torch", "jax"))]
    assert runnable[0].startswith("from flat_tokens import ")
    out = run([sys.executable, "-W", "error::DeprecationWarning", "-c", "\n".join(runnable + ["print('ok')"])], tmp_path)
    assert out.strip() == "ok"


@pytest.mark.slow  # trains small models with torch and jax, where installed
def test_pytorch_one_gpu(workdir):
    needs("torch")
    out = run([sys.executable, "-c", blocks("PyTorch, one GPU", "python")[0]], workdir)
    assert "step 29:" in out and learned(out), out


@pytest.mark.slow  # trains small models with torch and jax, where installed
def test_pytorch_torchrun_two_processes(workdir):
    needs("torch")
    (workdir / "train_ddp.py").write_text(blocks("PyTorch, several hosts", "python")[0])
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "train_ddp.py"], workdir, OMP_NUM_THREADS="1")
    assert "step 9:" in out and "on 2 processes" in out


@pytest.mark.slow  # trains small models with torch and jax, where installed
def test_jax(workdir):
    needs("jax")
    out = run([sys.executable, "-c", blocks("JAX", "python")[0]], workdir, JAX_PLATFORMS="cpu",
              XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert "step 29:" in out and "on 2 devices" in out and learned(out), out


@pytest.mark.slow  # trains small models with torch and jax, where installed
def test_megatron_export(workdir):
    command = blocks("Megatron-LM", "bash")[0].split()
    assert command[0] == "flat-tokens"
    out = run([sys.executable, "-m", "pipeline.cli", *command[1:]], workdir)
    assert "id 0 (<|endoftext|>, the tokenizer's end-of-text token) after every sequence" in out
    prefix = workdir / "out" / "megatron" / "sample-train-00000"
    _, sequences = read_indexed_dataset(prefix)
    assert all(s[-1] == 0 for s in sequences)
    shown = blocks("Megatron-LM", "text")[0]  # the page shows what the export prints
    assert out[out.index("Megatron-LM data arguments"):].strip() == shown.strip(), out
    listed = re.search(r"--data-path (\d+) (\S+)", out)
    assert listed.group(2) == "out/megatron/sample-train-00000" and int(listed.group(1)) == sum(map(len, sequences))
    if importlib.util.find_spec("megatron") is None:
        return  # Megatron-core is not installed here: the layout reader above is the check
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    dataset = IndexedDataset(str(prefix))
    assert [dataset[i].tolist() for i in range(len(dataset))] == sequences


@pytest.mark.slow  # trains small models with torch and jax, where installed
def test_seqax_configuration_reads_the_dataset_as_seqax_does(workdir):
    config = yaml.safe_load(blocks("seqax", "yaml")[0])
    params, tokens = config["flat_tokens"], config["training"]["tokens"]
    assert set(params) == {"filespec", "streams", "read_blocks_per_shuffle_buffer", "sequences_per_read_block", "seed",
                           "sequence_packing"}  # seqax's FlatTokensParams fields
    root = zarr.open_group(str(workdir / params["filespec"]), mode="r")
    for split in ("train", "validation"):
        encoded, starts = root[split]["encoded_tokens"], root[split]["seq_starts"]
        assert encoded.dtype == np.uint32 and starts.dtype == np.uint64 and len(encoded.shape) == 1
        assert isinstance(root[split].attrs["max_token_id"], int)
    # seqax's ShufflingLoader arithmetic: whole read blocks per stream, and at least one step.
    windows = root["train"]["encoded_tokens"].shape[0] // tokens["len"]
    read_blocks = windows // params["sequences_per_read_block"] // params["streams"] * params["streams"]
    assert read_blocks > 0 and tokens["batch"] % params["streams"] == 0
    assert read_blocks * params["sequences_per_read_block"] // tokens["batch"] > 0  # steps
