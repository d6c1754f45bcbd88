"""Parquet input: real Parquet files written with pyarrow (several row groups, nulls, other
column types, invalid UTF-8), read by the real pipeline next to JSONL, locally, on two worker
processes and from gs://. Every document must land exactly once, every rejected row must be
counted and reported with its file, row group and row, and a file's documents must give the
same sequences whether it is JSONL or Parquet."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

from flat_tokens.tools import verify
from tests.conftest import sample_texts
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import check_flat_tokens, run_pipeline, write_jsonl
from tests.wrong_backends import RARE_MARKER
from transforms.read import parquet
from transforms.read.inputs import list_input_files

MULTI_PROCESS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
COMMON = ["--seed", "3", "--validation_fraction", "0.1", "--max_rejected_fraction", "1"]


def write_parquet(path, columns: dict, row_group_size: int | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def invalid_utf8_strings(values: list[bytes]) -> pa.Array:
    """A *string*-typed array holding arbitrary bytes, as careless writers produce: pyarrow
    does not validate a view, nor does its Parquet writer."""
    return pa.array(values, type=pa.binary()).view(pa.string())


def sequences(out) -> list[tuple]:
    """Every sequence of both splits as a tuple of token ids, sorted: the dataset's multiset."""
    root = zarr.open_group(str(out), mode="r")
    found = []
    for split in ("train", "validation"):
        tokens = np.asarray(root[split]["encoded_tokens"][:]) >> 1
        starts = np.asarray(root[split]["seq_starts"][:]).astype(np.int64)
        found += [tuple(tokens[a:b].tolist()) for a, b in zip(starts[:-1], starts[1:])]
    return sorted(found)


def report_rows(paths, open_=open) -> list[tuple]:
    rows = []
    for p in paths:
        with open_(p, "rb") as f:
            rows += [json.loads(line) for line in f.read().decode().splitlines()]
    return sorted((r["file"].rsplit("/", 1)[-1], r.get("row_group"), r.get("row"), r.get("row_in_group"),
                   r.get("line"), r["reason"]) for r in rows)


# ---------------------------------------------------------------------------------------------
# One directory of JSONL and Parquet files, with every kind of bad row


TEXTS = sample_texts()[:300] + ["naïve café — 東京 🚀", "", "   ", "x" * 5000]
MAIN_NULL_ROWS = (0, 123, 250)  # with 50 rows per group: groups 0, 2 and 5
BIG_NULL_ROWS = (1500, 2500)  # with 2000 rows per group: group 0 (past its first record batch), group 1


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(input directory, a JSONL file of every document the pipeline must keep, for the checker)."""
    root = tmp_path_factory.mktemp("parquet")
    src = root / "in"
    main = list(TEXTS)
    for row in MAIN_NULL_ROWS:
        main.insert(row, None)
    write_parquet(src / "main.parquet", {"id": list(range(len(main))), "text": main}, row_group_size=50)
    assert pq.ParquetFile(src / "main.parquet").metadata.num_row_groups == 7
    big = [f"row {i} of a file whose row groups span several record batches" for i in range(3000)]
    for row in BIG_NULL_ROWS:
        big[row] = None
    write_parquet(src / "big.pq", {"text": big}, row_group_size=2000)
    write_parquet(src / "ints.parquet", {"text": pa.array([1, None, 3], pa.int64()), "other": ["a", "b", "c"]})
    write_parquet(src / "binary.parquet", {"text": pa.array(
        ["valid UTF-8 in a binary column: é".encode(), b"\xff not UTF-8", b"\xed\xa0\x80 an encoded surrogate"],
        pa.binary())})
    write_parquet(src / "badstring.parquet", {"text": invalid_utf8_strings([b"fine", b"\xc3\x28 invalid"])})
    write_parquet(src / "nothing.parquet", {"text": pa.array([], pa.string())})
    (src / "lines.jsonl").write_bytes(b'{"text": "a JSONL document"}\n{broken\n\n{"text": "another one"}\n')
    keep = [t for t in main if t is not None] + [t for t in big if t is not None] + [
        "valid UTF-8 in a binary column: é", "fine", "a JSONL document", "another one"]
    expected = write_jsonl(root / "expected" / "documents.jsonl", keep)
    return src, expected


# (file, row group, row in the file, row in the group, reason) of every rejected row, from how
# the files were written above.
EXPECTED_REJECTED = sorted(
    [("main.parquet", row // 50, row, row % 50, None, "null_text") for row in MAIN_NULL_ROWS]
    + [("big.pq", row // 2000, row, row % 2000, None, "null_text") for row in BIG_NULL_ROWS]
    + [("ints.parquet", 0, 0, 0, None, "text_not_a_string"), ("ints.parquet", 0, 1, 1, None, "null_text"),
       ("ints.parquet", 0, 2, 2, None, "text_not_a_string")]
    + [("binary.parquet", 0, 1, 1, None, "invalid_utf8"), ("binary.parquet", 0, 2, 2, None, "invalid_utf8")]
    + [("badstring.parquet", 0, 1, 1, None, "invalid_utf8")]
    + [("lines.jsonl", None, None, None, 2, "invalid_json")])


@pytest.fixture(scope="module")
def local_run(mixed, bpe_tokenizer, tmp_path_factory):
    src, _ = mixed
    out = tmp_path_factory.mktemp("local") / "out.zarr"
    proc = run_pipeline("--input", src, "--tokenizer", bpe_tokenizer, "--output", out, *COMMON)
    return out, proc


@pytest.mark.slow
def test_every_document_lands_once_and_every_bad_row_is_reported(mixed, local_run, bpe_tokenizer):
    _, expected = mixed
    out, proc = local_run
    check_flat_tokens(out, "--input", expected, "--tokenizer", bpe_tokenizer)
    assert verify.verify_dataset(str(out)) == []
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    kept = len(expected.read_text().splitlines())
    assert stats["documents"] == kept
    assert stats["rejected_by_reason"] == {"null_text": 6, "text_not_a_string": 2, "invalid_utf8": 3,
                                           "invalid_json": 1}
    assert stats["rejected"] == len(EXPECTED_REJECTED)
    assert stats["blank"] == 1  # the JSONL file's blank line; a Parquet row is never blank
    assert stats["empty"] == 1  # the empty string: a document that tokenizes to nothing
    assert stats["lines"] == kept + len(EXPECTED_REJECTED) + 1  # every row counts as a line
    reports = sorted((out.parent / "out.zarr.rejected").glob("rejected-*.jsonl"))
    assert report_rows(reports) == EXPECTED_REJECTED
    rows = [json.loads(line) for p in reports for line in p.read_text().splitlines()]
    assert {r["excerpt"] for r in rows if r["reason"] == "null_text"} == {"null"}
    ints = {r["excerpt"] for r in rows if r["file"].endswith("ints.parquet") and r["reason"] != "null_text"}
    assert ints == {"1", "3"}
    assert "\\xff not UTF-8" in {r["excerpt"] for r in rows}
    assert f"{len(EXPECTED_REJECTED)} rejected lines" in proc.stdout


@pytest.mark.slow
def test_rejected_rows_count_against_the_limit(mixed, bpe_tokenizer, tmp_path):
    src, _ = mixed
    proc = run_pipeline("--input", src, "--tokenizer", bpe_tokenizer, "--output", tmp_path / "o.zarr",
                        "--max_rejected_fraction", "0.001", check=False)
    assert proc.returncode == 1, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert f"{len(EXPECTED_REJECTED)} of " in message and "null_text 6" in message, message
    assert verify.verify_dataset(str(tmp_path / "o.zarr"))  # not committed


@pytest.mark.slow
def test_two_worker_processes_write_the_same_bytes(mixed, local_run, bpe_tokenizer, tmp_path):
    src, _ = mixed
    out, _ = local_run
    run_pipeline("--input", src, "--tokenizer", bpe_tokenizer, "--output", tmp_path / "mp.zarr", *COMMON,
                 *MULTI_PROCESS, "--batch_documents", "64")
    check_flat_tokens(tmp_path / "mp.zarr", "--compare", out)
    assert report_rows((tmp_path / "mp.zarr.rejected").glob("*.jsonl")) == EXPECTED_REJECTED


@pytest.mark.slow
def test_gs_parquet_input_through_the_emulator(gcs, mixed, local_run, bpe_tokenizer, tmp_path):  # noqa: F811
    src, _ = mixed
    out, _ = local_run
    gcs.fs.put(str(src) + "/", f"{BUCKET}/pq/", recursive=True)
    gs = f"gs://{BUCKET}"
    proc = run_pipeline("--input", f"{gs}/pq/", "--tokenizer", bpe_tokenizer, "--output", f"{gs}/pq.zarr",
                        "--rejected_output", f"{gs}/pq.rejected", *COMMON, env=gcs.env, timeout=200)
    assert "Traceback" not in proc.stderr
    gcs.fs.get(f"{BUCKET}/pq.zarr/", str(tmp_path / "pq.zarr") + "/", recursive=True)
    check_flat_tokens(tmp_path / "pq.zarr", "--compare", out)
    reports = gcs.fs.glob(f"{BUCKET}/pq.rejected/rejected-*.jsonl")
    assert report_rows(reports, gcs.fs.open) == EXPECTED_REJECTED
    assert all(r.startswith("gs://") for r in (json.loads(line)["file"] for p in reports
                                               for line in gcs.fs.cat(p).decode().splitlines()))


# ---------------------------------------------------------------------------------------------
# The same documents as JSONL and as Parquet


@pytest.mark.slow
def test_jsonl_and_parquet_of_the_same_documents_give_the_same_sequences(tmp_path):
    texts = sample_texts()[:200] + ["naïve café — 東京 🚀", "", "   "]
    write_jsonl(tmp_path / "jsonl" / "c.jsonl", texts)
    write_parquet(tmp_path / "pq16" / "c.parquet", {"text": texts}, row_group_size=16)
    write_parquet(tmp_path / "pq1000" / "c.parquet", {"text": texts}, row_group_size=1000)
    for kind in ("jsonl", "pq16", "pq1000"):
        run_pipeline("--input", tmp_path / kind, "--output", tmp_path / f"{kind}.zarr", "--tokenizer", "bytes",
                     "--seed", "5")
    assert sequences(tmp_path / "pq16.zarr") == sequences(tmp_path / "jsonl.zarr")
    assert len(sequences(tmp_path / "jsonl.zarr")) == len(texts) - 1  # the empty one is dropped
    # A row's place is its index in the file, whatever the row groups: rewriting the file
    # with other row groups keeps the order.
    check_flat_tokens(tmp_path / "pq1000.zarr", "--compare", tmp_path / "pq16.zarr")
    check_flat_tokens(tmp_path / "pq16.zarr", "--input", tmp_path / "jsonl" / "c.jsonl", "--tokenizer", "bytes")


@pytest.mark.slow
def test_text_key_names_the_column(tmp_path):
    write_parquet(tmp_path / "in" / "a.parquet", {"text": ["not this"] * 3, "content": ["one", "two", None]})
    run_pipeline("--input", tmp_path / "in", "--output", tmp_path / "o.zarr", "--tokenizer", "bytes",
                 "--text_key", "content", "--max_rejected_fraction", "1")
    stats = zarr.open_group(str(tmp_path / "o.zarr"), mode="r").attrs["stats"]
    assert (stats["documents"], stats["rejected_by_reason"]) == (2, {"null_text": 1})
    assert sequences(tmp_path / "o.zarr") == sorted(tuple(b + 1 for b in t.encode()) for t in ("one", "two"))


# ---------------------------------------------------------------------------------------------
# Configuration errors: exit 2 before any data is read


def usage_error(*args):
    proc = run_pipeline(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("flat-tokens: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.slow
def test_a_missing_text_column_fails_at_launch_naming_the_columns(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", ["fine"])
    write_parquet(tmp_path / "in" / "b.parquet", {"body": ["x"], "id": [1]})
    out = ["--output", tmp_path / "o.zarr", "--tokenizer", "bytes"]
    msg = usage_error("--input", tmp_path / "in", *out)
    assert "b.parquet" in msg and "no column 'text'" in msg and "body, id" in msg, msg
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "not.parquet").write_text('{"text": "JSONL under a Parquet name"}\n')
    msg = usage_error("--input", tmp_path / "junk", *out)
    assert "not.parquet" in msg and "cannot be read as Parquet" in msg, msg
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "c.parquet.gz").write_bytes(b"\x1f\x8b")
    msg = usage_error("--input", tmp_path / "gz", *out)
    assert "c.parquet.gz" in msg and "compressed Parquet" in msg, msg
    assert not (tmp_path / "o.zarr").exists()


# ---------------------------------------------------------------------------------------------
# The tokenizer guard reads Parquet too


@pytest.mark.slow
def test_the_tokenizer_guard_reads_parquet_and_names_the_row(tmp_path, bpe_tokenizer):
    texts = [f"ordinary document {i}" for i in range(400)]
    common = ["--tokenizer", bpe_tokenizer, "--tokenizer_backend", "tests.wrong_backends:wrong_on_rare_documents"]
    # Among the first documents: the pre-run guard, which peeks at the Parquet file, refuses.
    write_parquet(tmp_path / "early" / "in.parquet", {"text": texts[:5] + [f"a {RARE_MARKER}"] + texts[5:]},
                  row_group_size=100)
    proc = run_pipeline("--input", tmp_path / "early", *common, "--output", tmp_path / "e.zarr", check=False)
    assert proc.returncode == 2 and "one of the first documents" in proc.stderr, proc.stderr
    # Later: the run-time guard fails the job and names the document's row.
    write_parquet(tmp_path / "late" / "in.parquet", {"text": texts + [f"a {RARE_MARKER}"]}, row_group_size=100)
    proc = run_pipeline("--input", tmp_path / "late", *common, "--output", tmp_path / "l.zarr",
                        "--tokenizer_check_fraction", "1", check=False)
    assert proc.returncode == 1
    assert "the document at row 400 of input in.parquet" in proc.stderr.strip().splitlines()[-1], proc.stderr


# ---------------------------------------------------------------------------------------------
# The rules, without a runner


def test_column_values_and_text_of_cover_every_column_type():
    cases = [
        (pa.array(["a", None, ""]), [("a", None), (None, "null_text"), ("", None)]),
        (pa.array(["é", None], pa.large_string()), [("é", None), (None, "null_text")]),
        (pa.array(["s", "s", None]).dictionary_encode(), [("s", None), ("s", None), (None, "null_text")]),
        (pa.array(["v"], pa.string_view()), [("v", None)]),
        (invalid_utf8_strings([b"ok", b"\xff", b"\xed\xa0\x80"]),
         [("ok", None), (None, "invalid_utf8"), (None, "invalid_utf8")]),
        (pa.array([b"\xe6\x9d\xb1", b"\xe6\x9d"], pa.binary()), [("東", None), (None, "invalid_utf8")]),
        (pa.array([1.5, None]), [(None, "text_not_a_string"), (None, "null_text")]),
        (pa.array([["a"], None]), [(None, "text_not_a_string"), (None, "null_text")]),
        (pa.array([{"text": "nested"}]), [(None, "text_not_a_string")]),
        (pa.array([True]), [(None, "text_not_a_string")]),
    ]
    for column, want in cases:
        assert [parquet.text_of(v) for v in parquet.column_values(column)] == want, column.type


def test_rows_are_numbered_across_row_groups_and_record_batches(tmp_path):
    texts = [f"t{i}" for i in range(95)]
    path = write_parquet(tmp_path / "a.parquet", {"text": texts}, row_group_size=40)
    [f] = list_input_files([str(path)], "auto")
    groups = parquet.row_groups_of(f, "text")
    assert [(g.index, g.first_row, g.num_rows) for g in groups] == [(0, 0, 40), (1, 40, 40), (2, 80, 15)]
    assert all(g.text_bytes > 0 for g in groups)
    with parquet.open_parquet(f) as pf:
        rows = [r for g in groups for r in parquet.iter_rows(pf, g, batch_rows=7)]
    assert rows == list(enumerate(texts))


@pytest.mark.parametrize("row_groups", [0, 2])
@pytest.mark.slow
def test_parquet_without_rows_commits_an_empty_dataset_as_jsonl_without_lines_does(tmp_path, row_groups):
    """The run used to fail at the commit ('EmptySideInput' object has no attribute 'get'):
    no rows, no unit of work, no counts at all."""
    path = tmp_path / "empty.parquet"
    table = pa.table({"text": pa.array([], pa.string())})
    with pq.ParquetWriter(path, table.schema) as writer:
        for _ in range(row_groups):
            writer.write_table(table)
    assert pq.ParquetFile(path).metadata.num_row_groups == row_groups and pq.ParquetFile(path).metadata.num_rows == 0
    (tmp_path / "empty.jsonl").write_bytes(b"")
    for name in ("empty.parquet", "empty.jsonl"):
        out = tmp_path / f"{name}.zarr"
        run_pipeline("--input", tmp_path / name, "--tokenizer", "bytes", "--output", out)
        stats = zarr.open_group(str(out), mode="r").attrs["stats"]
        assert (stats["lines"], stats["documents"], stats["train"]["sequences"], stats["validation"]["tokens"]) == (
            0, 0, 0, 0)
        assert verify.verify_dataset(str(out)) == []
