"""--min_tokens, --max_tokens and --long_documents (issue 32.6): documents shorter than the
minimum are dropped and counted; longer ones are split into consecutive sequences (in order,
in one split) or truncated; deterministic, recorded in the provenance, and every count still
adds up at the commit (with --dedup exact and mixtures too)."""
import numpy as np
import pytest
import zarr

from flat_tokens.format.checksums import Sum
from flat_tokens.tools import verify
from tests.helpers import check_flat_tokens, refused, run_pipeline, stats, write_jsonl
from transforms.local_files import LocalFile
from transforms.records import DistinctBatch, TokenizedBatch
from transforms.tokenize.lengths import TRUNCATE, LengthLimits, limit_lengths

# ---------------------------------------------------------------------------------------------
# The pure function


STAGED = LocalFile("/staged/ids", Sum(0, 0))


def tokenized(lengths):
    ids = np.concatenate([np.full(n, i + 1, dtype=np.uint16) for i, n in enumerate(lengths)])
    return TokenizedBatch("0:a.jsonl", "auto", np.arange(len(lengths), dtype=np.uint64) * 100,
                          np.array(lengths, dtype=np.int64), ids, empty=0, ids_file=STAGED)


def test_a_long_document_becomes_consecutive_pieces_with_its_own_place():
    batch, counts = limit_lengths(tokenized([3, 10, 1, 5]), LengthLimits(min_tokens=2, max_tokens=4))
    assert batch.lengths.tolist() == [3, 4, 4, 2, 4, 1]
    assert batch.offsets.tolist() == [0, 100, 100, 100, 300, 300]  # each piece at its document's place
    assert batch.ids.tolist() == [1] * 3 + [2] * 10 + [4] * 5  # the ids, in order, of the documents kept
    assert counts == {"too_short": 1, "truncated": 0, "truncated_tokens": 0, "split": 2, "extra_sequences": 3}
    assert batch.ids_file is None  # a document was dropped: not the staged file's ids any more
    kept, _ = limit_lengths(tokenized([3, 10]), LengthLimits(max_tokens=4))
    assert kept.ids_file == STAGED  # split alone keeps every id where it lies


def test_truncate_keeps_the_first_tokens():
    batch, counts = limit_lengths(tokenized([3, 10, 5]), LengthLimits(max_tokens=4, long_documents=TRUNCATE))
    assert batch.lengths.tolist() == [3, 4, 4] and batch.ids.tolist() == [1] * 3 + [2] * 4 + [3] * 4
    assert counts["truncated"] == 2 and counts["truncated_tokens"] == 7 and counts["extra_sequences"] == 0


def test_distinct_batches_are_limited_alike():
    digests = np.arange(6, dtype=np.uint64).reshape(3, 2)
    batch = DistinctBatch(digests, np.array([0, 1, 0], np.int8), np.array([0, 1, 1]), np.array([1, 6, 2]),
                          np.arange(9, dtype=np.uint16))
    limited, counts = limit_lengths(batch, LengthLimits(min_tokens=2, max_tokens=4))
    assert limited.lengths.tolist() == [4, 2, 2] and limited.splits.tolist() == [1, 1, 0]
    assert limited.digests.tolist() == [[2, 3], [2, 3], [4, 5]] and limited.ids.tolist() == list(range(1, 9))
    assert counts["too_short"] == 1 and counts["extra_sequences"] == 1


# ---------------------------------------------------------------------------------------------
# Real runs

MARK = "#"  # starts every document, and nothing else: a sequence starting with it starts a document


def documents(n=600):
    """Documents of 3 to ~900 bytes (the bytes tokenizer: one token per byte), each starting
    with MARK and its number."""
    return [f"{MARK}{i} " + "words, more words and then some. " * (i % 29) for i in range(n)]


def split_sequences(out, split):
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = np.asarray(g["encoded_tokens"][:]) >> 1, np.asarray(g["seq_starts"][:]).astype(np.int64)
    return [bytes((tokens[a:b] - 1).astype(np.uint8).tolist()).decode() for a, b in zip(starts[:-1], starts[1:])]


def rejoined(out, split):
    """The split's sequences, consecutive pieces joined: a document begins at each MARK."""
    docs = []
    for s in split_sequences(out, split):
        if s.startswith(MARK):
            docs.append(s)
        else:
            assert docs, "a piece before any document's first"
            docs[-1] += s
    return docs


BYTES = ["--tokenizer", "bytes", "--validation_fraction", "0.1"]


@pytest.mark.slow
def test_split_keeps_every_long_document_whole_in_order_and_in_one_split(tmp_path):
    texts = documents()
    write_jsonl(tmp_path / "in" / "a.jsonl", texts[::2])
    write_jsonl(tmp_path / "in" / "b.jsonl", texts[1::2])
    limits = ["--min_tokens", "20", "--max_tokens", "64"]
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in", *BYTES, *limits, "--output", out)
    assert verify.verify_dataset(str(out)) == []
    kept = sorted(t for t in texts if len(t.encode()) >= 20)
    pieces = {split: split_sequences(out, split) for split in ("train", "validation")}
    assert all(0 < len(p.encode()) <= 64 for ps in pieces.values() for p in ps)
    joined = {split: rejoined(out, split) for split in ("train", "validation")}
    assert sorted(joined["train"] + joined["validation"]) == kept  # each whole, once, its pieces side by side
    assert joined["validation"] and not set(joined["train"]) & set(joined["validation"])
    s = stats(out)
    long = [t for t in kept if len(t.encode()) > 64]
    assert s["too_short"] == len(texts) - len(kept) and s["split"] == len(long)
    assert s["extra_sequences"] == sum(-(-len(t.encode()) // 64) - 1 for t in long)
    assert s["train"]["sequences"] + s["validation"]["sequences"] == len(kept) + s["extra_sequences"]
    recorded = zarr.open_group(str(out), mode="r").attrs["document_lengths"]
    assert recorded == {"min_tokens": 20, "max_tokens": 64, "long_documents": "split"}
    # Deterministic: other shard counts and chunk sizes, the same arrays.
    again = tmp_path / "again.zarr"
    run_pipeline("--input", tmp_path / "in", *BYTES, *limits, "--output", again, "--num_shards", "7",
                 "--tokens_chunk_size", "100", "--seq_starts_chunk_size", "16")
    check_flat_tokens(again, "--compare", out)


@pytest.mark.slow
def test_truncate_keeps_each_document_s_first_tokens(tmp_path):
    texts = documents(300)
    write_jsonl(tmp_path / "in.jsonl", texts)
    out = tmp_path / "out.zarr"
    proc = run_pipeline("--input", tmp_path / "in.jsonl", *BYTES, "--max_tokens", "50", "--long_documents",
                        "truncate", "--output", out)
    got = sorted(split_sequences(out, "train") + split_sequences(out, "validation"))
    assert got == sorted(t.encode()[:50].decode() for t in texts)
    s = stats(out)
    assert s["truncated"] == sum(len(t.encode()) > 50 for t in texts)
    assert s["truncated_tokens"] == sum(max(0, len(t.encode()) - 50) for t in texts)
    assert f"{s['truncated']:,} truncated to --max_tokens" in proc.stdout


@pytest.mark.slow
def test_limits_with_dedup_and_a_mixture_keep_the_accounts(tmp_path):
    """Duplicates are whole texts (dedup first); a mixture weighs the tokens written; the
    commit's per-source accounts add up with the dropped and split documents."""
    texts = documents(800)
    write_jsonl(tmp_path / "web" / "a.jsonl", texts[:500] + texts[:40])  # 40 duplicates
    write_jsonl(tmp_path / "code" / "b.jsonl", texts[500:])
    (tmp_path / "mix.yaml").write_text(f"sources:\n  - {{name: web, input: {tmp_path / 'web'}, weight: 2}}\n"
                                       f"  - {{name: code, input: {tmp_path / 'code'}, weight: 1, max_epochs: 3}}\n")
    out = tmp_path / "out.zarr"
    run_pipeline("--mixture", tmp_path / "mix.yaml", "--dedup", "exact", *BYTES, "--min_tokens", "30",
                 "--max_tokens", "100", "--output", out)
    assert verify.verify_dataset(str(out)) == []
    s = stats(out)
    assert s["duplicates"] == 40 and s["too_short"] > 0 and s["extra_sequences"] > 0
    sources = zarr.open_group(str(out), mode="r").attrs["mixture"]["sources"]
    assert sum(x["too_short"] for x in sources) == s["too_short"]
    # A mixture repeats documents, each copy with its pieces side by side: every rejoined
    # document is one of the input's, whole.
    wanted = {t for t in texts if len(t.encode()) >= 30}
    for split in ("train", "validation"):
        assert set(rejoined(out, split)) <= wanted


@pytest.mark.slow
def test_limits_that_cannot_work_are_refused_at_launch(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    for extra, message in ((["--long_documents", "truncate"], "--long_documents truncate needs --max_tokens"),
                           (["--min_tokens", "10", "--max_tokens", "5"], "--min_tokens 10 is above --max_tokens 5"),
                           (["--max_tokens", "-1"], "must be >= 0")):
        line = refused(run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                                    *extra, check=False))
        assert message in line, line

