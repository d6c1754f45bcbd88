import json

import pytest

from tests.helpers import SAMPLE, train_byte_level_bpe, write_jsonl


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
