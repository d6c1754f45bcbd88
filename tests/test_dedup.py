"""Exact deduplication (--dedup exact) and overlapping inputs.

Every distinct text must land exactly once, in one split only, whichever files and splits
its copies come from. The expected set of texts is computed here (a Python set of the
texts this test wrote) and checked by the independent checker (tests/flat_tokens_checker.py)."""
import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import zarr
from tokenizers import Tokenizer

from flat_tokens.tools import verify
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 (a fixture)
from tests.helpers import REPO, SAMPLE, check_flat_tokens, run_pipeline, write_jsonl

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def sample_texts() -> list[str]:
    """Real text with real duplicates: the sample corpus holds 22 exact copies (and one empty document)."""
    return [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]


def split_texts(out, split: str, tokenizer) -> Counter:
    """The texts of a split's sequences, decoded by the test's own tokenizer (byte-level BPE is lossless)."""
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:] >> 1, g["seq_starts"][:]
    tok = Tokenizer.from_file(str(tokenizer))
    return Counter(tok.decode(tokens[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts[:-1], starts[1:]))


def write_distinct(path, texts) -> str:
    """The distinct non-empty texts, once each: what the checker must find in the output."""
    write_jsonl(path, sorted({t for t in texts if t}))
    return str(path)


@pytest.mark.slow
def test_every_distinct_text_lands_once_and_never_in_both_splits(tmp_path, bpe_tokenizer):
    texts = sample_texts()
    valid_own = [f"{t}\n\n(held out)" for t in texts[:40]]
    train = {"a.jsonl": texts[0::2] + texts[200:260], "b.jsonl": texts[1::2] + texts[:5]}
    valid = valid_own + texts[300:340] + valid_own[:3]  # 40 texts also in train, 3 repeated
    for name, lines in train.items():
        write_jsonl(tmp_path / "train" / name, lines)
    write_jsonl(tmp_path / "valid.jsonl", valid)
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "train", "--validation_input", tmp_path / "valid.jsonl", "--dedup", "exact",
                 "--tokenizer", bpe_tokenizer, "--output", out, "--num_shards", "3")

    everything = [t for lines in train.values() for t in lines] + valid
    check_flat_tokens(out, "--input", write_distinct(tmp_path / "distinct.jsonl", everything),
                      "--tokenizer", bpe_tokenizer)
    got_train, got_valid = split_texts(out, "train", bpe_tokenizer), split_texts(out, "validation", bpe_tokenizer)
    assert not set(got_train) & set(got_valid)
    # A text read from a validation input is validation data, wherever else it also appears.
    assert set(got_valid) == {t for t in valid if t}
    assert set(got_train) == {t for t in everything if t} - set(valid)
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    empty = sum(1 for t in everything if not t)
    assert stats["duplicates"] == len(everything) - empty - len({t for t in everything if t})
    assert stats["documents"] == len(everything) and stats["empty"] == empty
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_the_output_depends_only_on_the_distinct_texts(tmp_path, bpe_tokenizer):
    """With a validation fraction, copies in other files (listed first or last, in another
    order) change nothing: order and split come from each text's content. Also on two worker
    processes and another shard count, and with the ids in the dedup shuffle itself (no
    staged files for its parts to name: --no_staging)."""
    texts = [t for t in sample_texts() if t]
    write_jsonl(tmp_path / "one" / "x.jsonl", texts[:500])
    write_jsonl(tmp_path / "one" / "y.jsonl", texts[500:])
    write_jsonl(tmp_path / "more" / "0-copies.jsonl", texts[450:520][::-1] + texts[:30])
    common = ["--dedup", "exact", "--tokenizer", bpe_tokenizer, "--validation_fraction", "0.2", "--seed", "11"]
    run_pipeline("--input", tmp_path / "one", "--output", tmp_path / "a.zarr", *common)
    run_pipeline("--input", tmp_path / "more", "--input", f"{tmp_path}/one/*.jsonl", "--input", tmp_path / "one",
                 "--output", tmp_path / "b.zarr", "--num_shards", "5", "--batch_documents", "64", "--no_staging",
                 *common, *MULTI)
    check_flat_tokens(tmp_path / "b.zarr", "--compare", tmp_path / "a.zarr", "--input",
                      write_distinct(tmp_path / "distinct.jsonl", texts), "--tokenizer", bpe_tokenizer)
    train, valid = split_texts(tmp_path / "b.zarr", "train", bpe_tokenizer), split_texts(tmp_path / "b.zarr",
                                                                                          "validation", bpe_tokenizer)
    assert not set(train) & set(valid) and 0.1 < len(valid) / (len(train) + len(valid)) < 0.3
    stats = zarr.open_group(str(tmp_path / "b.zarr"), mode="r").attrs["stats"]
    assert stats["duplicates"] == 2 * len(texts) + 100 - len(set(texts))


def test_a_file_listed_twice_is_refused_without_dedup(tmp_path):
    """What a new user tries: the same file as train and validation, or matched by two patterns."""
    write_jsonl(tmp_path / "a.jsonl", ["first document", "second document"])
    write_jsonl(tmp_path / "b.jsonl", ["third document"])
    os.symlink(tmp_path / "a.jsonl", tmp_path / "link.jsonl")
    common = ["--tokenizer", "bytes", "--output", tmp_path / "out.zarr"]
    a = tmp_path / "a.jsonl"
    cases = [
        (["--input", a, "--validation_input", a], f"--input {a} and by --validation_input {a}"),
        (["--input", a, "--input", f"{tmp_path}/*.jsonl"], f"--input {a} and by --input {tmp_path}/*.jsonl"),
        (["--input", tmp_path / "b.jsonl", "--input", tmp_path / "link.jsonl", "--input", a],
         f"--input {tmp_path / 'link.jsonl'} and by --input {a}"),
    ]
    for args, message in cases:
        proc = run_pipeline(*args, *common, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "is listed twice" in proc.stderr and message in proc.stderr and "--dedup exact" in proc.stderr
        assert not (tmp_path / "out.zarr").exists()


@pytest.mark.slow
def test_a_file_listed_twice_is_read_once_with_dedup(tmp_path):
    texts = [t for t in sample_texts() if t][:120]
    write_jsonl(tmp_path / "a.jsonl", texts)
    a = tmp_path / "a.jsonl"
    run_pipeline("--input", a, "--dedup", "exact", "--tokenizer", "bytes", "--output", tmp_path / "once.zarr")
    run_pipeline("--input", a, "--input", f"{tmp_path}/*.jsonl", "--dedup", "exact", "--tokenizer", "bytes",
                 "--output", tmp_path / "twice.zarr")
    check_flat_tokens(tmp_path / "twice.zarr", "--compare", tmp_path / "once.zarr")
    # The same file as train and validation: its texts are validation data, so train is empty.
    out = tmp_path / "both.zarr"
    run_pipeline("--input", a, "--validation_input", a, "--dedup", "exact", "--tokenizer", "bytes", "--output", out)
    check_flat_tokens(out, "--input", write_distinct(tmp_path / "distinct.jsonl", texts), "--tokenizer", "bytes")
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert stats["train"]["sequences"] == 0 and stats["validation"]["sequences"] == len(set(texts))
    assert stats["duplicates"] == 2 * len(texts) - len(set(texts))


@pytest.mark.parametrize("dedup", ["none", "exact"])
@pytest.mark.slow
def test_identical_texts_inside_one_file(tmp_path, dedup):
    write_jsonl(tmp_path / "a.jsonl", ["same", "other", "same", "same", ""])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "a.jsonl", "--dedup", dedup, "--tokenizer", "bytes", "--output", out,
                 "--validation_fraction", "0")
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert (stats["train"]["sequences"], stats["duplicates"], stats["empty"]) == \
        ((2, 2, 1) if dedup == "exact" else (4, 0, 1))


@pytest.mark.slow
def test_the_dedup_report_in_parquet_lists_every_removed_copy_and_inspect_shows_them(tmp_path, capsys):
    """--dedup exact with a .parquet report, on two worker processes: one row per removed copy,
    naming its place and its kept copy's (the same text); inspect --duplicates shows them."""
    import pyarrow.parquet as pq
    from flat_tokens.tools.inspect import main as inspect
    from flat_tokens.format.report_files import document_at
    texts = [t for t in sample_texts() if t][:200]
    write_jsonl(tmp_path / "a.jsonl", texts)
    write_jsonl(tmp_path / "b.jsonl", texts[:50] + texts[:10])
    out, report = tmp_path / "out.zarr", tmp_path / "report.parquet"
    run_pipeline("--input", tmp_path / "a.jsonl", "--input", tmp_path / "b.jsonl", "--tokenizer", "bytes",
                 "--dedup", "exact", "--output", out, "--dedup_report", report, "--num_shards", "3", *MULTI)
    files = sorted(report.iterdir())
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert len(rows) == stats["duplicates"] == stats["dedup_report_rows"] >= 60 and len(files) <= 3
    removed = Counter(document_at(r["removed_file"], r["removed_offset"]) for r in rows)
    assert removed == Counter(texts + texts[:50] + texts[:10]) - Counter(set(texts))
    assert all(r["match"] == "exact" and r["similarity"] == 1.0 and r["removed_digest"] == r["kept_digest"]
               and document_at(r["kept_file"], r["kept_offset"]) == document_at(r["removed_file"], r["removed_offset"])
               for r in rows)
    # The copy kept is at the smallest place: the first input's.
    assert all(r["kept_file"].endswith("a.jsonl") for r in rows if r["removed_file"].endswith("b.jsonl"))
    capsys.readouterr()
    assert inspect(["--duplicates", "2", "--max_chars", "40", str(out)]) == 0
    shown = capsys.readouterr().out
    assert shown.count("(exact copy)") == 2 and rows[0]["removed_file"] in shown


def test_a_report_file_is_created_once_and_never_replaced(tmp_path):
    """A retried bundle writes the same bytes (found in place: fine); other bytes at the name
    (another run's rows) are not replaced, and the job stops naming the file."""
    from transforms.tokenize.dedup_report import ReportConflict, ReportRows, WriteReportShard

    def rows(offset):
        d = np.array([[1, 2]], dtype=np.uint64)
        return ReportRows(np.array(["0:a.jsonl"], dtype=object), np.array([offset], dtype=np.uint64), d,
                          np.array(["0:a.jsonl"], dtype=object), np.array([0], dtype=np.uint64), d,
                          np.array([False]), np.array([1.0], dtype=np.float32), np.array([None], dtype=object),
                          np.array([np.nan]))

    writer = WriteReportShard(str(tmp_path / "r"), "run1", 2, {"0:a.jsonl": "/data/a.jsonl"})
    assert list(writer.process((1, rows(7)), None)) == [{"dedup_report_rows": 1}]
    first = (tmp_path / "r" / "dedup-run1-00001-of-00002.jsonl").read_bytes()
    assert list(writer.process((1, rows(7)), None)) == [{"dedup_report_rows": 1}]
    assert json.loads(first)["removed_file"] == "/data/a.jsonl" and json.loads(first)["removed_offset"] == 7
    with pytest.raises(ReportConflict, match="already holds other rows"):
        list(writer.process((1, rows(8)), None))
    assert (tmp_path / "r" / "dedup-run1-00001-of-00002.jsonl").read_bytes() == first


@pytest.mark.slow  # starts the emulator
def test_a_gs_run_writes_every_removed_row_to_a_gs_report_and_inspect_reads_it(gcs, tmp_path):
    """--output and --dedup_report on gs:// (the real fake-gcs-server), inputs there too, with
    exact copies and near-copies: the report holds one row per removed document (the input's
    documents less the dataset's, read here from local copies of the inputs at the rows'
    offsets), and `inspect --duplicates` reads it and the texts back from the bucket."""
    texts = list(dict.fromkeys(t for t in sample_texts() if len(t.split()) >= 20))[:160]  # distinct
    local = {"a.jsonl": texts[:100] + texts[:6], "b.jsonl": texts[100:] + texts[90:95] + [t + " Also." for t in texts[:6]]}
    for name, lines in local.items():
        write_jsonl(tmp_path / "in" / name, lines)
    gs = f"gs://{BUCKET}/dedup-report"
    gcs.fs.put(str(tmp_path / "in") + "/", f"{BUCKET}/dedup-report/in/", recursive=True)
    run_pipeline("--input", f"{gs}/in/*.jsonl", "--tokenizer", "bytes", "--output", f"{gs}/out.zarr",
                 "--dedup", "near", "--dedup_report", f"{gs}/dups.jsonl", "--validation_fraction", "0",
                 "--num_shards", "2", env=gcs.env, timeout=300)
    gcs.fs.invalidate_cache()
    gcs.fs.get(f"{BUCKET}/dedup-report/out.zarr/", str(tmp_path / "out.zarr") + "/", recursive=True)
    attrs = zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs
    assert attrs["dedup_report"] == f"{gs}/dups.jsonl"
    names = gcs.fs.ls(f"{BUCKET}/dedup-report/dups.jsonl", detail=False)
    pattern = re.compile(f"dedup-{attrs['run_id']}-0000[01]-of-00002\\.jsonl")
    assert names and all(pattern.fullmatch(n.rsplit("/", 1)[-1]) for n in names), names  # and no probe left
    rows = [json.loads(line) for n in names for line in gcs.fs.cat(n).decode().splitlines()]

    def text_at(url: str, offset: int) -> str:  # from the local copy the bucket's file was made of
        assert url.startswith(f"{gs}/in/"), url
        with open(tmp_path / "in" / url.rsplit("/", 1)[-1], "rb") as f:
            f.seek(offset)
            return json.loads(f.readline())["text"]

    g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["train"]
    tokens, starts = (g["encoded_tokens"][:] >> 1) - 1, g["seq_starts"][:]
    written = Counter(bytes(tokens[a:b].astype(np.uint8)).decode("utf-8") for a, b in zip(starts[:-1], starts[1:]))
    removed = Counter(text_at(r["removed_file"], r["removed_offset"]) for r in rows)
    stats = attrs["stats"]
    assert len(rows) == stats["dedup_report_rows"] == stats["duplicates"] + stats["near_duplicates"] >= 17
    assert removed == Counter(t for lines in local.values() for t in lines) - written  # every removed row, once
    assert {r["match"] for r in rows} == {"exact", "near"}
    assert all(text_at(r["kept_file"], r["kept_offset"]) in written for r in rows)

    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", f"{gs}/out.zarr", "--duplicates", "50",
                           "--max_chars", "100000", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **gcs.env})
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert len(shown) == len(rows)
    assert all(s["removed_text"] == text_at(s["removed_file"], s["removed_offset"])
               and s["kept_text"] == text_at(s["kept_file"], s["kept_offset"]) for s in shown)
