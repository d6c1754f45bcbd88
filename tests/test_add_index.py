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
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, SAMPLE, run_pipeline, stats, write_jsonl
from flat_tokens.format.claims import LEASE_PREFIX
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


def a_plain_dataset(tmp_path) -> Path:
    write_jsonl(tmp_path / "in.jsonl", sample_texts()[:60])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--tokenizer", "bytes", "--output", out)
    return out


def top_level(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


@pytest.mark.slow
def test_a_run_that_takes_the_output_over_while_index_reads_it_stops_index_before_it_writes(tmp_path, monkeypatch):
    """`index` writes as the run that committed the dataset, fenced like that run's writes: a
    run that claims the output meanwhile (a `run --overwrite` of the same path) wins, and
    `index` stops without writing anything there."""
    from pipeline import add_index
    from transforms.write import ownership

    out = a_plain_dataset(tmp_path)
    before = top_level(out)
    generation, committed_by = ownership.current_owner(*ownership.split_url(str(out)))
    assert generation >= 1 and committed_by == json.loads((out / ".zattrs").read_text())["run_id"]
    reading = add_index.split_digests

    def taken_over_while_reading(*args, **kwargs):
        ownership.claim(str(out), "a-newcomer", generation + 1)
        return reading(*args, **kwargs)

    monkeypatch.setattr(add_index, "split_digests", taken_over_while_reading)
    with pytest.raises(ownership.OutputTaken, match="took it over"):
        add_index.add_index(str(out))
    assert not (out / INDEX_DIRECTORY).exists()
    after = top_level(out)
    assert after.pop(f".flat-tokens-run.{generation + 1}") and after == before  # no lease left, nothing replaced


@pytest.mark.slow
def test_attributes_rewritten_while_index_reads_the_dataset_are_left_as_they_are(tmp_path, monkeypatch):
    """The manifest and root attributes are replaced only while each is the object found
    before the dataset was read: one rewritten meanwhile (another `index`, a run) is kept,
    the command says so (exit 2 from the command line), and the dataset is as it was."""
    from pipeline import add_index

    out = a_plain_dataset(tmp_path)
    reading = add_index.split_digests

    def rewritten_while_reading(*args, **kwargs):
        again = out / ".zattrs.again"
        again.write_bytes((out / ".zattrs").read_bytes())
        os.replace(again, out / ".zattrs")  # the same bytes, another object
        return reading(*args, **kwargs)

    monkeypatch.setattr(add_index, "split_digests", rewritten_while_reading)
    before = top_level(out)
    with pytest.raises(add_index.IndexRefused, match=r"\.zattrs: changed while this command read the dataset"):
        add_index.add_index(str(out))
    assert top_level(out) == before and not (out / INDEX_DIRECTORY).exists()
    assert verify.verify_dataset(str(out)) == []
    monkeypatch.undo()
    proc = index(out)  # the same command again: indexed
    assert proc.returncode == 0, proc.stderr
    assert verify.verify_dataset(str(out)) == [] and stats(out)["dedup_index"]["documents"] == 60


@pytest.mark.slow
def test_a_zarr_3_dataset_on_gcs_gets_its_index_through_conditional_replaces(tmp_path, gcs):
    """On GCS the manifest and `zarr.json` are replaced by uploads valid only for the
    generation found before the dataset was read (ifGenerationMatch), against the emulator."""
    write_jsonl(tmp_path / "in.jsonl", sample_texts()[:80])
    url = f"gs://{BUCKET}/indexed-later.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--tokenizer", "bytes", "--output", url, "--zarr_format", "3",
                 env=gcs.env)
    generation = gcs.fs.info(f"{BUCKET}/indexed-later.zarr/zarr.json")["generation"]
    env = {**os.environ, **gcs.env}
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "index", url], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert gcs.fs.info(f"{BUCKET}/indexed-later.zarr/zarr.json")["generation"] != generation
    document = json.loads(gcs.fs.cat_file(f"{BUCKET}/indexed-later.zarr/zarr.json"))
    assert document["node_type"] == "group" and document["attributes"]["stats"]["dedup_index"]["documents"] == 80
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "verify", url], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [p.rsplit("/", 1)[-1] for p in gcs.fs.ls(f"{BUCKET}/indexed-later.zarr", detail=False)]
    assert not [n for n in names if n.startswith(LEASE_PREFIX)] and INDEX_DIRECTORY in names  # the lease given back
