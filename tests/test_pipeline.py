"""Real pipeline runs on real runners, real zarr stores and real tokenizers."""
import json
import re
import subprocess
import sys
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
import zarr
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from flat_tokens.tools import verify
from tests.helpers import check_flat_tokens, run_pipeline, write_jsonl
from transforms.records import ShardSize, SortedShard
from transforms.write import CreateOutput, LayOutShards, WriteFlatTokens
from transforms.write.commit import CommitDataset
from transforms.write.zarr_store import StoreTarget

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def arrays(path, split="train"):
    g = zarr.open_group(str(path), mode="r")[split]
    return g["encoded_tokens"][:], g["seq_starts"][:], g.attrs["max_token_id"]


def sequences(path):
    out = []
    for split in ("train", "validation"):
        tokens, starts, _ = arrays(path, split)
        out += [tuple((tokens[a:b] >> 1).tolist()) for a, b in zip(starts[:-1], starts[1:])]
    return out


def test_worked_example_through_the_writer_path(tmp_path):
    """Sequences [[1,2],[3,4,5],[6,7,8]] in two shards, 3-token chunks (so chunks are shared)."""
    def encoded(seqs):
        return np.array([2 * t + (i == 0) for s in seqs for i, t in enumerate(s)], dtype=np.uint32)

    shards = [SortedShard("train", 0, np.array([2]), encoded([[1, 2]])),
              SortedShard("train", 5, np.array([3, 3]), encoded([[3, 4, 5], [6, 7, 8]]))]
    sizes = [ShardSize("train", 0, 2, 1, 2), ShardSize("train", 5, 6, 2, 8)]
    target = StoreTarget(url=str(tmp_path / "ex.zarr"), tokens_chunk=3, seq_starts_chunk=3, run_id="t")
    with beam.Pipeline(runner="FnApiRunner") as p:
        layout = p | "Sizes" >> beam.Create(sizes) | beam.CombineGlobally(LayOutShards())
        ready = (p | "Once" >> beam.Create([None])
                 | beam.ParDo(CreateOutput(target, False, str(tmp_path / "rejected")), beam.pvalue.AsSingleton(layout)))
        written = (p | "Shards" >> beam.Create(shards)
                   | WriteFlatTokens(target, beam.pvalue.AsSingleton(layout), beam.pvalue.AsSingleton(ready)))
        counts = p | "Counts" >> beam.Create([{"lines": 3, "documents": 3}])
        (written, layout, counts) | CommitDataset(target, {})
    tokens, starts, max_id = arrays(tmp_path / "ex.zarr")
    assert tokens.tolist() == [3, 4, 7, 8, 10, 13, 14, 16]
    assert starts.tolist() == [0, 2, 5, 8]
    assert max_id == 8
    assert verify.verify_dataset(str(tmp_path / "ex.zarr")) == []


@pytest.mark.parametrize("tokenizer", ["bpe", "bytes"])
@pytest.mark.slow
def test_every_document_lands_once_in_a_shuffled_order(tmp_path, corpus, bpe_tokenizer, tokenizer):
    spec = str(bpe_tokenizer) if tokenizer == "bpe" else "bytes"
    out = tmp_path / "out.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", spec, "--num_shards", "4")
    report = check_flat_tokens(out, "--input", f"{corpus}/*.jsonl", "--tokenizer", spec, "--shuffle-report").stdout
    rho, bound = map(float, re.search(r"rank corr ([-+.\d]+) \(1/sqrt\(n\)=([.\d]+)\)", report).groups())
    assert abs(rho) < 4 * bound, report
    kept = int(re.search(r"(\d+) input neighbours kept", report).group(1))
    assert kept <= 6, report
    assert verify.verify_dataset(str(out)) == []
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert stats["empty"] == (1 if tokenizer == "bytes" else 1)  # "" only: whitespace has tokens
    assert stats["documents"] == 606


@pytest.mark.slow
def test_multiprocessing_tiny_chunks_and_many_shards_give_identical_arrays(tmp_path, corpus, bpe_tokenizer):
    """Race stress: 5-token chunks and 23 shards written by two processes concurrently."""
    common = ["--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer]
    run_pipeline(*common, "--output", tmp_path / "a.zarr")
    run_pipeline(*common, "--output", tmp_path / "b.zarr", "--num_shards", "23", "--tokens_chunk_size", "5",
                 "--seq_starts_chunk_size", "3", "--read_range_mb", "1", *MULTI)
    check_flat_tokens(tmp_path / "b.zarr", "--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer,
                      "--compare", tmp_path / "a.zarr")


@pytest.mark.slow
def test_another_seed_gives_another_order_of_the_same_documents(tmp_path, corpus):
    common = ["--input", f"{corpus}/*.jsonl", "--tokenizer", "bytes", "--validation_fraction", "0"]
    run_pipeline(*common, "--output", tmp_path / "s0.zarr")
    run_pipeline(*common, "--output", tmp_path / "s1.zarr", "--seed", "1")
    a, b = sequences(tmp_path / "s0.zarr"), sequences(tmp_path / "s1.zarr")
    assert a != b and Counter(a) == Counter(b)


@pytest.mark.slow
def test_the_same_documents_split_into_other_files_give_the_same_multiset(tmp_path, corpus):
    texts = [line for p in sorted(corpus.glob("*.jsonl")) for line in p.read_text(encoding="utf-8").splitlines()]
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "all.jsonl").write_text("\n".join(texts) + "\n", encoding="utf-8")
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", tmp_path / "three.zarr", "--tokenizer", "bytes")
    run_pipeline("--input", tmp_path / "one", "--output", tmp_path / "one.zarr", "--tokenizer", "bytes")
    assert Counter(sequences(tmp_path / "three.zarr")) == Counter(sequences(tmp_path / "one.zarr"))


@pytest.mark.slow
def test_one_document_and_an_empty_validation_split(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", ["only one"])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction", "0")
    tokens, starts, max_id = arrays(out)
    assert ((tokens >> 1) - 1).astype(np.uint8).tobytes() == b"only one"
    assert starts.tolist() == [0, 8] and max_id == max(b"only one") + 1
    v_tokens, v_starts, _ = arrays(out, "validation")
    assert v_tokens.size == 0 and v_starts.tolist() == [0]
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_an_input_without_a_document_to_write_gives_an_empty_committed_dataset(tmp_path):
    """No shard sizes at all: the layout side input falls back to no shards."""
    (tmp_path / "in.jsonl").write_text('\n   \n{"text": ""}\n\n', encoding="utf-8")
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--output", out, "--tokenizer", "bytes")
    for split in ("train", "validation"):
        tokens, starts, max_id = arrays(out, split)
        assert tokens.size == 0 and starts.tolist() == [0] and max_id == 0
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert (stats["documents"], stats["blank"], stats["empty"]) == (1, 3, 1)
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_validation_input_forms_the_validation_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [f"train {i}" for i in range(50)])
    write_jsonl(tmp_path / "valid.jsonl", [f"valid {i}" for i in range(7)])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "train.jsonl", "--validation_input", tmp_path / "valid.jsonl",
                 "--output", out, "--tokenizer", "bytes")
    attrs = zarr.open_group(str(out), mode="r").attrs
    assert (attrs["stats"]["train"]["sequences"], attrs["stats"]["validation"]["sequences"]) == (50, 7)
    assert attrs["validation_fraction"] == 0  # what was done: all of --input is train


def test_a_validation_fraction_with_a_validation_input_is_refused(tmp_path):
    """Both options at once used to run, ignore the fraction and record it as if applied."""
    write_jsonl(tmp_path / "train.jsonl", [f"train {i}" for i in range(50)])
    write_jsonl(tmp_path / "valid.jsonl", [f"valid {i}" for i in range(7)])
    proc = run_pipeline("--input", tmp_path / "train.jsonl", "--validation_input", tmp_path / "valid.jsonl",
                        "--validation_fraction", "0.2", "--output", tmp_path / "out.zarr", "--tokenizer", "bytes",
                        check=False)
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and "--validation_fraction 0.2" in error[0] and "--validation_input" in error[0], proc.stderr
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("extra", [["--zarr_format", "3"], ["--zarr_format", "3", "--chunks_per_shard", "4",
                                                           "--tokens_chunk_size", "16", "--seq_starts_chunk_size", "4"]])
@pytest.mark.slow
def test_zarr_format_3_holds_the_same_arrays(tmp_path, corpus, extra):
    # Tiny chunks (tens of thousands of them for the whole corpus) are shown on one of its
    # three files, the one with the document longer than many chunks.
    common = ["--input", f"{corpus}/*.jsonl" if len(extra) == 2 else f"{corpus}/part-1.jsonl", "--tokenizer", "bytes"]
    run_pipeline(*common, "--output", tmp_path / "v2.zarr")
    run_pipeline(*common, "--output", tmp_path / "v3.zarr", *extra, *MULTI[:0])
    check_flat_tokens(tmp_path / "v3.zarr", "--compare", tmp_path / "v2.zarr")
    assert verify.verify_dataset(str(tmp_path / "v3.zarr")) == []


@pytest.mark.slow
def test_no_special_tokens_are_added(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(tmp_path / "tok.json"))
    write_jsonl(tmp_path / "in.jsonl", ["hello world"])
    run_pipeline("--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.zarr", "--tokenizer",
                 tmp_path / "tok.json", "--validation_fraction", "0")
    tokens, _, _ = arrays(tmp_path / "o.zarr")
    assert (tokens >> 1).tolist() == [2, 3]


def save_word_level(path, vocab: dict) -> None:
    """A whitespace WordLevel tokenizer.json holding `vocab`. Its JSON is written here, not by
    tokenizers' own save(): that walks every id up to the largest (2**31 of them: 8.4 GB of
    memory and 25 s, the test suite's peak)."""
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    spec = json.loads(tok.to_str())
    spec["model"]["vocab"] = vocab
    path.write_text(json.dumps(spec))


@pytest.mark.slow
def test_ids_wider_than_16_bits_meet_narrow_ones_in_one_shard(tmp_path):
    """Batches cross the shuffle as uint16 ids when they fit and uint32 otherwise; one shard
    holding both must keep every id, up to the format's largest (2**31-1)."""
    vocab = {"[UNK]": 0, "small": 5, "top16": 65535, "first17": 65536, "largest": 2**31 - 1}
    save_word_level(tmp_path / "tok.json", vocab)
    write_jsonl(tmp_path / "in" / "narrow.jsonl", ["small top16", "small", "top16 top16 small"])
    write_jsonl(tmp_path / "in" / "wide.jsonl", ["first17 small", "largest", "small largest top16"])
    run_pipeline("--input", f"{tmp_path}/in/*.jsonl", "--output", tmp_path / "o.zarr", "--tokenizer",
                 tmp_path / "tok.json", "--validation_fraction", "0", "--num_shards", "1")
    want = [tuple(vocab[w] for w in t.split()) for t in ["small top16", "small", "top16 top16 small",
                                                          "first17 small", "largest", "small largest top16"]]
    assert sorted(sequences(tmp_path / "o.zarr")) == sorted(want)
    assert arrays(tmp_path / "o.zarr")[2] == 2**31 - 1
    check_flat_tokens(tmp_path / "o.zarr", "--input", f"{tmp_path}/in/*.jsonl", "--tokenizer", tmp_path / "tok.json")


@pytest.mark.slow
def test_a_token_id_above_2_31_fails_the_job_naming_the_tokenizer(tmp_path):
    save_word_level(tmp_path / "big.json", {"[UNK]": 0, "big": 2**31})
    write_jsonl(tmp_path / "in.jsonl", ["big"])
    proc = run_pipeline("--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.zarr", "--tokenizer",
                        tmp_path / "big.json", check=False)
    assert proc.returncode == 1
    assert "big.json" in proc.stderr and "2**31-1" in proc.stderr
    out = tmp_path / "o.zarr"
    assert not out.exists() or verify.verify_dataset(str(out))  # never a committed dataset


@pytest.mark.slow
def test_a_zarr_2_reader_opens_the_default_output(tmp_path, tmp_path_factory, corpus):
    out = tmp_path / "out.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--tokens_chunk_size", "1000")
    venv = tmp_path_factory.mktemp("zarr2") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "zarr<3", "numpy<2.3"], check=True, timeout=600)
    script = ("import sys, zarr, numpy as np; g = zarr.open_group(sys.argv[1], mode='r'); "
              "assert zarr.__version__.startswith('2'), zarr.__version__; "
              "[np.save(f'{sys.argv[2]}/{s}-{a}.npy', g[s][a][:]) for s in ('train', 'validation') "
              "for a in ('encoded_tokens', 'seq_starts')]; print(g['train'].attrs['max_token_id'])")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", script, str(out), str(tmp_path)],
                          capture_output=True, text=True, check=True)
    for split in ("train", "validation"):
        tokens, starts, max_id = arrays(out, split)
        assert np.array_equal(np.load(tmp_path / f"{split}-encoded_tokens.npy"), tokens)
        assert np.array_equal(np.load(tmp_path / f"{split}-seq_starts.npy"), starts)
    assert int(proc.stdout) == arrays(out)[2]
