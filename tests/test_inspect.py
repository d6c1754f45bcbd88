"""`python -m flat_tokens.tools.inspect` on datasets written by the real pipeline."""
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

import pipeline
from pipeline import cli
from flat_tokens.tools.inspect import main
from tests.helpers import REPO, run_pipeline
from tests.test_reader import EXAMPLE, input_texts, raw_sequences, write_dataset
from flat_tokens.format import manifest


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, corpus, bpe_tokenizer):
    """Two real runs, started together: the `bytes` tokenizer and a byte-level BPE."""
    root = tmp_path_factory.mktemp("inspect")
    common = ["--input", f"{corpus}/*.jsonl"]
    runs = {"bytes": [*common, "--output", root / "bytes.zarr", "--tokenizer", "bytes",
                      "--validation_fraction", "0.1", "--seq_starts_chunk_size", "50"],
            "bpe": [*common, "--output", root / "bpe.zarr", "--tokenizer", bpe_tokenizer]}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda args: run_pipeline(*args), runs.values()))
    return {name: root / f"{name}.zarr" for name in runs}


@pytest.fixture(scope="module")
def bytes_dataset(datasets):
    return datasets["bytes"]


@pytest.fixture(scope="module")
def bpe_dataset(datasets):
    return datasets["bpe"]


@pytest.fixture
def run(capsys):
    def inspect(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err
    return inspect


def report(run, *args):
    code, out, err = run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def arrays(path, split="train"):
    g = zarr.open_group(str(path), mode="r")[split]
    return g["encoded_tokens"][:], g["seq_starts"][:].astype(np.int64)


def nearest_rank(sorted_lengths, p):
    return int(sorted_lengths[max(1, int(np.ceil(p / 100 * sorted_lengths.size))) - 1])


# ---------------------------------------------------------------------------------------------
# Summary, histogram, provenance


@pytest.mark.slow
def test_summary_states_the_counts_and_provenance(run, bytes_dataset):
    code, out, err = run(bytes_dataset)
    assert code == 0 and err == ""
    attrs = zarr.open_group(str(bytes_dataset), mode="r").attrs
    stats = attrs["stats"]
    for split in ("train", "validation"):
        s = stats[split]
        assert s["sequences"] > 0
        assert (f"{split}: {s['sequences']:,} sequences, {s['tokens']:,} tokens, "
                f"max_token_id {s['max_token_id']}") in out
    assert "bytes/token" in out
    assert f"run_id: \"{attrs['run_id']}\"" in out
    assert f"\"version\": \"{pipeline.__version__}\"" in out
    assert "seed: 0" in out and "\"spec\": \"bytes\"" in out
    assert f"documents {stats['documents']:,}" in out and "rejected 0" in out and "empty 1" in out


def test_histogram_and_percentiles_from_the_arrays(run, bytes_dataset):
    got = report(run, bytes_dataset, "--block", "7")
    assert got["splits"] == report(run, bytes_dataset)["splits"]  # blocks do not change anything
    for split in ("train", "validation"):
        lengths = np.sort(np.diff(arrays(bytes_dataset, split)[1]))
        s = got["splits"][split]
        assert s["length"] == {"min": int(lengths[0]), "mean": round(float(lengths.mean()), 2),
                               "p50": nearest_rank(lengths, 50), "p90": nearest_rank(lengths, 90),
                               "p99": nearest_rank(lengths, 99), "max": int(lengths[-1])}
        hist = s["histogram"]
        assert sum(h["count"] for h in hist) == lengths.size
        assert hist[0]["lo"] <= lengths[0] and lengths[-1] <= hist[-1]["hi"]
        for h in hist:
            assert h["hi"] == 2 * h["lo"] - 1
            assert h["count"] == np.count_nonzero((lengths >= h["lo"]) & (lengths <= h["hi"]))
    code, out, _ = run(bytes_dataset)
    assert out.count("length histogram") == 2
    train = got["splits"]["train"]
    for h in train["histogram"]:
        label = f"{h['lo']}–{h['hi']}"
        line = next(line for line in out.splitlines() if line.strip().startswith(label + " │"))
        assert re.search(rf"│[█▏▎▍▌▋▊▉ ]*\s{h['count']}\s", line), line
    assert "p50 {p50:,}  p90 {p90:,}  p99 {p99:,}  max {max:,}".format(**train["length"]) in out


# ---------------------------------------------------------------------------------------------
# Decoding sequences


def test_decodes_sequences_with_the_bytes_tokenizer(run, bytes_dataset, corpus):
    got = report(run, bytes_dataset, "--tokenizer", "bytes", "--sequences", "80", "--max_chars", "0")
    train = raw_sequences(bytes_dataset, "train")[:80]
    assert [e["text"] for e in got["sequences"]] == [bytes(t - 1 for t in s).decode("utf-8") for s in train]
    assert [e["tokens"] for e in got["sequences"]] == [len(s) for s in train]
    assert not Counter(e["text"] for e in got["sequences"]) - Counter(input_texts(corpus))
    code, out, _ = run(bytes_dataset, "--tokenizer", "bytes", "--sequences", "2")
    assert "first 2 train sequences (decoded with bytes)" in out
    for e in got["sequences"][:2]:
        shown = json.dumps(e["text"][:400], ensure_ascii=False)
        assert f"[{e['index']}] {e['tokens']} tokens: {shown}" in out


@pytest.mark.parametrize("explicit", [True, False], ids=["--tokenizer", "recorded"])
def test_decodes_sequences_with_the_bpe_tokenizer(run, bpe_dataset, bpe_tokenizer, corpus, explicit):
    args = ["--tokenizer", bpe_tokenizer] if explicit else []
    got = report(run, bpe_dataset, *args, "--sequences", "100000", "--max_chars", "0", "--split", "validation")
    assert got["decoder"] == str(bpe_tokenizer)
    texts = [e["text"] for e in got["sequences"]]
    assert len(texts) == zarr.open_group(str(bpe_dataset), mode="r").attrs["stats"]["validation"]["sequences"] > 0
    assert not Counter(texts) - Counter(input_texts(corpus))
    code, out, _ = run(bpe_dataset, *args, "--sequences", "1", "--split", "validation")
    assert f"(decoded with {bpe_tokenizer})" in out
    assert json.dumps(texts[0][:400], ensure_ascii=False) in out


@pytest.mark.parametrize("change", [{"spec": "/nonexistent/tokenizer.json"}, {"sha256": "0" * 64}])
def test_unloadable_recorded_tokenizer_shows_ids(run, bpe_dataset, tmp_path, change):
    copy = tmp_path / "copy.zarr"
    shutil.copytree(bpe_dataset, copy)
    root = zarr.open_group(str(copy), mode="r+")
    attrs = {k: v for k, v in root.attrs.items() if k != manifest.ATTRIBUTE}
    attrs["tokenizer"] = {**attrs["tokenizer"], **change}
    # Sealed again (issue 37): a dataset committed with a tokenizer that cannot be loaded here.
    root.attrs.put({**attrs, manifest.ATTRIBUTE: manifest.seal((copy / manifest.MANIFEST).read_bytes(), attrs)})
    got = report(run, copy, "--sequences", "2", "--max_chars", "5")
    assert got["decoder"] is None and "showing token ids" in got["decoder_note"]
    train = raw_sequences(copy, "train")
    assert [e["ids"] for e in got["sequences"]] == [s[:5] for s in train[:2]]
    code, out, _ = run(copy, "--sequences", "1")
    assert f"[0] {len(train[0])} tokens: ids {' '.join(map(str, train[0][:400]))}" in out


# ---------------------------------------------------------------------------------------------
# Packed windows


def test_packed_window_rows_follow_the_format(run, bytes_dataset):
    tokens, _ = arrays(bytes_dataset)
    got = report(run, bytes_dataset, "--window", "40", "--window_index", "3", "--tokenizer", "bytes")["window"]
    w = tokens[120:160]
    assert got["range"] == [120, 160] and got["encoded"] == w.tolist()
    assert got["targets"] == (w >> 1).tolist()
    assert got["inputs"] == [0] + [0 if w[j] & 1 else int(w[j - 1] >> 1) for j in range(1, 40)]
    code, out, _ = run(bytes_dataset, "--window", "40", "--window_index", "3", "--tokenizer", "bytes")
    assert "packed window 3 of length 40 (train: encoded_tokens[120:160])" in out
    rows = {}
    for line in out.split("packed window", 1)[1].splitlines():
        name, _, rest = line.strip().partition(" ")
        if name in ("encoded", "targets", "inputs", "start"):
            rows.setdefault(name, []).extend(int(x) for x in rest.split())
    assert rows == {"encoded": got["encoded"], "targets": got["targets"], "inputs": got["inputs"],
                    "start": (w & 1).tolist()}


def test_worked_example(run, tmp_path):
    url = write_dataset(str(tmp_path / "ex.zarr"), {"train": EXAMPLE, "validation": []})
    got = report(run, url, "--window", "8", "--tokenizer", "bytes")
    assert got["window"]["targets"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert got["window"]["inputs"] == [0, 1, 0, 3, 4, 0, 6, 7]
    assert report(run, url, "--window", "4", "--window_index", "1")["window"]["encoded"] == [10, 13, 14, 16]
    code, out, _ = run(url, "--window", "8")
    assert re.search(r"targets\s+1\s+2\s+3\s+4\s+5\s+6\s+7\s+8\n", out)
    assert re.search(r"inputs\s+0\s+1\s+0\s+3\s+4\s+0\s+6\s+7\n", out)
    assert "validation: 0 sequences, 0 tokens" in out and "(empty split)" in out
    # The default window (16) does not fit in 8 tokens: said, not an error.
    code, out, _ = run(url)
    assert code == 0 and "no full window of length 16" in out


def test_fsspec_url(run, tmp_path):
    url = write_dataset(f"memory://{tmp_path.name}-inspect", {"train": EXAMPLE, "validation": [[9, 9]]})
    got = report(run, url, "--window", "4", "--window_index", "1")
    assert got["window"]["encoded"] == [10, 13, 14, 16]
    assert got["splits"]["validation"]["tokens"] == 2


def test_console_script_dispatch(capsys, tmp_path):
    url = write_dataset(str(tmp_path / "ex.zarr"), {"train": EXAMPLE, "validation": []})
    assert cli.main(["inspect", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"]["train"]["sequences"] == 3


# ---------------------------------------------------------------------------------------------
# Errors: exit 2 with one line


def test_uncommitted_dataset_exits_2(run, tmp_path):
    url = write_dataset(str(tmp_path / "half.zarr"), {"train": EXAMPLE, "validation": []}, commit=False)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", url], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "unfinished" in proc.stderr
    url = write_dataset(str(tmp_path / "c.zarr"), {"train": EXAMPLE, "validation": []}, complete=False)
    code, out, err = run(url)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "unfinished" in err


def test_missing_dataset_and_bad_window_exit_2(run, tmp_path):
    code, out, err = run(tmp_path / "nothing.zarr")
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    url = write_dataset(str(tmp_path / "ex.zarr"), {"train": EXAMPLE, "validation": []})
    code, out, err = run(url, "--window", "4", "--window_index", "2")
    assert code == 2 and "has 2 full windows of length 4" in err
    code, out, err = run(url, "--tokenizer", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err
