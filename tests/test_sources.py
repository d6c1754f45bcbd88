"""--record_sources: each split's seq_sources (the source of every sequence, in output order)
and the root attribute `sources`, written by the real pipeline; read back by the reader,
checked by verify, counted by inspect, and invisible to plain flat-tokens readers."""
import filecmp
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from flat_tokens.tools import inspect, verify
from flat_tokens.reader import open_dataset
from tests.helpers import SAMPLE, remove_manifest, run_pipeline, write_jsonl
from flat_tokens.format.chunk_checksums import seal_zstd_frame

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
SMALL_CHUNKS = ["--tokens_chunk_size", "3000", "--seq_starts_chunk_size", "16", "--num_shards", "3"]


def sample_texts():
    return [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three files of distinct real texts: two train inputs and a validation input."""
    root = tmp_path_factory.mktemp("sources")
    texts = list(dict.fromkeys(t for t in sample_texts() if t.strip()))[:450]
    files = [write_jsonl(root / name, texts[i::3]) for i, name in enumerate(("a.jsonl", "b.jsonl", "valid.jsonl"))]
    return {p: {t for t in texts[i::3]} for i, p in enumerate(files)}


def run(files, out, *extra):
    a, b, valid = files
    run_pipeline("--input", a, "--input", b, "--validation_input", valid, "--tokenizer", "bytes", "--output", out,
                 *SMALL_CHUNKS, *extra)
    return out


@pytest.fixture(scope="module")
def recorded(inputs, tmp_path_factory):
    return run(list(inputs), tmp_path_factory.mktemp("recorded") / "r.zarr", "--record_sources")


def text_of(ids) -> str:
    return bytes((np.asarray(ids) - 1).astype(np.uint8)).decode("utf-8")


@pytest.mark.slow
def test_each_sequence_names_the_input_it_came_from(recorded, inputs):
    files = list(inputs)
    splits = open_dataset(str(recorded))
    assert splits["train"].source_names == [str(f) for f in files]
    seen = []
    for name, split in splits.items():
        ids = split.sources(slice(0, len(split)))
        assert ids.dtype == np.uint16 and ids.size == len(split)
        for i, sequence in enumerate(split):
            text = text_of(sequence)
            assert text in inputs[files[int(ids[i])]]
            assert split.sources(i) == int(ids[i])
            seen.append(int(ids[i]))
        assert set(ids.tolist()) == ({0, 1} if name == "train" else {2})
    assert len(seen) == sum(map(len, inputs.values()))


@pytest.mark.slow
def test_the_flat_tokens_arrays_are_byte_identical_without_it(recorded, inputs, tmp_path):
    plain = run(list(inputs), tmp_path / "plain.zarr")
    for split in ("train", "validation"):
        for array in ("encoded_tokens", "seq_starts"):
            a, b = recorded / split / array, plain / split / array
            names = sorted(p.name for p in a.iterdir())
            assert names == sorted(p.name for p in b.iterdir())
            _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
            assert not mismatch and not errors, (split, array, mismatch)
    assert not (plain / "train" / "seq_sources").exists()
    assert "sources" not in zarr.open_group(str(plain), mode="r").attrs
    again = run(list(inputs), tmp_path / "again.zarr", "--record_sources", *MULTI)  # other workers: same bytes
    for split in ("train", "validation"):
        a, b = recorded / split / "seq_sources", again / split / "seq_sources"
        names = sorted(p.name for p in a.iterdir())
        assert filecmp.cmpfiles(a, b, names, shallow=False)[0] == names


@pytest.mark.slow
def test_batches_give_each_tokens_source(recorded):
    train = open_dataset(str(recorded))["train"]
    g = zarr.open_group(str(recorded), mode="r")["train"]
    starts, per_sequence = g["seq_starts"][:].astype(np.int64), g["seq_sources"][:]
    length = 128
    of_token = per_sequence[np.searchsorted(starts, np.arange(train.num_tokens), "right") - 1]
    indices = list(range(0, train.num_windows(length), 5))
    batch = train.packed_batch(indices, length, sources=True, segments=True)
    assert batch.sources.dtype == np.uint16
    assert np.array_equal(batch.sources, np.stack([of_token[i * length:(i + 1) * length] for i in indices]))
    assert (np.diff(batch.sources.astype(int), axis=1)[batch.positions[:, 1:] != 0] == 0).all()  # within a segment
    first_window = {}  # each window's targets -> the first window that holds them
    for k in range(train.num_windows(length)):
        first_window.setdefault((train.packed(k, length) >> 1).astype(np.int64).tobytes(), k)
    for got in [b for _, b in zip(range(6), train.packed_batches(length, 8, rank=1, world_size=2, sources=True,
                                                                block_tokens=4 * length, buffer_blocks=2))]:
        assert got.segment_ids is None
        for row, targets in zip(got.sources, got.targets):
            k = first_window[np.asarray(targets).astype(np.int64).tobytes()]
            assert np.array_equal(row, of_token[k * length:(k + 1) * length])


def test_verify_checks_the_array(recorded, tmp_path):
    assert verify.verify_dataset(str(recorded)) == []
    broken = shutil.copytree(recorded, tmp_path / "broken.zarr")
    remove_manifest(broken)  # a manifest would refuse the rewritten chunks first (tests/test_manifest.py)
    arr = zarr.open_array(str(broken / "validation" / "seq_sources"), mode="r+")
    values = arr[:]
    values[0] = 3  # only sources 0..2 are named
    arr[:] = values
    # zarr itself wrote the chunk without this tool's checksum frame: verify refuses it as damaged...
    # (every chunk of the array was rewritten: verify names the first it reads, whichever that is)
    assert re.search(r"chunk validation/seq_sources/\d+ is damaged", " ".join(verify.verify_dataset(str(broken))))
    # ...so it is sealed as the tool seals chunks, and verify reaches the values in it.
    for chunk in (broken / "validation" / "seq_sources").glob("[0-9]*"):
        chunk.write_bytes(seal_zstd_frame(chunk.read_bytes()))
    problems = verify.verify_dataset(str(broken))
    assert problems == ["validation: seq_sources holds id 3, but only 3 sources are named"]
    shutil.rmtree(broken / "train" / "seq_sources")
    assert "train: missing array seq_sources" in verify.verify_dataset(str(broken))


def test_inspect_shows_per_source_counts(recorded, inputs, capsys):
    assert inspect.main([str(recorded), "--sequences", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    files = [str(f) for f in inputs]
    g = zarr.open_group(str(recorded), mode="r")
    for split in ("train", "validation"):
        ids = g[split]["seq_sources"][:]
        lengths = np.diff(g[split]["seq_starts"][:].astype(np.int64))
        want = [{"name": f, "sequences": int((ids == i).sum()), "tokens": int(lengths[ids == i].sum())}
                for i, f in enumerate(files)]
        assert report["splits"][split]["sources"] == want
    assert inspect.main([str(recorded), "--sequences", "0"]) == 0
    text = capsys.readouterr().out
    assert "per source (seq_sources):" in text and f"{files[2]}:  {want[2]['sequences']} sequences" in text


@pytest.mark.slow
def test_a_mixture_records_its_sources_by_default(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"sources:\n  - {{name: one, input: {SAMPLE / 'corpus-1.jsonl'}, weight: 0.7}}\n"
                   f"  - {{name: two, input: {SAMPLE / 'corpus-2.jsonl'}, weight: 0.3, max_epochs: 2}}\n")
    out = tmp_path / "mixed.zarr"
    run_pipeline("--mixture", mix, "--dedup", "exact", "--tokenizer", "bytes", "--output", out, *SMALL_CHUNKS)
    assert verify.verify_dataset(str(out)) == []  # per-source counts agree with the mixture report
    root = zarr.open_group(str(out), mode="r")
    assert root.attrs["sources"] == ["one", "two"]
    report = {s["name"]: s for s in root.attrs["mixture"]["sources"]}
    ids = root["train"]["seq_sources"][:]
    assert [int((ids == i).sum()) for i in range(2)] == [report["one"]["train_sequences"],
                                                        report["two"]["train_sequences"]]


SEQAX = """
import sys, zarr, numpy as np
assert zarr.__version__.startswith("2"), zarr.__version__
root = zarr.open_group(sys.argv[1], mode="r")
for split in ("train", "validation"):  # what seqax's input_loader.ShufflingLoader touches
    encoded_tokens, seq_starts = root[split]["encoded_tokens"], root[split]["seq_starts"]
    max_token_id = root[split].attrs["max_token_id"]
    assert len(encoded_tokens.shape) == 1 and encoded_tokens.dtype == np.uint32
    assert len(seq_starts.shape) == 1 and seq_starts.dtype == np.uint64
    np.save(f"{sys.argv[2]}/{split}-encoded_tokens.npy", encoded_tokens[:])
    np.save(f"{sys.argv[2]}/{split}-seq_starts.npy", seq_starts[:])
    print(split, max_token_id)
"""


@pytest.mark.slow
def test_seqax_style_reads_with_zarr_2_see_the_flat_tokens_arrays(recorded, tmp_path, tmp_path_factory):
    venv = tmp_path_factory.mktemp("zarr2-sources") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "zarr<3", "numpy<2.3"], check=True, timeout=600,
                   capture_output=True)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", SEQAX, str(recorded), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    g = zarr.open_group(str(recorded), mode="r")
    for split in ("train", "validation"):
        for array in ("encoded_tokens", "seq_starts"):
            assert np.array_equal(np.load(Path(tmp_path) / f"{split}-{array}.npy"), g[split][array][:])
        assert f"{split} {g[split].attrs['max_token_id']}" in proc.stdout
