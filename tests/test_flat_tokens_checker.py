"""The tests' own format checker catches what it must, on datasets written here by hand with
plain zarr (not by the pipeline), so that the pipeline tests that rely on it mean something."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

from tests.helpers import CHECKER

EXAMPLE = [[1, 2], [3, 4, 5], [6, 7, 8]]  # the format's worked example


def encode(sequences):
    tokens = [2 * t + (1 if i == 0 else 0) for seq in sequences for i, t in enumerate(seq)]
    starts = np.cumsum([0] + [len(s) for s in sequences])
    return np.asarray(tokens, np.uint32), starts.astype(np.uint64)


def write(path, splits, zarr_format=2, chunk=2, shard=None):
    root = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    for name, sequences in splits.items():
        group = root.create_group(name)
        tokens, starts = encode(sequences)
        for member, data in (("encoded_tokens", tokens), ("seq_starts", starts)):
            extra = {"shards": (shard,)} if shard else {}
            array = group.create_array(member, shape=data.shape, dtype=data.dtype, chunks=(chunk,),
                                       fill_value=0, config={"write_empty_chunks": True}, **extra)
            array[:] = data
        group.attrs["max_token_id"] = max((t for s in sequences for t in s), default=0)
    return path


def check(*args):
    proc = subprocess.run([sys.executable, str(CHECKER), *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("layout", [dict(zarr_format=2), dict(zarr_format=3), dict(zarr_format=3, shard=4)])
def test_a_well_formed_dataset_passes(tmp_path, layout):
    # 8 tokens in 2-token chunks; with 4-token shards the last shard is whole, the seq_starts
    # shard (4 values) partial: both must count as complete.
    write(tmp_path / "d.zarr", {"train": EXAMPLE, "validation": []}, **layout)
    code, out = check(tmp_path / "d.zarr")
    assert code == 0 and out.startswith("OK: train: 3 seqs 8 tokens max_id 8"), out


@pytest.mark.parametrize("layout", [dict(zarr_format=2), dict(zarr_format=3), dict(zarr_format=3, shard=4)])
def test_a_missing_chunk_inside_a_sequence_fails(tmp_path, layout):
    # A chunk of zeros in the middle of a long sequence breaks no other invariant.
    write(tmp_path / "d.zarr", {"train": [list(range(1, 13))], "validation": [[1]]}, **layout)
    array_dir = tmp_path / "d.zarr" / "train" / "encoded_tokens"
    stored = sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name[0].isdigit())
    os.remove(stored[1])
    code, out = check(tmp_path / "d.zarr")
    assert code == 1 and "train: encoded_tokens: 1 of" in out and "missing" in out, out


def test_wrong_start_bits_ids_above_the_maximum_and_bad_starts_fail(tmp_path):
    path = write(tmp_path / "d.zarr", {"train": EXAMPLE, "validation": []})
    tokens = zarr.open_array(str(path / "train" / "encoded_tokens"), mode="r+")
    tokens[1] = tokens[1] | 1
    assert "start bits wrong in [0, 8), the first at 1" in check(path)[1]
    tokens[1] = 4
    zarr.open_group(str(path / "train"), mode="r+").attrs["max_token_id"] = 7
    assert "token id 8 is above max_token_id 7" in check(path)[1]
    starts = zarr.open_array(str(path / "train" / "seq_starts"), mode="r+")
    starts[1] = 0
    code, out = check(path)
    assert code == 1 and "does not strictly increase" in out


def test_the_input_check_finds_a_missing_and_an_unexpected_document(tmp_path):
    texts = ["ab", "cde", "fgh"]
    (tmp_path / "in.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in texts))
    as_bytes = [[b + 1 for b in t.encode()] for t in texts]
    good = write(tmp_path / "good.zarr", {"train": as_bytes[::-1], "validation": []})
    assert check(good, "--input", tmp_path / "in.jsonl", "--tokenizer", "bytes")[0] == 0
    bad = write(tmp_path / "bad.zarr", {"train": as_bytes[:2] + [[1]], "validation": []})
    code, out = check(bad, "--input", tmp_path / "in.jsonl", "--tokenizer", "bytes")
    assert code == 1 and "1 missing, 1 unexpected" in out


def test_compare_sees_one_differing_token(tmp_path):
    a = write(tmp_path / "a.zarr", {"train": EXAMPLE, "validation": []})
    shutil.copytree(a, tmp_path / "b.zarr")
    assert check(a, "--compare", tmp_path / "b.zarr")[0] == 0
    b = zarr.open_array(str(tmp_path / "b.zarr" / "train" / "encoded_tokens"), mode="r+")
    b[7] = 14
    code, out = check(a, "--compare", tmp_path / "b.zarr")
    assert code == 1 and "compare train/encoded_tokens: differs" in out
