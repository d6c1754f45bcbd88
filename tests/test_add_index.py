"""`flat-tokens index DATASET` (issue 41): a dataset built without a dedup index gets one, its
arrays unchanged, its manifest and seal updated so that verify passes; a later build
--dedup_against it removes the texts it holds. Refused: a dataset failing verification, one
already indexed, one whose tokenizer does not give back its texts."""
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import zarr
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from flat_tokens.tools import verify
from tests.helpers import REPO, SAMPLE, run_pipeline, stats, write_jsonl
from flat_tokens.format.index_files import INDEX_DIRECTORY, decode_index


def sample_texts() -> list[str]:
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    return sorted({t for t in texts if t.strip()})


def index(dataset, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "index", str(dataset), *map(str, extra)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def array_files(out: Path) -> dict:
    """sha256 of every object of the splits (chunks and their metadata)."""
    found = {}
    for base, _, names in os.walk(out):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), out)
            if rel.startswith(("train", "validation")):
                found[rel] = hashlib.sha256(Path(base, name).read_bytes()).hexdigest()
    return found


def decoded(out: Path, split: str, tokenizer) -> Counter:
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:] >> 1, g["seq_starts"][:]
    tok = Tokenizer.from_file(str(tokenizer))
    return Counter(tok.decode(tokens[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts[:-1], starts[1:]))


@pytest.mark.slow
def test_an_old_dataset_gets_an_index_that_a_later_build_deduplicates_against(tmp_path, bpe_tokenizer):
    texts = sample_texts()
    old = texts[:120] + texts[:10]  # built without dedup: 10 texts twice
    write_jsonl(tmp_path / "old.jsonl", old)
    out = tmp_path / "old.zarr"
    run_pipeline("--input", tmp_path / "old.jsonl", "--tokenizer", bpe_tokenizer, "--output", out,
                 "--validation_fraction", "0.2")
    assert "dedup_index" not in stats(out)
    before = array_files(out)
    proc = index(out)
    assert proc.returncode == 0, proc.stderr
    assert "120 texts" in proc.stdout
    assert array_files(out) == before  # the arrays are untouched
    assert verify.verify_dataset(str(out)) == []  # the manifest lists the index, the seal binds the new stats
    s = stats(out)["dedup_index"]
    assert s["documents"] == 120 and s["added_by"] == "flat-tokens index"
    files = sorted((out / INDEX_DIRECTORY).iterdir())
    held = {tuple(d) for f in files for d in decode_index(f.read_bytes(), str(f))[0].tolist()}
    assert len(held) == 120
    # A later build against it removes the texts it holds, whichever split they are in there.
    valid = set(decoded(out, "validation", bpe_tokenizer))
    assert valid
    new = texts[120:200] + texts[:30]
    write_jsonl(tmp_path / "new.jsonl", new)
    later = tmp_path / "new.zarr"
    run_pipeline("--input", tmp_path / "new.jsonl", "--tokenizer", bpe_tokenizer, "--output", later,
                 "--dedup", "exact", "--validation_fraction", "0.2", "--dedup_against", out)
    assert stats(later)["dedup_against"] == 30
    got = set(decoded(later, "train", bpe_tokenizer)) | set(decoded(later, "validation", bpe_tokenizer))
    assert got == set(texts[120:200])
    # Indexed once: a second run says so and changes nothing.
    proc = index(out)
    assert proc.returncode == 2 and "already has a dedup index" in proc.stderr


@pytest.mark.slow
def test_a_dataset_failing_verification_is_refused_and_left_alone(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", sample_texts()[:50])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--tokenizer", "bytes", "--output", out)
    chunk = sorted(p for p in (out / "train" / "encoded_tokens").iterdir() if not p.name.startswith("."))[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 1
    chunk.write_bytes(bytes(data))
    proc = index(out)
    assert proc.returncode == 2 and "fails verification" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / INDEX_DIRECTORY).exists()


@pytest.mark.slow
def test_a_tokenizer_that_does_not_give_back_the_text_is_refused(tmp_path):
    """A lowercasing, whitespace-splitting tokenizer maps "The  Cat" and "the cat" to the same
    ids: the texts read cannot be recovered, so their digests cannot be."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(sample_texts()[:200], trainer=trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                                                              special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "lossy.json"))
    write_jsonl(tmp_path / "in.jsonl", sample_texts()[:50])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--tokenizer", tmp_path / "lossy.json", "--output", out)
    proc = index(out)
    assert proc.returncode == 2 and "not a byte-level BPE without a normalizer" in proc.stderr
    assert not (out / INDEX_DIRECTORY).exists() and verify.verify_dataset(str(out)) == []


def test_a_path_that_is_no_dataset_is_refused_in_one_line(tmp_path):
    proc = index(tmp_path / "missing.zarr")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("flat-tokens index: error:") and "missing.zarr" in proc.stderr
    assert not (tmp_path / "missing.zarr").exists()


@pytest.mark.slow
def test_with_dedup_near_the_index_has_its_near_part_and_near_copies_are_found(tmp_path, bpe_tokenizer):
    """`index --dedup near` computes each decoded text's signature: a later --dedup near build
    removes its near-copies of the old dataset's texts (one word in 100 misspelt)."""
    import re
    texts = [t for t in sample_texts() if len(re.findall(r"\w+", t)) >= 100]
    write_jsonl(tmp_path / "old.jsonl", texts[:40])
    out = tmp_path / "old.zarr"
    run_pipeline("--input", tmp_path / "old.jsonl", "--tokenizer", bpe_tokenizer, "--output", out)
    proc = index(out, "--dedup", "near")
    assert proc.returncode == 0, proc.stderr
    assert verify.verify_dataset(str(out)) == []
    assert stats(out)["dedup_index"]["near"]["files"] == stats(out)["dedup_index"]["files"]

    def misspelt(text):  # a letter added to the 50th word
        word = list(re.finditer(r"\w+", text))[50]
        return text[:word.end()] + "q" + text[word.end():]

    write_jsonl(tmp_path / "new.jsonl", texts[40:60] + [misspelt(t) for t in texts[:10]])
    later = tmp_path / "new.zarr"
    run_pipeline("--input", tmp_path / "new.jsonl", "--tokenizer", bpe_tokenizer, "--output", later,
                 "--dedup", "near", "--dedup_against", out)
    assert stats(later)["dedup_against_near"] == 10
    got = set(decoded(later, "train", bpe_tokenizer)) | set(decoded(later, "validation", bpe_tokenizer))
    assert got == set(texts[40:60])
