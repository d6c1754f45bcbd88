"""Deduplication across datasets (--dedup_against, issue 41): three "days" built from real text,
days 2 and 3 repeating earlier days' texts (some of them from day 1's validation split).

With --dedup_against, the three datasets together hold every text once, no text is in train
on one day and in validation on another, and each summary counts what it removed per earlier
dataset. The expected texts are computed here from what the test wrote, and the datasets are
decoded with the test's own tokenizer."""
import hashlib
import json
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import zarr
from tokenizers import Tokenizer

from flat_tokens.tools import verify
from tests.helpers import SAMPLE, refused, run_pipeline, stats, write_jsonl
from tests.test_resume import corpus, dataset_digest, job_args, kill_when, resume, shards_recorded
from flat_tokens.format.checksums import Damaged
from flat_tokens.format.index_files import BYTES_PER_DOCUMENT, INDEX_DIRECTORY, decode_index, decode_near, encode_index
from flat_tokens.format.report_files import document_at, read_report

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def sample_texts() -> list[str]:
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    return sorted({t for t in texts if t.strip()})


def decoded(out: Path, split: str, tokenizer) -> Counter:
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:] >> 1, g["seq_starts"][:]
    tok = Tokenizer.from_file(str(tokenizer))
    return Counter(tok.decode(tokens[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts[:-1], starts[1:]))


def build(day: Path, texts: list[str], tokenizer, *extra, check=True):
    write_jsonl(day.parent / "in" / f"{day.stem}.jsonl", texts)
    return run_pipeline("--input", day.parent / "in" / f"{day.stem}.jsonl", "--tokenizer", tokenizer,
                        "--output", day, "--dedup", "exact", "--validation_fraction", "0.2", "--num_shards", "3",
                        "--rejected_output", day.parent / f"{day.stem}.rejected", *extra, check=check)


@pytest.fixture(scope="module")
def days(tmp_path_factory, bpe_tokenizer):
    """Day 1: 150 texts. Day 2: 150 new ones and 10% of day 1's (half of them from its
    validation split). Day 3: 150 new ones, 10% of day 1's and 10% of day 2's."""
    root = tmp_path_factory.mktemp("days")
    texts = sample_texts()
    assert len(texts) >= 450
    one, two, three = texts[:150], texts[150:300], texts[300:450]
    build(root / "2024-06-01.zarr", one, bpe_tokenizer)
    held_out = sorted(decoded(root / "2024-06-01.zarr", "validation", bpe_tokenizer))
    assert len(held_out) >= 15
    trained = sorted(decoded(root / "2024-06-01.zarr", "train", bpe_tokenizer))
    repeats_2 = held_out[:8] + trained[:7]
    day_2 = two + repeats_2 + repeats_2[:3]  # and three copies twice
    build(root / "2024-06-02.zarr", day_2, bpe_tokenizer, "--dedup_against", root / "2024-06-01.zarr",
          "--dedup_report", root / "report-2")
    repeats_3 = held_out[8:15] + trained[7:15] + two[:10] + repeats_2[:5]
    day_3 = three + repeats_3
    proc = build(root / "2024-06-03.zarr", day_3, bpe_tokenizer, "--dedup_against", root / "*.zarr")
    return root, {"one": one, "two": day_2, "three": day_3, "repeats_2": repeats_2, "repeats_3": repeats_3,
                  "held_out": held_out}, proc


@pytest.mark.slow
def test_the_three_days_hold_every_text_once_and_in_one_split(days, bpe_tokenizer):
    root, t, _ = days
    seen = Counter()
    split_of = {}
    for day in ("2024-06-01", "2024-06-02", "2024-06-03"):
        for split in ("train", "validation"):
            got = decoded(root / f"{day}.zarr", split, bpe_tokenizer)
            seen.update(got)
            for text in got:
                assert split_of.setdefault(text, split) == split, f"{text[:40]!r} in two splits"
    assert set(seen) == set(t["one"]) | set(t["two"]) | set(t["three"])
    assert max(seen.values()) == 1
    # The earlier dataset's split wins: day 1's validation texts repeated later are still only there.
    day_1_valid = decoded(root / "2024-06-01.zarr", "validation", bpe_tokenizer)
    assert set(t["held_out"]) == set(day_1_valid)


@pytest.mark.slow
def test_the_summaries_count_the_removals_per_earlier_dataset(days):
    root, t, proc = days
    s2, s3 = stats(root / "2024-06-02.zarr"), stats(root / "2024-06-03.zarr")
    one = str(root / "2024-06-01.zarr")
    assert s2["dedup_against_by_dataset"] == {one: 15} and s2["dedup_against"] == 15
    assert s2["duplicates"] == 3  # the copies inside day 2 itself
    # Day 3: the glob matched day 1, day 2 and day 3 itself (left out). Day 1's texts that day 2
    # repeated are counted for day 1, the first dataset that holds them.
    assert s3["dedup_against_by_dataset"] == {one: 20, str(root / "2024-06-02.zarr"): 10}
    assert s3["dedup_against"] == 30 and s3["duplicates"] == 0
    assert "30 texts held by earlier datasets (removed)" in proc.stdout


@pytest.mark.slow
def test_each_dataset_carries_its_index_of_17_bytes_a_text(days):
    root, _, _ = days
    for day in ("2024-06-01", "2024-06-02", "2024-06-03"):
        out = root / f"{day}.zarr"
        s = stats(out)
        files = sorted((out / INDEX_DIRECTORY).iterdir())
        assert s["dedup_index"]["files"] == len(files) and s["dedup_index"]["bytes"] == sum(
            f.stat().st_size for f in files)
        indexed = [decode_index(f.read_bytes(), str(f)) for f in files]
        documents = sum(d.shape[0] for d, _ in indexed)
        assert documents == s["dedup_index"]["documents"] == s["train"]["sequences"] + s["validation"]["sequences"]
        assert sum(int(sp.sum()) for _, sp in indexed) == s["validation"]["sequences"]
        assert s["dedup_index"]["bytes"] <= BYTES_PER_DOCUMENT * documents + 20 * len(files)


def test_an_index_file_that_was_changed_is_refused_naming_it():
    import numpy as np
    data = bytearray(encode_index(np.array([[1, 2], [3, 4]], dtype=np.uint64), np.array([0, 1], dtype=np.int8)))
    digests, splits = decode_index(bytes(data), "x.bin")
    assert digests.tolist() == [[1, 2], [3, 4]] and splits.tolist() == [0, 1]
    data[10] ^= 1
    with pytest.raises(Damaged, match="x.bin"):
        decode_index(bytes(data), "x.bin")


@pytest.mark.slow
def test_refused_without_dedup_and_for_a_dataset_without_an_index(days, tmp_path, bpe_tokenizer):
    root, t, _ = days
    write_jsonl(tmp_path / "in.jsonl", t["three"][:20])
    common = ["--input", tmp_path / "in.jsonl", "--tokenizer", bpe_tokenizer]
    line = refused(run_pipeline(*common, "--output", tmp_path / "a.zarr", "--dedup_against",
                                root / "2024-06-01.zarr", check=False))
    assert "--dedup_against" in line and "needs --dedup exact or near" in line
    run_pipeline(*common, "--output", tmp_path / "plain.zarr")  # no --dedup: no index
    line = refused(run_pipeline(*common, "--output", tmp_path / "b.zarr", "--dedup", "exact", "--dedup_against",
                                tmp_path / "plain.zarr", check=False))
    assert "plain.zarr" in line and "has no dedup index" in line and "rebuild it with --dedup exact" in line
    line = refused(run_pipeline(*common, "--output", tmp_path / "c.zarr", "--dedup", "exact", "--dedup_against",
                                tmp_path / "missing.zarr", check=False))
    assert "missing.zarr" in line and "not a committed flat-tokens dataset" in line


def files_digest(out: Path) -> dict:
    """sha256 of the dataset's chunks and index files (attributes name the run)."""
    found = {}
    for base, _, names in os.walk(out):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), out)
            if rel.startswith(("train", "validation", INDEX_DIRECTORY)) and name not in (".zattrs", "zarr.json"):
                found[rel] = hashlib.sha256(Path(base, name).read_bytes()).hexdigest()
    return found


@pytest.mark.slow
def test_two_workers_write_the_same_bytes(days, tmp_path, bpe_tokenizer):
    root, t, _ = days
    out = tmp_path / "2024-06-03.zarr"
    write_jsonl(tmp_path / "in" / "day3.jsonl", t["three"])
    run_pipeline("--input", tmp_path / "in" / "day3.jsonl", "--tokenizer", bpe_tokenizer, "--output", out,
                 "--dedup", "exact", "--validation_fraction", "0.2", "--num_shards", "3",
                 "--dedup_against", root / "2024-06-01.zarr", "--dedup_against", root / "2024-06-02.zarr", *MULTI)
    assert files_digest(out) == files_digest(root / "2024-06-03.zarr")


@pytest.mark.slow
def test_the_report_names_the_earlier_dataset_as_kept(days):
    root, t, _ = days
    attrs = zarr.open_group(str(root / "2024-06-02.zarr"), mode="r").attrs
    rows = read_report(str(root / "report-2"), attrs["run_id"])
    assert len(rows) == 18 == attrs["stats"]["dedup_report_rows"]  # 15 texts day 1 holds, 3 of them twice
    assert {r["match"] for r in rows} == {"earlier"}
    assert {r["kept_file"] for r in rows} == {str(root / "2024-06-01.zarr")}
    removed = Counter(document_at(r["removed_file"], r["removed_offset"]) for r in rows)
    assert removed == Counter(t["repeats_2"] + t["repeats_2"][:3])


def killed_and_resumed(tmp_path, dedup: str):
    """An earlier dataset of two files, then a run deduplicated against it killed after two
    shards and resumed: (its output, an uninterrupted run's output, the earlier dataset)."""
    corpus(tmp_path / "in")  # 8 files of 500 distinct documents
    earlier = tmp_path / "earlier.zarr"
    run_pipeline("--input", tmp_path / "in" / "part-0.jsonl", "--input", tmp_path / "in" / "part-1.jsonl",
                 "--tokenizer", "bytes", "--dedup", dedup, "--output", earlier)
    args = job_args(tmp_path, "--dedup", dedup, "--dedup_against", earlier)
    ref = tmp_path / "ref.zarr"
    run_pipeline(*args, "--output", ref)
    out = tmp_path / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 2)
    resume(args, out, tmp_path / "summary.json")
    return out, ref, earlier


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_bytes_index_included(tmp_path):
    out, ref, earlier = killed_and_resumed(tmp_path, "exact")
    assert dataset_digest(out) == dataset_digest(ref)
    assert any(name.startswith(INDEX_DIRECTORY) for name in dataset_digest(out))
    assert stats(out)["dedup_against"] == 1000 and stats(out)["dedup_against_by_dataset"] == {str(earlier): 1000}


@pytest.mark.slow
def test_a_killed_near_run_resumes_to_the_same_bytes_near_index_included(tmp_path):
    out, ref, _ = killed_and_resumed(tmp_path, "near")
    assert dataset_digest(out) == dataset_digest(ref)
    assert any(name.startswith(f"{INDEX_DIRECTORY}/near-") for name in dataset_digest(out))
    assert stats(out)["dedup_against"] >= 1000 and verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_a_damaged_index_fails_verify_and_the_build_against_it(tmp_path):
    texts = sample_texts()
    write_jsonl(tmp_path / "a.jsonl", texts[:60])
    write_jsonl(tmp_path / "b.jsonl", texts[40:100])
    earlier = tmp_path / "a.zarr"
    run_pipeline("--input", tmp_path / "a.jsonl", "--tokenizer", "bytes", "--dedup", "exact", "--output", earlier)
    assert verify.verify_dataset(str(earlier)) == []
    damaged = sorted((earlier / INDEX_DIRECTORY).iterdir())[0]
    data = bytearray(damaged.read_bytes())
    data[20] ^= 1
    damaged.write_bytes(bytes(data))
    problems = verify.verify_dataset(str(earlier))
    assert len(problems) == 1 and damaged.name in problems[0] and "damaged" in problems[0]
    proc = run_pipeline("--input", tmp_path / "b.jsonl", "--tokenizer", "bytes", "--dedup", "exact",
                        "--dedup_against", earlier, "--output", tmp_path / "b.zarr", check=False)
    assert proc.returncode == 1 and damaged.name in proc.stderr and "damaged" in proc.stderr


@pytest.mark.slow
def test_index_files_in_each_other_s_place_are_refused_naming_both(tmp_path):
    """Each index file passes its own seal wherever it lies; the manifest (issue 37) binds it to
    its key, so two shards' files swapped fail verify and the build against them."""
    texts = sample_texts()
    write_jsonl(tmp_path / "a.jsonl", texts[:60])
    write_jsonl(tmp_path / "b.jsonl", texts[40:100])
    earlier = tmp_path / "a.zarr"
    run_pipeline("--input", tmp_path / "a.jsonl", "--tokenizer", "bytes", "--dedup", "exact", "--num_shards", "3",
                 "--output", earlier)
    files = sorted((earlier / INDEX_DIRECTORY).iterdir())  # one a dedup shard
    first, second = files[0].read_bytes(), files[1].read_bytes()
    assert first != second
    files[0].write_bytes(second)
    files[1].write_bytes(first)
    problems = verify.verify_dataset(str(earlier))
    assert any(f"{INDEX_DIRECTORY}/{files[0].name} does not match the manifest" in p
               and f"lists for {INDEX_DIRECTORY}/{files[1].name}" in p for p in problems), problems
    proc = run_pipeline("--input", tmp_path / "b.jsonl", "--tokenizer", "bytes", "--dedup", "exact",
                        "--dedup_against", earlier, "--output", tmp_path / "b.zarr", check=False)
    assert proc.returncode == 1 and "is not the file its dataset's manifest lists there" in proc.stderr, \
        proc.stderr[-3000:]
    assert files[0].name in proc.stderr or files[1].name in proc.stderr


@pytest.mark.slow
def test_with_dedup_near_an_earlier_dataset_without_a_near_index_is_refused(days, tmp_path, bpe_tokenizer):
    """Day 1 was built with --dedup exact: its index cannot find near-copies of its texts, and a
    build that said it removed them would not have."""
    root, t, _ = days
    write_jsonl(tmp_path / "d.jsonl", sample_texts()[450:470] + t["one"][:5])
    line = refused(run_pipeline("--input", tmp_path / "d.jsonl", "--tokenizer", bpe_tokenizer, "--dedup", "near",
                                "--dedup_against", root / "2024-06-01.zarr", "--output", tmp_path / "d.zarr",
                                check=False))
    assert "2024-06-01.zarr" in line and "has no near part" in line and "rebuild it with --dedup near" in line
    assert not (tmp_path / "d.zarr").exists()


# ---------------------------------------------------------------------------------------------
# --dedup near: near-copies across datasets

THRESHOLD = 0.8


def shingles(text: str, n: int = 5) -> set:
    """The text's word 5-grams, words lowercased runs of letters and digits: the test's own
    measure of near-copies, not the project's."""
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def near_copy(text: str, seed: int) -> str:
    """The text with one word in 100 misspelt (a letter added): Jaccard 0.85 or more for texts
    of 60 words or more."""
    words = list(re.finditer(r"\w+", text))
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(words)), max(1, len(words) // 100)), reverse=True)
    for i in chosen:
        text = text[:words[i].end()] + "q" + text[words[i].end():]
    return text


def distinct_texts(texts: list[str]) -> list[str]:
    """The texts less any that is alike (Jaccard 0.5 or more) to one before it: the sample
    holds a few near-copies of its own (docstrings of related functions)."""
    kept, kept_shingles = [], []
    for text in texts:
        own = shingles(text)
        if all(jaccard(own, other) < 0.5 for other in kept_shingles):
            kept.append(text)
            kept_shingles.append(own)
    return kept


def digest_hex(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def build_near(day: Path, texts: list[str], tokenizer, *extra, check=True):
    write_jsonl(day.parent / "in" / f"{day.stem}.jsonl", texts)
    return run_pipeline("--input", day.parent / "in" / f"{day.stem}.jsonl", "--tokenizer", tokenizer,
                        "--output", day, "--dedup", "near", "--validation_fraction", "0.2", "--num_shards", "3",
                        "--rejected_output", day.parent / f"{day.stem}.rejected", *extra, check=check)


@pytest.fixture(scope="module")
def near_days(tmp_path_factory, bpe_tokenizer):
    """Three days of 100 new texts each (of 60 words or more). Day 2 repeats 10 of day 1's
    exactly and has near-copies of 10 others (half of each from day 1's validation split);
    day 3 repeats 5 of day 1's and 5 of day 2's exactly, and has near-copies of 5 of day 1's
    (from its validation split) and 5 of day 2's."""
    root = tmp_path_factory.mktemp("near_days")
    texts = distinct_texts([t for t in sample_texts() if len(re.findall(r"\w+", t)) >= 60])
    assert len(texts) >= 300
    one, two, three = texts[:100], texts[100:200], texts[200:300]
    build_near(root / "2024-06-01.zarr", one, bpe_tokenizer)
    held_out = sorted(decoded(root / "2024-06-01.zarr", "validation", bpe_tokenizer))
    trained = sorted(decoded(root / "2024-06-01.zarr", "train", bpe_tokenizer))
    assert len(held_out) >= 15 and set(held_out) | set(trained) == set(one)
    exact_2 = held_out[:5] + trained[:5]
    originals_2 = held_out[5:10] + trained[5:10]
    near_2 = [near_copy(t, i) for i, t in enumerate(originals_2)]
    day_2 = two + exact_2 + near_2
    build_near(root / "2024-06-02.zarr", day_2, bpe_tokenizer, "--dedup_against", root / "2024-06-01.zarr",
               "--dedup_report", root / "report-2")
    exact_3 = trained[10:15] + two[:5]
    originals_3 = held_out[10:15] + two[5:10]
    near_3 = [near_copy(t, 100 + i) for i, t in enumerate(originals_3)]
    day_3 = three + exact_3 + near_3
    proc = build_near(root / "2024-06-03.zarr", day_3, bpe_tokenizer, "--dedup_against", root / "*.zarr")
    planted = list(zip(originals_2, near_2)) + list(zip(originals_3, near_3))
    return root, {"one": one, "two": two, "three": three, "day_2": day_2, "day_3": day_3, "near_2": near_2,
                  "originals_2": originals_2, "planted": planted}, proc


def day_texts(root: Path, tokenizer) -> dict:
    """{day: {split: Counter of its texts}}."""
    return {day: {split: decoded(root / f"{day}.zarr", split, tokenizer) for split in ("train", "validation")}
            for day in ("2024-06-01", "2024-06-02", "2024-06-03")}


@pytest.mark.slow
def test_near_days_the_blend_holds_every_text_once_in_one_split(near_days, bpe_tokenizer):
    root, t, _ = near_days
    for original, copy in t["planted"]:  # the test's near-copies are near-copies by its own measure
        assert jaccard(shingles(original), shingles(copy)) >= THRESHOLD
    seen, split_of = Counter(), {}
    for splits in day_texts(root, bpe_tokenizer).values():
        for split, got in splits.items():
            seen.update(got)
            for text in got:
                assert split_of.setdefault(text, split) == split, f"{text[:40]!r} in two splits"
    assert max(seen.values()) == 1
    # Every text once: each day's new texts; the exact repeats and near-copies of earlier texts are not there.
    assert set(seen) == set(t["one"]) | set(t["two"]) | set(t["three"])


@pytest.mark.slow
def test_near_days_no_near_copy_pair_across_days_survives(near_days, bpe_tokenizer):
    root, _, _ = near_days
    held = {day: [shingles(text) for split in splits.values() for text in split]
            for day, splits in day_texts(root, bpe_tokenizer).items()}
    days = sorted(held)
    worst = max(jaccard(a, b) for i, d in enumerate(days) for e in days[i + 1:] for a in held[d] for b in held[e])
    assert worst < THRESHOLD


@pytest.mark.slow
def test_near_days_summaries_count_exact_and_near_copies_per_earlier_dataset(near_days):
    root, _, proc = near_days
    one, two = str(root / "2024-06-01.zarr"), str(root / "2024-06-02.zarr")
    s2, s3 = stats(root / "2024-06-02.zarr"), stats(root / "2024-06-03.zarr")
    assert s2["dedup_against_by_dataset"] == {one: 20} and s2["dedup_against"] == 20
    assert s2["dedup_against_near_by_dataset"] == {one: 10} and s2["dedup_against_near"] == 10
    assert s3["dedup_against_by_dataset"] == {one: 10, two: 10} and s3["dedup_against"] == 20
    assert s3["dedup_against_near_by_dataset"] == {one: 5, two: 5}
    for s in (s2, s3):
        assert s["near_duplicates"] == 0 and s["duplicates"] == 0
        assert s["train"]["sequences"] + s["validation"]["sequences"] == 100
    assert "20 texts held by earlier datasets (removed)" in proc.stdout


@pytest.mark.slow
def test_near_days_report_names_the_earlier_text_of_each_near_copy(near_days):
    root, t, _ = near_days
    attrs = zarr.open_group(str(root / "2024-06-02.zarr"), mode="r").attrs
    rows = read_report(str(root / "report-2"), attrs["run_id"])
    assert len(rows) == 20 == attrs["stats"]["dedup_report_rows"]
    near = [r for r in rows if r["match"] == "earlier_near"]
    assert len(near) == 10 and {r["kept_file"] for r in near} == {str(root / "2024-06-01.zarr")}
    original_of = {copy: original for original, copy in zip(t["originals_2"], t["near_2"])}
    for r in near:
        copy = document_at(r["removed_file"], r["removed_offset"])
        assert r["kept_digest"] == digest_hex(original_of[copy]) and r["removed_digest"] == digest_hex(copy)
        assert THRESHOLD - 0.15 <= r["estimated_similarity"] <= 1 and r["similarity"] is None
    assert sum(r["match"] == "earlier" for r in rows) == 10


@pytest.mark.slow
def test_near_days_index_is_64_bytes_a_text_and_verified(near_days):
    root, _, _ = near_days
    for day in ("2024-06-01", "2024-06-02", "2024-06-03"):
        out = root / f"{day}.zarr"
        s = stats(out)["dedup_index"]
        near_files = sorted((out / INDEX_DIRECTORY).glob("near-*.bin"))
        assert s["near"]["files"] == len(near_files) == s["files"]
        keys = [decode_near(f.read_bytes(), str(f))[0] for f in near_files]
        assert sum(k.shape[0] for k in keys) == s["documents"] == 100
        assert (s["bytes"] + s["near"]["bytes"] - 2 * 32 * s["files"]) / s["documents"] <= 64
        assert verify.verify_dataset(str(out)) == []
    damaged = sorted((root / "2024-06-01.zarr" / INDEX_DIRECTORY).glob("near-*.bin"))[0]
    data = damaged.read_bytes()
    try:
        damaged.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
        problems = verify.verify_dataset(str(root / "2024-06-01.zarr"))
        assert len(problems) == 1 and damaged.name in problems[0]
    finally:
        damaged.write_bytes(data)


@pytest.mark.slow
def test_near_days_two_workers_write_the_same_bytes(near_days, tmp_path, bpe_tokenizer):
    root, t, _ = near_days
    out = tmp_path / "2024-06-03.zarr"
    write_jsonl(tmp_path / "in" / "day3.jsonl", t["day_3"])
    run_pipeline("--input", tmp_path / "in" / "day3.jsonl", "--tokenizer", bpe_tokenizer, "--output", out,
                 "--dedup", "near", "--validation_fraction", "0.2", "--num_shards", "3",
                 "--dedup_against", root / "2024-06-01.zarr", "--dedup_against", root / "2024-06-02.zarr", *MULTI)
    assert files_digest(out) == files_digest(root / "2024-06-03.zarr")


def test_near_keys_of_a_near_copy_share_a_band_and_agree_on_the_sketch():
    """A text and its near-copy (J about 0.9) share band keys and pass the sketch test; two
    unrelated texts share none; a text too short for a shingle has no keys."""
    import numpy as np
    from transforms.tokenize.characters import BatchText
    from transforms.tokenize.minhash import MinHashSettings, batch_signatures
    from transforms.tokenize.near_index import SKETCH_BITS, needed_bits, near_keys
    texts = [t for t in sample_texts() if len(t.split()) >= 100][:2]
    docs = [texts[0], near_copy(texts[0], 1), texts[1], "too short"]
    keys, sketches = near_keys(batch_signatures(MinHashSettings(), BatchText.of(docs), None, np.zeros(4, np.int64)))
    assert np.intersect1d(keys[0], keys[1]).size and not np.intersect1d(keys[0], keys[2]).size
    agree = SKETCH_BITS - np.unpackbits(sketches[0] ^ sketches[1]).sum()
    assert agree >= needed_bits(THRESHOLD, 256, 2.0) > SKETCH_BITS - np.unpackbits(sketches[0] ^ sketches[2]).sum()
    assert not keys[3].any() and not sketches[3].any()


@pytest.mark.slow
def test_a_mixture_deduplicated_against_earlier_days_counts_each_source(near_days, tmp_path, bpe_tokenizer):
    """--mixture with --dedup_against: the texts held by earlier datasets (exactly, or as
    near-copies) are removed and credited to the source of their kept copy, and the per-source
    accounts add up (the commit checks them)."""
    root, t, _ = near_days
    fresh = [x for x in sample_texts() if len(re.findall(r"\w+", x)) < 60][:80]
    one = t["one"]
    a = fresh[:40] + one[20:25] + [near_copy(x, 200 + i) for i, x in enumerate(one[25:30])]
    b = fresh[40:] + t["two"][20:23]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    (tmp_path / "mix.json").write_text(json.dumps({"sources": [
        {"name": "a", "input": "a.jsonl", "weight": 1, "max_epochs": 2},
        {"name": "b", "input": "b.jsonl", "weight": 1, "max_epochs": 2}]}))
    out = tmp_path / "mixed.zarr"
    run_pipeline("--mixture", tmp_path / "mix.json", "--dedup", "near", "--tokenizer", bpe_tokenizer,
                 "--output", out, "--validation_fraction", "0.1", "--dedup_against", root / "*.zarr")
    s = stats(out)
    assert s["dedup_against_by_dataset"] == {str(root / "2024-06-01.zarr"): 10, str(root / "2024-06-02.zarr"): 3,
                                             str(root / "2024-06-03.zarr"): 0}
    assert s["dedup_against_near"] == 5
    sources = {x["name"]: x for x in zarr.open_group(str(out), mode="r").attrs["mixture"]["sources"]}
    assert sources["a"]["dedup_against"] == 10 and sources["b"]["dedup_against"] == 3
    got = set(decoded(out, "train", bpe_tokenizer)) | set(decoded(out, "validation", bpe_tokenizer))
    assert got <= set(fresh) and not got & (set(one) | set(t["two"]))
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_near_copies_of_each_other_and_of_an_earlier_text_are_all_removed_as_held_earlier(near_days, tmp_path,
                                                                                           bpe_tokenizer):
    """Two near-copies of each other in a new build, both near-copies of a text day 1 holds:
    both are removed as held by day 1. Inside the build one would be kept for the other, and
    removing it as held earlier would leave the other removed for a text that is not kept; a
    text held earlier is not kept when its cluster chooses (near_dedup.keep_greedily)."""
    root, t, _ = near_days
    def alike(x, y):
        return jaccard(shingles(x), shingles(y)) >= THRESHOLD + 0.05

    # A day 1 text whose copy and copy of the copy are all near-copies of each other, by the test's measure.
    original, first, second = next((o, f, near_copy(f, 301)) for o in t["one"][40:] for f in [near_copy(o, 300)]
                                   if alike(o, f) and alike(o, near_copy(f, 301)) and alike(f, near_copy(f, 301)))
    fresh = [x for x in sample_texts() if len(re.findall(r"\w+", x)) < 60][:30]
    write_jsonl(tmp_path / "in.jsonl", fresh + [first, second])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "in.jsonl", "--tokenizer", bpe_tokenizer, "--dedup", "near", "--output", out,
                 "--dedup_against", root / "2024-06-01.zarr")
    s = stats(out)
    assert s["dedup_against_near"] == 2 and s["near_duplicates"] == 0
    got = set(decoded(out, "train", bpe_tokenizer)) | set(decoded(out, "validation", bpe_tokenizer))
    assert first not in got and second not in got


def test_keep_greedily_does_not_keep_a_member_held_earlier():
    """A member held by an earlier dataset is not kept, so the worse member that is a near-copy
    of it only is kept; without it held, that member is removed for it."""
    import numpy as np
    from transforms.records import Nodes
    from transforms.tokenize.near_dedup import keep_greedily
    ids = np.array([10, 11, 12], dtype=np.uint64)  # in rank order: 10 best
    members = Nodes(ids, np.zeros((3, 2), np.uint64), np.arange(3, dtype=np.uint64), np.zeros(3, np.int8),
                    np.zeros((3, 4), np.uint16))
    a, b = np.array([10, 11], dtype=np.uint64), np.array([11, 12], dtype=np.uint64)  # 10 ~ 11 ~ 12
    assert keep_greedily(members, a, b).tolist() == [0, 0, 2]
    assert keep_greedily(members, a, b, np.array([True, False, False])).tolist() == [0, 1, 1]
