"""`flat-tokens export --format megatron`: the .bin/.idx bytes, read back by an independent
reader written here from the layout Megatron-core's IndexedDataset documents (header,
version, dtype code, counts, int32 lengths, int64 pointers, int64 document indices), not
from the exporter's code."""
import filecmp
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from flat_tokens.reader import open_dataset
from tests.helpers import REPO, run_pipeline, write_jsonl

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def read_indexed_dataset(prefix):
    """(dtype, sequences) of PREFIX.bin/.idx, by the layout alone."""
    with open(f"{prefix}.idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", idx, 9)[0] == 1  # version
    dtype = {8: np.dtype("<u2"), 4: np.dtype("<i4")}[idx[17]]  # Megatron's DType codes
    sequences, documents = struct.unpack_from("<QQ", idx, 18)
    at = 34
    lengths = np.frombuffer(idx, "<i4", sequences, at)
    at += 4 * sequences
    pointers = np.frombuffer(idx, "<i8", sequences, at)
    at += 8 * sequences
    document_indices = np.frombuffer(idx, "<i8", documents, at)
    at += 8 * documents
    assert at == len(idx)  # nothing after the document indices (no modes: not multimodal)
    assert document_indices[0] == 0 and document_indices[-1] == sequences  # IndexedDataset's own check
    with open(f"{prefix}.bin", "rb") as f:
        data = f.read()
    assert np.array_equal(pointers, np.concatenate([[0], np.cumsum(lengths)[:-1]]) * dtype.itemsize)
    assert len(data) == int(lengths.sum()) * dtype.itemsize
    return dtype, [np.frombuffer(data, dtype, n, p).tolist() for n, p in zip(lengths.tolist(), pointers.tolist())]


def export(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("export") / "d.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction", "0.1",
                 "--tokens_chunk_size", "4096")
    return out


def parts(prefix, split):
    found = sorted(prefix.parent.glob(f"{prefix.name}-{split}-*.idx"))
    return [str(p)[:-4] for p in found]


@pytest.mark.slow
def test_parts_hold_every_sequence_in_order(dataset, tmp_path):
    prefix = tmp_path / "mg" / "corpus"
    proc = export(dataset, prefix, "--part_tokens", "60000", "--append_eod", "0")
    splits = open_dataset(str(dataset))
    for name, split in splits.items():
        names = parts(prefix, name)
        assert len(names) == -(-split.num_tokens // 60000) or len(names) > 1
        got = []
        for p in names:
            dtype, sequences = read_indexed_dataset(p)
            assert dtype == np.uint16  # max_token_id 241 < 65,500
            got += sequences
        assert got == [s.tolist() + [0] for s in split]  # each sequence, then the EOD id
    weighted = " ".join(f"{sum(len(s) for s in read_indexed_dataset(p)[1])} {p}" for p in parts(prefix, "train"))
    assert f"--data-path {weighted}\n" in proc.stdout
    assert "--valid-data-path " + " ".join(f"{sum(len(s) for s in read_indexed_dataset(p)[1])} {p}"
                                           for p in parts(prefix, "validation")) in proc.stdout


@pytest.mark.slow
def test_without_eod_and_on_two_workers_the_same_bytes(dataset, tmp_path):
    one, two = tmp_path / "a" / "x", tmp_path / "b" / "x"
    export(dataset, one, "--part_tokens", "50000")
    export(dataset, two, "--part_tokens", "50000", *MULTI)
    names = sorted(p.name for p in one.parent.iterdir())
    assert len(names) > 4 and names == sorted(p.name for p in two.parent.iterdir())
    assert filecmp.cmpfiles(one.parent, two.parent, names, shallow=False)[0] == names
    train = open_dataset(str(dataset))["train"]
    assert [s for p in parts(one, "train") for s in read_indexed_dataset(p)[1]] == [s.tolist() for s in train]


@pytest.mark.slow
def test_ids_of_65500_and_above_are_int32(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "small": 5, "big": 65499}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    write_jsonl(tmp_path / "in.jsonl", ["small big", "big", "small small"])
    run_pipeline("--input", tmp_path / "in.jsonl", "--output", tmp_path / "d.zarr", "--tokenizer", tmp_path / "tok.json",
                 "--validation_fraction", "0")
    export(tmp_path / "d.zarr", tmp_path / "mg" / "x")
    dtype, sequences = read_indexed_dataset(tmp_path / "mg" / "x-train-00000")
    assert dtype == np.int32 and sorted(sequences) == [[5, 5], [5, 65499], [65499]]
    assert not list((tmp_path / "mg").glob("x-validation-*"))  # an empty split has no part
    export(tmp_path / "d.zarr", tmp_path / "mg" / "y", "--append_eod", "65498")  # the EOD id counts too
    assert read_indexed_dataset(tmp_path / "mg" / "y-train-00000")[0] == np.int32


@pytest.mark.slow
def test_refusals(dataset, tmp_path):
    prefix = tmp_path / "mg" / "x"
    export(dataset, prefix)
    again = export(dataset, prefix, check=False)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr
    assert export(dataset, prefix, "--overwrite").returncode == 0
    for args, words in (((tmp_path / "none.zarr", prefix), "does not exist"),
                        ((dataset, tmp_path / "z", "--append_eod", "-1"), "--append_eod"),
                        ((dataset, tmp_path / "z", "--part_tokens", "0"), "--part_tokens"),
                        ((dataset, tmp_path / "z", "--runer=DirectRunner"), "unknown option")):
        proc = export(*args, check=False)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "z-train-00000.bin").exists()


# ---------------------------------------------------------------------------------------------
# The end-of-document id: the tokenizer's end-of-text token by default


def wordlevel_dataset(tmp_path, specials=()):
    vocab = {"[UNK]": 0, "small": 5, "big": 9, **{t: 20 + i for i, t in enumerate(specials)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    tok.save(str(tmp_path / "tok.json"))
    write_jsonl(tmp_path / "in.jsonl", ["small big", "big", "small small"])
    run_pipeline("--input", tmp_path / "in.jsonl", "--output", tmp_path / "d.zarr", "--tokenizer", tmp_path / "tok.json",
                 "--validation_fraction", "0")
    return tmp_path / "d.zarr"


@pytest.mark.slow
def test_the_tokenizer_s_end_of_text_id_follows_every_sequence_by_default(tmp_path):
    dataset = wordlevel_dataset(tmp_path, ["<pad>", "<|endoftext|>"])  # ids 20 and 21
    proc = export(dataset, tmp_path / "mg" / "x")
    assert "id 21 (<|endoftext|>, the tokenizer's end-of-text token) after every sequence" in proc.stdout
    _, sequences = read_indexed_dataset(tmp_path / "mg" / "x-train-00000")
    assert sorted(sequences) == [[5, 5, 21], [5, 9, 21], [9, 21]]
    proc = export(dataset, tmp_path / "mg" / "y", "--append_eod", "none")  # the explicit way to write none
    assert "no end-of-document id (--append_eod none)" in proc.stdout
    assert sorted(read_indexed_dataset(tmp_path / "mg" / "y-train-00000")[1]) == [[5, 5], [5, 9], [9]]
    (tmp_path / "tok.json").rename(tmp_path / "moved.json")  # the tokenizer cannot be read: ask, do not guess
    proc = export(dataset, tmp_path / "mg" / "z", check=False)
    assert proc.returncode == 2 and "--append_eod ID, or --append_eod none" in proc.stderr, proc.stderr
    assert export(dataset, tmp_path / "mg" / "z", "--append_eod", "7").returncode == 0


def test_a_tokenizer_without_an_end_of_text_token_gets_none(dataset, tmp_path):
    proc = export(dataset, tmp_path / "mg" / "x")  # the bytes tokenizer defines none
    assert "no end-of-document id: the dataset's tokenizer (bytes) defines no end-of-text token" in proc.stdout
    train = open_dataset(str(dataset))["train"]
    assert [s for p in parts(tmp_path / "mg" / "x", "train") for s in read_indexed_dataset(p)[1]] == [
        s.tolist() for s in train]


# ---------------------------------------------------------------------------------------------
# --overwrite replaces an export's own files, all of them, and nothing else


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.slow
def test_overwrite_with_other_parts_replaces_all_of_the_earlier_export_and_nothing_else(dataset, tmp_path):
    prefix = tmp_path / "mg" / "x"
    export(dataset, prefix, "--part_tokens", "20000")
    many = listing(prefix.parent)
    assert len(parts(prefix, "train")) > 5 and "x.flat-tokens-export.json" in many
    mine = ["x-notes.txt", "x-train-00099.bin", "x-train-00001.bin.backup.tmp", "y-train-00000.bin"]  # a user's
    for name in mine:
        (prefix.parent / name).write_text("mine")
    proc = export(dataset, prefix, "--part_tokens", "200000", "--overwrite")
    assert "removed" in proc.stdout and "parts of the earlier export" in proc.stdout
    train = open_dataset(str(dataset))["train"]
    assert len(parts(prefix, "train")) == -(-train.num_tokens // 200000) < len([n for n in many if "train" in n]) // 2
    assert [s for p in parts(prefix, "train") for s in read_indexed_dataset(p)[1]] == [s.tolist() for s in train]
    assert listing(prefix.parent) == sorted(
        mine + ["x.flat-tokens-export.json"] + [f"{p.name}{e}" for s in ("train", "validation")
                                                 for p in map(Path, parts(prefix, s)) for e in (".bin", ".idx")])
    assert all((prefix.parent / name).read_text() == "mine" for name in mine)


@pytest.mark.slow
def test_a_file_no_manifest_lists_is_never_replaced(dataset, tmp_path):
    prefix = tmp_path / "mg" / "x"
    prefix.parent.mkdir()
    (prefix.parent / "x-train-00000.idx").write_text("a user's")  # not an export's: no manifest lists it
    for extra in ((), ("--overwrite",)):
        proc = export(dataset, prefix, *extra, check=False)
        assert proc.returncode == 2 and "no export manifest" in proc.stderr and "x-train-00000.idx" in proc.stderr
    (prefix.parent / "x-train-00000.idx").unlink()
    (prefix.parent / "x.flat-tokens-export.json").write_text('{"parts": ["../../etc"]}')  # not ours either
    proc = export(dataset, prefix, "--overwrite", check=False)
    assert proc.returncode == 2 and "not a flat-tokens export manifest" in proc.stderr
    assert listing(prefix.parent) == ["x.flat-tokens-export.json"]


@pytest.mark.slow
def test_temporary_files_are_removed_when_an_export_fails_and_by_the_next_one(dataset, tmp_path):
    data = tmp_path / "d.zarr"
    shutil.copytree(dataset, data)
    prefix = tmp_path / "mg" / "x"
    prefix.parent.mkdir()
    killed = ["x-train-00003.bin.0123456789abcdef0123456789abcdef.tmp",  # as a killed export leaves them
              "x-validation-00000.idx.fedcba9876543210fedcba9876543210.tmp",
              "x.flat-tokens-export.json.00000000000000000000000000000000.tmp"]
    for name in killed + ["x-train-00003.bin.mine.tmp"]:
        (prefix.parent / name).write_text("partial")
    chunk = next(p for p in sorted((data / "train" / "encoded_tokens").iterdir()) if p.name.isdigit() and p.name != "0")
    saved = chunk.read_bytes()
    chunk.unlink()  # a part's read fails mid-export
    proc = export(data, prefix, "--part_tokens", "20000", check=False)
    assert proc.returncode == 1 and "the export failed" in proc.stderr
    left = listing(prefix.parent)
    assert not [n for n in left if n.endswith(".tmp") and n != "x-train-00003.bin.mine.tmp"], left
    assert "x.flat-tokens-export.json" in left  # it lists what the failed export may have written
    chunk.write_bytes(saved)
    export(data, prefix, "--part_tokens", "20000", "--overwrite")
    assert [n for n in listing(prefix.parent) if n.endswith(".tmp")] == ["x-train-00003.bin.mine.tmp"]
