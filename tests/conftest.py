import json
import os
import resource

import pytest

from flat_tokens.reader import open_dataset
from tests.helpers import SAMPLE, run_pipeline, train_byte_level_bpe, write_jsonl


def sample_texts():
    return [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    """A real byte-level BPE tokenizer.json, trained here on real text (stdlib docstrings)."""
    path = tmp_path_factory.mktemp("tok") / "bpe.json"
    train_byte_level_bpe(sample_texts(), vocab_size=1200).save(str(path))
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Real text plus the edge cases: empty and whitespace-only documents, non-ASCII and
    emoji, and one document longer than many chunks. Split over three files."""
    texts = sample_texts()[:600]
    texts += ["", "   ", "\n\t", "naïve café — 東京 🚀🚀", "x" * 50_000, "👍"]
    root = tmp_path_factory.mktemp("corpus")
    for i in range(3):
        write_jsonl(root / f"part-{i}.jsonl", texts[i::3])
    return root


@pytest.fixture(scope="session")
def byte_splits(tmp_path_factory, corpus):
    """The corpus through the bytes tokenizer (20% validation, 4096-token chunks), opened by the
    reader: what the trainer-side loader tests (test_loaders, test_torch_data) read."""
    out = tmp_path_factory.mktemp("loaders") / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes",
                 "--validation_fraction", "0.2", "--tokens_chunk_size", "4096")
    return open_dataset(str(out))

# FLAT_TOKENS_TEST_MEMORY=<file>: one JSON line per test with its peak memory (the test process's
# own peak during the test, and the largest child process's peak where that grew), so that the
# README's figure for the suite's peak comes from a measurement, and its heaviest test is named.
MEMORY_LOG = os.environ.get("FLAT_TOKENS_TEST_MEMORY")


def _own_peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not MEMORY_LOG:
        yield
        return
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets this process's peak RSS (Linux)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    yield
    grown = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(MEMORY_LOG, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "own_mib": _own_peak_kib() // 1024,
                            "child_mib": grown // 1024 if grown > children else None}) + "\n")
