"""`flat-tokens export --format megatron`: the .bin/.idx bytes, read back by an independent
reader written here from the layout Megatron-core's IndexedDataset documents (header,
version, dtype code, counts, int32 lengths, int64 pointers, int64 document indices), not
from the exporter's code."""
import filecmp
import struct
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from pipeline.reader import open_dataset
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


def test_without_eod_and_on_two_workers_the_same_bytes(dataset, tmp_path):
    one, two = tmp_path / "a" / "x", tmp_path / "b" / "x"
    export(dataset, one, "--part_tokens", "50000")
    export(dataset, two, "--part_tokens", "50000", *MULTI)
    names = sorted(p.name for p in one.parent.iterdir())
    assert len(names) > 4 and names == sorted(p.name for p in two.parent.iterdir())
    assert filecmp.cmpfiles(one.parent, two.parent, names, shallow=False)[0] == names
    train = open_dataset(str(dataset))["train"]
    assert [s for p in parts(one, "train") for s in read_indexed_dataset(p)[1]] == [s.tolist() for s in train]


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
