"""Near-duplicate removal (--dedup near), measured against brute force.

Near-copies are planted in real text (the sample's docstrings): each picked document gets up
to three variants with words replaced, inserted or deleted, a header line added or its lines
re-wrapped, so their Jaccard similarities to it spread over 0.5 to 1. The Jaccard similarity
of every pair of the corpus is then computed exactly, here, from word 5-gram sets (words as
docs/dedup.md defines them; nothing of the pipeline's code is used), and the
pipeline's output is scored against it: recall on the pairs at or above threshold + 0.05,
precision of the removals (a removed text has a kept text at or above threshold - 0.1), and
no pair at or above the threshold across train and validation."""
import json
import random
import re
import unicodedata
from collections import Counter, defaultdict, deque
from itertools import combinations

import numpy as np
import pytest
import zarr

from flat_tokens.format.checksums import Damaged
from tests.helpers import SAMPLE, check_flat_tokens, refused, run_pipeline, write_jsonl
from tests.test_resume import dataset_digest, kill_when, resume, staged_now, units_staged
from transforms.tokenize import minhash, words
from transforms.tokenize.characters import BatchText
from transforms.tokenize.near_dedup import candidate_pairs, components, large_star, small_star

THRESHOLD = 0.8
MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
def words_of(text: str) -> list[str]:
    """Words as docs/dedup.md defines them: NFKC, case-folded, NFKD without combining marks,
    then runs of letters, digits and `_` (character by character here, not by a regex)."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    kept = "".join(c for c in folded if not unicodedata.category(c).startswith("M"))
    return "".join(c if c.isalnum() or c == "_" else " " for c in kept).split()


def shingles(text: str, n: int = 5) -> set:
    words = words_of(text)
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def all_pairs_jaccard(texts: list[str]) -> dict:
    """(i, j) -> exact Jaccard similarity, for every pair i < j sharing a shingle (the others: 0)."""
    sets = [shingles(t) for t in texts]
    holders = defaultdict(list)
    for i, s in enumerate(sets):
        for g in s:
            holders[g].append(i)
    shared = Counter()
    for docs in holders.values():
        shared.update(combinations(docs, 2))
    return {(i, j): n / (len(sets[i]) + len(sets[j]) - n) for (i, j), n in shared.items()}


def edited(text: str, rng: random.Random, rate: float) -> str:
    """`text` with about `rate` of its words replaced, dropped or doubled, and maybe a header
    line added or its lines re-wrapped (which changes no word 5-gram)."""
    words = text.split(" ")
    out = []
    for w in words:
        r = rng.random()
        if r < rate / 3:
            out.append(f"edit{rng.randrange(10**6)}")
        elif r < 2 * rate / 3:
            continue
        elif r < rate:
            out += [w, w]
        else:
            out.append(w)
    variant = " ".join(out)
    if rng.random() < 0.3:
        variant = f"Mirror {rng.randrange(1000)} of this page\n\n" + variant
    if rng.random() < 0.3:
        variant = variant.replace("\n", " ").replace(". ", ".\n")
    return variant


# Latin letters to Cyrillic ones (o to ё): the sample's English texts as texts of another script
CYRILLIC = str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                         "абцдефгхийклмнёпярстувшщызАБЦДЕФГХИЙКЛМНЁПЯРСТУВШЩЫЗ")


def folded_variant(text: str, rng: random.Random) -> str:
    """A copy that differs only in what the words fold away: case (of any script), accents
    (ё for е, é for e) or whitespace."""
    kind = rng.randrange(4)
    if kind == 0:
        return text.upper()
    if kind == 1:
        return text.replace("ё", "е").replace("Ё", "Е").replace("e", "é")
    if kind == 2:
        return text.replace(" ", "  ").replace("\n", " \n\n\n")
    return text.title()


def planted_corpus(seed: int = 7) -> list[str]:
    """The sample's texts (60 of them in Cyrillic letters), 1 to 3 near-copies of 220 of the
    longer ones, 60 copies that differ in case, accents or whitespace, shuffled."""
    rng = random.Random(seed)
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    texts = [t.translate(CYRILLIC) if i % 25 == 0 else t for i, t in enumerate(texts)]
    longer = [t for t in texts if len(shingles(t)) >= 60]
    originals = rng.sample(longer, 220)
    # Most variants close to their original (Jaccard 0.75 to 1: many in the borderline band
    # 0.80-0.85), a quarter further (0.4 to 0.8).
    variants = [edited(t, rng, rng.uniform(0, 0.03) if rng.random() < 0.75 else rng.uniform(0.03, 0.1))
                for t in originals for _ in range(rng.choice((1, 1, 2, 3)))]
    cyrillic = [t for t in longer if not t.isascii()]
    variants += [folded_variant(t, rng) for t in rng.sample(longer, 30) + rng.sample(cyrillic, min(30, len(cyrillic)))]
    corpus = texts + variants
    rng.shuffle(corpus)
    return corpus


def written_texts(out, split: str) -> list[str]:
    """The texts of a split's sequences (the bytes tokenizer: id = byte + 1)."""
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = (g["encoded_tokens"][:] >> 1) - 1, g["seq_starts"][:]
    return [bytes(tokens[a:b].astype(np.uint8)).decode("utf-8") for a, b in zip(starts[:-1], starts[1:])]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("near")
    corpus = planted_corpus()
    write_jsonl(root / "in" / "a.jsonl", corpus[:len(corpus) // 2])
    write_jsonl(root / "in" / "b.jsonl", corpus[len(corpus) // 2:])
    args = ["--input", root / "in", "--tokenizer", "bytes", "--dedup", "near", "--validation_fraction", "0.3",
            "--seed", "3", "--rejected_output", root / "rejected"]
    out = root / "out.zarr"
    run_pipeline(*args, "--output", out, "--dedup_report", root / "report")
    return root, corpus, args, out


@pytest.mark.slow
def test_near_copies_are_found_as_brute_force_jaccard_says(planted):
    _, corpus, _, out = planted
    texts = sorted({t for t in corpus if t})  # what exact dedup leaves
    jaccard = all_pairs_jaccard(texts)
    train, validation = written_texts(out, "train"), written_texts(out, "validation")
    kept = set(train) | set(validation)
    assert len(kept) == len(train) + len(validation) and kept <= set(texts)
    index = {t: i for i, t in enumerate(texts)}

    def recall(low, high=1.01):
        pairs = [(i, j) for (i, j), s in jaccard.items() if low <= s < high]
        return sum(not (texts[i] in kept and texts[j] in kept) for i, j in pairs) / len(pairs), len(pairs)

    (at_threshold, pairs), (borderline, border_pairs) = recall(THRESHOLD), recall(THRESHOLD, THRESHOLD + 0.05)
    assert pairs >= 300 and border_pairs >= 50, "the planted variants make enough near-copy pairs to measure"
    assert at_threshold >= 0.98 and borderline >= 0.98, (at_threshold, borderline)
    folded = [(i, j) for (i, j), s in jaccard.items() if s == 1.0 and texts[i].casefold() != texts[j].casefold()]
    assert len(folded) >= 30 and all(not (texts[i] in kept and texts[j] in kept) for i, j in folded)
    assert sum(not t.isascii() for t in kept) >= 40, "Cyrillic texts are kept, and some of them cluster"

    near = defaultdict(list)
    for (i, j), s in jaccard.items():
        near[i].append((j, s))
        near[j].append((i, s))
    removed = [index[t] for t in texts if t not in kept]
    justified = [any(texts[j] in kept and s >= THRESHOLD - 0.1 for j, s in near[r]) for r in removed]
    precision = sum(justified) / len(removed)
    assert precision >= 0.98, precision  # at most 2% of the removals without a kept copy at J >= 0.7

    train_ids, validation_ids = {index[t] for t in train}, {index[t] for t in validation}
    across = [(i, j) for (i, j), s in jaccard.items() if s >= THRESHOLD
              and ({i, j} & train_ids) and ({i, j} & validation_ids)]
    assert across == []
    assert 0.2 < len(validation) / len(kept) < 0.4

    attrs = zarr.open_group(str(out), mode="r").attrs
    assert attrs["dedup"] == "near" and attrs["near_dedup"] == {
        "threshold": THRESHOLD, "shingle": "words", "shingle_size": 5, "hashes": 256, "bands": 32}
    stats = attrs["stats"]
    assert stats["near_duplicates"] == len(removed) > 100
    assert stats["documents"] == stats["empty"] + stats["duplicates"] + stats["near_duplicates"] + len(kept)
    near_stats = stats["near_dedup"]
    assert near_stats["removed"] == len(removed)
    assert near_stats["clustered_texts"] - near_stats["clusters"] == len(removed)
    assert near_stats["verified_pairs"] <= near_stats["candidate_pairs"]
    assert 0 <= near_stats["estimated_false_positive_rate"] <= 1 - precision + 0.02


@pytest.mark.slow
def test_the_report_lists_exactly_the_removed_documents(planted):
    """One row per removed copy (exact and near), each naming where it was read and a kept
    text that is in the output; the rows add up to the stats; near rows at Jaccard >= 0.7."""
    from flat_tokens.format.report_files import document_at, read_report
    root, corpus, _, out = planted
    attrs = zarr.open_group(str(out), mode="r").attrs
    rows = read_report(str(root / "report"), attrs["run_id"])
    stats = attrs["stats"]
    assert len(rows) == stats["duplicates"] + stats["near_duplicates"] == stats["dedup_report_rows"] > 200
    kept = set(written_texts(out, "train")) | set(written_texts(out, "validation"))
    removed = [document_at(r["removed_file"], r["removed_offset"]) for r in rows]
    matched = [document_at(r["kept_file"], r["kept_offset"]) for r in rows]
    assert len({(r["removed_file"], r["removed_offset"]) for r in rows}) == len(rows), "each copy once"
    # Every input document is written once or listed once: the removed copies are the rest.
    assert Counter(removed) == Counter(t for t in corpus if t) - Counter(kept)
    assert all(k in kept for k in matched), "every row names a kept text that is in the output"
    for r, text, k in zip(rows, removed, matched):
        assert (r["match"] == "exact") == (text == k) and (text in kept) == (r["match"] == "exact")
    near = [(text, k) for r, text, k in zip(rows, removed, matched) if r["match"] == "near"]
    similar = [len(shingles(a) & shingles(b)) / len(shingles(a) | shingles(b)) >= THRESHOLD - 0.1 for a, b in near]
    # Every copy of a text removed as a near-copy names the kept near-copy (its own exact
    # copies, counted as duplicates, too).
    assert len({text for text, _ in near}) == stats["near_duplicates"] and sum(similar) >= 0.98 * len(near)
    # `similarity`: the exact Jaccard similarity of the two texts' shingle sets (computed here
    # with this test's own words), known for every near-copy with the bytes tokenizer.
    exact = [jaccard_of(text, k) for text, k in near]
    got = [r["similarity"] for r in rows if r["match"] == "near"]
    assert None not in got and np.allclose(got, exact, rtol=0, atol=1e-6), [
        (g, e) for g, e in zip(got, exact) if g is None or abs(g - e) > 1e-6][:5]
    assert all(r["similarity"] == 1.0 for r in rows if r["match"] == "exact")


def jaccard_of(a: str, b: str, shingles_of=shingles) -> float:
    sa, sb = shingles_of(a), shingles_of(b)
    return len(sa & sb) / len(sa | sb)


@pytest.mark.slow
def test_the_output_is_the_same_on_two_worker_processes_and_other_shards(planted):
    """And the dedup report holds the same rows (in 5 files instead of 1)."""
    from flat_tokens.format.report_files import read_report
    root, _, args, out = planted
    other = root / "multi.zarr"
    run_pipeline(*args, "--output", other, "--num_shards", "5", "--batch_documents", "100", *MULTI,
                 "--dedup_report", root / "multi-report.parquet")
    check_flat_tokens(other, "--compare", out)
    rows = [read_report(str(r), zarr.open_group(str(o), mode="r").attrs["run_id"])
            for r, o in ((root / "report", out), (root / "multi-report.parquet", other))]
    assert len(list((root / "multi-report.parquet").iterdir())) > 1
    key = lambda r: (r["removed_file"], r["removed_offset"])  # noqa: E731
    assert sorted(rows[0], key=key) == sorted(rows[1], key=key) and len(rows[0]) > 200


@pytest.mark.slow
def test_with_a_mixture_near_copies_are_counted_per_source_and_kept_from_the_first(tmp_path):
    """Near-copies of the first source's texts in the second: the first's are kept (the
    earliest input), the removed ones are credited to the second, and every source's
    documents add up at commit (documents = empty + duplicates + near_duplicates + written)."""
    rng = random.Random(2)
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-2.jsonl", encoding="utf-8")]
    longer = [t for t in texts[:300] if len(shingles(t)) >= 100][:60]
    copies = [edited(t, rng, 0.01) for t in longer]
    copies = [c for c, t in zip(copies, longer) if c != t and len(shingles(c) & shingles(t))
              / len(shingles(c) | shingles(t)) >= THRESHOLD + 0.05]
    write_jsonl(tmp_path / "first.jsonl", texts[:300])
    write_jsonl(tmp_path / "second.jsonl", texts[300:] + copies)
    (tmp_path / "mix.json").write_text(json.dumps({"sources": [
        {"name": "first", "input": "first.jsonl", "weight": 1, "max_epochs": 2},
        {"name": "second", "input": "second.jsonl", "weight": 1, "max_epochs": 2}]}))
    out = tmp_path / "out.zarr"
    run_pipeline("--mixture", tmp_path / "mix.json", "--dedup", "near", "--tokenizer", "bytes", "--output", out,
                 "--validation_fraction", "0.1")
    written = set(written_texts(out, "train")) | set(written_texts(out, "validation"))
    assert len(copies) >= 30 and not set(copies) & written and set(longer) <= written
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    by_source = stats["near_duplicates_by_source"]
    assert sum(by_source.values()) == stats["near_duplicates"] and by_source["second"] >= len(copies)
    sources = zarr.open_group(str(out), mode="r").attrs["mixture"]["sources"]
    assert [s["near_duplicates"] for s in sources] == [by_source["first"], by_source["second"]]


@pytest.mark.slow
def test_a_portable_runners_workers_make_the_same_bytes(planted, tmp_path):
    """On an EXTERNAL worker pool (no disk shared with the launcher: signatures travel in the
    node parts, ids in the dedup parts) the output is the in-process run's."""
    from tests.beam_services import portable_services
    root, _, args, out = planted
    with portable_services(tmp_path / "services") as services:
        run_pipeline(*args, "--output", tmp_path / "portable.zarr", *services.pipeline_args, env=services.env,
                     timeout=600)
    check_flat_tokens(tmp_path / "portable.zarr", "--compare", out)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["units staged", "shards written", "units staged, a signature file damaged"])
def test_a_killed_run_resumes_to_the_same_bytes(planted, tmp_path, moment):
    """Killed, then rerun: the same bytes. A local run stages each batch's signatures in a file
    beside it (near dedup's node parts name that file); one damaged since is found by its
    checksum, and its unit redone."""
    from transforms import staging

    root, _, args, ref = planted
    args = [*args, "--batch_documents", "40", "--read_range_mb", "1", "--num_shards", "4",
            "--tokens_chunk_size", "4096"]
    run_pipeline(*args, "--output", tmp_path / "ref.zarr")
    out = tmp_path / "out.zarr"
    if moment.startswith("units staged"):
        kill_when(args, out, lambda: units_staged(out) >= 1)
    else:
        kill_when(args, out, lambda: len(list((out / ".flat-tokens-staging").glob("shards/*/*.rec"))) >= 2)
    units, chunks = staged_now(out)
    damaged = moment.endswith("damaged")
    if damaged:
        (unit, _), *_ = staging.StagingArea(str(out)).listing().units.items()
        signatures = sorted((out / ".flat-tokens-staging" / "units" / unit).glob(f"*{staging.SIGNATURES}"))
        data = bytearray(signatures[0].read_bytes())
        data[len(data) // 2] ^= 0x10
        signatures[0].write_bytes(bytes(data))
    reused = resume(args, out, tmp_path / "summary.json")
    assert reused["input_units"] == units - damaged and units
    assert reused["damaged"]["staged_units"] == damaged
    assert dataset_digest(out) == dataset_digest(tmp_path / "ref.zarr")


# ---------------------------------------------------------------------------------------------
# the parts, without a runner

@pytest.mark.parametrize("shingle", [minhash.WORDS, minhash.TOKENS])
def test_the_feature_memo_gives_what_computing_gives_whatever_it_holds(shingle):
    """Batches that repeat texts (within a batch and across batches), through a memo small
    enough to drop texts between their copies: every batch's signatures and defects are
    those computed without it, and a text met again while held is not computed again."""
    from transforms.tokenize import near_features
    from transforms.tokenize.dedup import digests_of
    rng = random.Random(11)
    pool = [t for t in tricky_texts(60, 5) + [RUSSIAN, RUSSIAN.upper()] + MULTILINGUAL if t.strip()]
    settings = minhash.MinHashSettings(shingle=shingle)
    memo = near_features.FeatureMemo(settings, capacity=16)
    computed = []
    real = near_features.computed

    def counting(settings_, texts, *rest):
        computed.extend(texts)
        return real(settings_, texts, *rest)

    near_features.computed = counting
    held = deque(maxlen=memo.capacity)  # the texts the memo holds, oldest first
    try:
        for _ in range(12):
            texts = [rng.choice(pool) for _ in range(rng.randrange(1, 30))]
            encoded = [t.encode() for t in texts]
            ids = [np.frombuffer(e, dtype=np.uint8).astype(np.uint32) for e in encoded]  # a byte tokenizer's ids
            lengths = np.array([i.size for i in ids], dtype=np.int64)
            args = (settings, texts, encoded, digests_of(encoded), np.concatenate(ids), lengths)
            new = [t for t in dict.fromkeys(texts) if t not in held]
            before = len(computed)
            with_memo = near_features.batch_features(*args, memo=memo)
            assert computed[before:] == new
            without = near_features.batch_features(*args)
            assert all(np.array_equal(a, b) for a, b in zip(with_memo, without))
            held.extend(new)
    finally:
        near_features.computed = real


def test_first_copies_name_each_texts_first_document_and_every_documents_text():
    """batch_features computes each text of a batch once, from its first copy: first_copies
    gives those, in document order, and where each document's text is among them (as a dict
    of first appearances would)."""
    from transforms.tokenize.near_features import first_copies
    rng = np.random.default_rng(2)
    for n in (0, 1, 2, 7, 300):
        pool = rng.integers(0, 2**64, (max(1, n // 3), 2), dtype=np.uint64)
        pool[:, 0] = pool[0, 0]  # texts that differ only in the digest's second half
        digests = pool[rng.integers(0, len(pool), n)]
        rows = [tuple(d) for d in digests.tolist()]
        firsts = {}
        for i, row in enumerate(rows):
            firsts.setdefault(row, i)
        first, copy_of = first_copies(digests)
        assert first.tolist() == list(firsts.values())
        assert [rows[first[j]] for j in copy_of.tolist()] == rows


def _features_args(settings, texts):
    from transforms.tokenize.dedup import digests_of
    encoded = [t.encode() for t in texts]
    ids = [np.frombuffer(e, dtype=np.uint8).astype(np.uint32) for e in encoded]  # a byte tokenizer's ids
    return (settings, texts, encoded, digests_of(encoded), np.concatenate(ids),
            np.array([i.size for i in ids], dtype=np.int64))


def _put_features(path, texts):
    """In another process: compute the texts' features through a shared memo at `path`."""
    from transforms.tokenize import near_features
    settings = minhash.MinHashSettings()
    near_features.batch_features(*_features_args(settings, texts), memo=near_features.SharedFeatureMemo(settings, path))


def test_worker_processes_share_their_near_features_and_a_torn_row_is_a_miss(tmp_path):
    """What one process computed, another finds in the shared memo (the same features as
    computing them); a row whose bytes changed after its write (a torn write, a crash) is not
    found, wherever the change is, and its text is computed again."""
    import multiprocessing

    from transforms.tokenize import near_features
    path = str(tmp_path / "near-features.bin")
    texts = [t for t in dict.fromkeys(tricky_texts(40, 9) + [RUSSIAN] + MULTILINGUAL) if t.strip()]
    settings = minhash.MinHashSettings()
    writer = multiprocessing.get_context("spawn").Process(target=_put_features, args=(path, texts))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    memo = near_features.SharedFeatureMemo(settings, path)
    digests = np.ascontiguousarray(_features_args(settings, texts)[3], dtype="<u8")
    keys = [d.tobytes() for d in digests]
    found, signatures, defects = memo.get(digests)
    expected = near_features.computed(*_features_args(settings, texts)[:3], None, None)
    assert found.all() and np.array_equal(signatures, expected[0]) and np.array_equal(defects, expected[1])
    # Change one byte of some texts' rows, each at another place in the row.
    table = np.memmap(path, dtype=np.uint8, mode="r+")
    row_bytes = memo._row.itemsize
    slots = [memo._sets_of(np.frombuffer(k, dtype="<u8")[None])[0] for k in keys]
    torn = list(range(0, len(keys), 3))
    for n, i in enumerate(torn):
        row = next(r for r in slots[i].tolist() if bytes(table[r * row_bytes:r * row_bytes + 16]) == keys[i])
        table[row * row_bytes + (n * 37) % row_bytes] ^= 0x10
    table.flush()
    found, _, _ = memo.get(digests)
    assert not found[torn].any() and found[[i for i in range(len(keys)) if i not in torn]].all()
    computed = []
    real = near_features.computed
    near_features.computed = lambda s, t, *rest: computed.extend(t) or real(s, t, *rest)
    try:
        with_memo = near_features.batch_features(*_features_args(settings, texts), memo=memo)
    finally:
        near_features.computed = real
    assert computed == [texts[i] for i in torn]
    assert all(np.array_equal(a, b) for a, b in zip(with_memo, expected))


def test_signatures_estimate_jaccard_within_their_standard_deviation():
    rng = random.Random(1)
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")]
    errors = []
    for t in [t for t in texts if len(shingles(t)) >= 100][:120]:
        v = edited(t, rng, rng.uniform(0, 0.1))
        a, b = shingles(t), shingles(v)
        exact = len(a & b) / len(a | b)
        s = minhash.batch_signatures(minhash.MinHashSettings(), BatchText.of([t, v]), None, None)
        errors.append(minhash.estimated_jaccard(s[:1], s[1:])[0] - exact)
    errors = np.array(errors)
    assert abs(errors.mean()) < 0.01 and errors.std() < 0.04, (errors.mean(), errors.std())


RUSSIAN = ("Ещё вчера вечером мы шли по берегу реки, и ёлки стояли тёмной стеной; её голос звучал над водой. "
           "Утром туман поднялся над лугом, и всё вокруг казалось новым: дорога, мост, старый дом у леса, "
           "где жила наша семья. Мы пили чай на веранде, читали письма и говорили о том, что будет дальше, "
           "пока солнце не поднялось высоко над деревьями и не стало жарко.")


@pytest.mark.parametrize("variant", [str.upper, lambda t: t.replace("ё", "е").replace("Ё", "Е"),
                                     lambda t: t.upper().replace("Ё", "Е"), lambda t: "  ".join(t.split()),
                                     lambda t: unicodedata.normalize("NFD", t)],
                         ids=["upper", "yo", "upper-yo", "spaces", "nfd"])
def test_case_accents_and_spaces_of_any_script_change_no_shingle(variant):
    """A 60-word Russian text and its variants: the same shingles, so Jaccard 1 (their
    signatures agree on every bin), by the pipeline's words as by the definition's."""
    assert len(RUSSIAN.split()) >= 60
    other = variant(RUSSIAN)
    assert other != RUSSIAN and shingles(other) == shingles(RUSSIAN) and len(shingles(RUSSIAN)) >= 55
    s = minhash.batch_signatures(minhash.MinHashSettings(), BatchText.of([RUSSIAN, other]), None, None)
    assert minhash.signed(s).all() and minhash.estimated_jaccard(s[:1], s[1:])[0] == 1.0


MULTILINGUAL = ["Ἀθῆναι — «Ὁ ΚΌΣΜΟΣ» στὴν Ἑλλάδα!", "Größe, STRASSE und Straße: ÄÖÜ äöü.", "Tiếng Việt có dấu: Đà Nẵng, Huế",
                "हिन्दी भाषा — देवनागरी लिपि।", "日本語の文章、句読点。中文，标点！", "Ｆｕｌｌ ｗｉｄｔｈ ﬁne ½ ²³ emoji 🙂 x_y",
                "İstanbul ve ıslak ĞÜŞ", "tab\tand\u00a0nbsp\u2003em space\u200bzero width", "ё Ё й Й é É ñ Ñ ç Ç"]


def test_unicode_words_are_the_definitions():
    """Texts of many scripts: the pipeline's normalised words are the definition's (NFKC,
    casefold, marks dropped, runs of letters, digits and `_`), computed character by character."""
    for text in MULTILINGUAL:
        (normalised,) = words.normalised_words(BatchText([text.encode()]))
        assert normalised.decode().split() == words_of(text), text


# Characters whose normalisation depends on their neighbours (they compose with the one before,
# are combining marks, or expand), in texts of otherwise plain letters of several scripts.
NEIGHBOURS = ["ｶﾞｷﾞ ﾊﾟﾝ ｶﾀｶﾅ", "cafe\u0301 re\u0301sume\u0301 naïve", "\u1100\u1161\u11a8 \u1112\u1161\u11ab 한국어",
              "a <\u0338 b =\u0338 c", "ᾳ ᾼ Ἀθῆναι \u03b1\u0345", "Straße ẞ ﬁne ﬀ ㍻ ½ Ⅻ ①",
              "ŉ ǰ ΐ İ ı K Ω Å µ", "क\u093c ख़ ଓ\u0b3e \u0b47\u0b3e", "Ё ё е\u0308 Й й и\u0306 ТЕКСТ текст",
              "ไม้เอก ภาษาไทย", "كَتَبَ العربية", "plain ascii then é", "ﷺ ﷻ ㍿ ㈱ ㏍ long expansions"]

# Code points of every kind a text's characters can be to its words: ASCII, letters that fold
# to one character, marks, expansions to 2-6 characters and to more (ﷺ), characters that
# compose with the one before, half-width sound marks, Hangul jamo, whitespace, punctuation.
TRICKY = (" \t\n.,-_0123456789azAZ" + "éÉñÑßẞçÇøØæÆ" + "ёЁйЙжЖщЩ" + "άΆΐΣσς" + "\u0301\u0308\u0306\u0345\u093c\u0b3e"
          + "ﬁﬀ㍻½Ⅻ①㍿ﷺﷻ" + "ｶﾞﾟｱ" + "\u1100\u1161\u11a8한국" + "ไม้" + "كَت" + "日本語、。" + "\u00a0\u2003\u200b…" + "İıKΩÅµŉǰ")


def tricky_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(TRICKY) for _ in range(rng.randrange(1, 80))) for _ in range(count)]


def test_texts_of_any_characters_get_the_definitions_words():
    """Texts mapped character by character (most) and texts normalised whole (those with
    characters that interact with their neighbours), alone and in one batch: the words of
    the whole-text definition."""
    texts = NEIGHBOURS + MULTILINGUAL + ["".join(NEIGHBOURS), " ".join(MULTILINGUAL)]
    for batch in ([t] for t in texts):
        (normalised,) = words.normalised_words(BatchText([t.encode() for t in batch]))
        assert normalised.decode().split() == words_of(batch[0]), batch[0]
    together = words.normalised_words(BatchText.of(texts))
    assert [n.decode().split() for n in together] == [words_of(t) for t in texts]


def words_as_hashed(normalised: bytes, text: str) -> list[str]:
    """The words of a text as normalised_words gives them: an ASCII text is given as it is,
    to be lowercased and split by word_hashes' byte table."""
    if text.isascii():
        return re.findall(r"\w+", normalised.decode().lower(), re.ASCII)
    return normalised.decode().split()


@pytest.mark.parametrize("seed", range(3))
def test_random_texts_of_every_kind_of_character_get_the_definitions_words(seed):
    """Random texts of every kind of character, in one batch (the characters that do not
    become one character are put in place across the whole batch's code points at once):
    each text's words are the definition's, and its words hash as those words do."""
    texts = tricky_texts(400, seed)
    normalised = words.normalised_words(BatchText.of(texts))
    assert any(t.isascii() for t in texts) and [words_as_hashed(n, t) for n, t in zip(normalised, texts)] == [
        words_of(t) for t in texts]
    by_path = words.word_hashes(BatchText.of(texts))
    by_definition = words.word_hashes(BatchText.of([" ".join(words_of(t)) for t in texts]))
    assert all(np.array_equal(a, b) for a, b in zip(by_path, by_definition))


@pytest.mark.parametrize("k", [64, 48])
def test_densified_bins_take_the_first_filled_bin_in_their_order(k):
    """Every empty bin of a signed row takes the value of the first filled bin in its probe
    order (the definition, checked bin by bin), whatever the share of bins filled; a row with
    no filled bin stays empty. (The options' bin counts are powers of two; 48 is not.)"""
    rng = np.random.default_rng(5)
    signatures = rng.integers(0, minhash.EMPTY - 1, size=(300, k), dtype=np.uint16)
    fill = rng.choice([0.0, 0.02, 0.1, 0.5, 0.9, 1.0], size=300)
    signatures[rng.random((300, k)) > fill[:, None]] = minhash.EMPTY
    order, _ = minhash.probe_order(k)
    dense = minhash.densified(signatures)
    for row, out in zip(signatures, dense):
        filled = row != minhash.EMPTY
        if not filled.any():
            assert (out == minhash.EMPTY).all()
            continue
        expected = [v if f else row[next(j for j in order[i] if filled[j])] for i, (v, f) in enumerate(zip(row, filled))]
        assert out.tolist() == expected


def test_a_texts_near_features_do_not_depend_on_the_batch_it_is_in():
    """Signatures and copy defects of texts of every kind of character, starting and ending
    with newlines and blanks, computed in one batch, in another order and alone: the same
    (the feature memo hands the features computed in one batch to every batch that meets
    the text again)."""
    from transforms.tokenize import near_features
    rng = random.Random(4)
    ends = ["", "\n", "\n\n", "\n\n\n", " ", "  ", "\t \n"]
    texts = [rng.choice(ends) + t + rng.choice(ends) for t in tricky_texts(150, 7)] + ["\n\nb  c", "\ny", "x\n\n"]
    settings = minhash.MinHashSettings()

    def features(batch):
        signatures, defects = near_features.computed(settings, batch, [t.encode() for t in batch], None, None)
        return {t: (s.tobytes(), int(d)) for t, s, d in zip(batch, signatures, defects)}

    together = features(texts)
    assert features(texts[::-1]) == together
    assert {t: features([t])[t] for t in texts} == together


@pytest.mark.parametrize("shingle", [minhash.WORDS, minhash.TOKENS])
def test_features_computed_a_piece_of_the_batch_at_a_time_are_each_texts_own(shingle, monkeypatch):
    """A batch's features are computed a piece of its text at a time (near_features.pieces):
    cut into pieces of a few texts, a batch gets each text's features alone, token shingles
    too (each piece takes its own texts' ids)."""
    from transforms.tokenize import near_features
    texts = [t for t in tricky_texts(120, 9) if t.strip()] + [RUSSIAN, RUSSIAN.upper()] + MULTILINGUAL
    settings = minhash.MinHashSettings(shingle=shingle)

    def features(batch):
        encoded = [t.encode() for t in batch]
        ids = [np.frombuffer(e, dtype=np.uint8).astype(np.uint32) for e in encoded]  # a byte tokenizer's ids
        lengths = np.array([i.size for i in ids], dtype=np.int64)
        return near_features.computed(settings, batch, encoded, np.concatenate(ids), lengths)

    alone = [features([t]) for t in texts]
    monkeypatch.setattr(near_features, "PIECE_BYTES", 300)
    assert len(near_features.pieces([t.encode() for t in texts])) > 10
    signatures, defects = features(texts)
    assert signatures.tobytes() == np.concatenate([s for s, _ in alone]).tobytes()
    assert defects.tolist() == [int(d[0]) for _, d in alone]


def test_pieces_cover_a_batch_in_order_each_about_the_size_asked():
    """Every text in exactly one piece, in order; a piece passes the size only by its last
    text, and only a piece of one text is empty of bytes."""
    from transforms.tokenize.near_features import pieces
    rng = random.Random(5)
    for _ in range(200):
        encoded = [bytes(rng.choice([0, 1, 5, 40, 300])) for _ in range(rng.randrange(0, 40))]
        size = rng.choice([1, 50, 100, 1000])
        ranges = pieces(encoded, size)
        assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(len(encoded)))
        for lo, hi in ranges:
            assert hi > lo
            assert sum(map(len, encoded[lo:hi - 1])) < size
        assert len(ranges) <= 1 + sum(map(len, encoded)) // size


def test_capitals_of_any_script_are_counted_as_defined():
    """copy_defects' capital level: uppercase and cased letters counted code point by code
    point as str.upper() and str.lower() change them, or (texts where a letter's case changes
    its length, like ß) as str.isupper and str.islower say."""
    from transforms.tokenize.copy_defects import CAPITAL_LEVELS, copy_defects

    def capital_level(text: str) -> int:
        upper, lower = text.upper(), text.lower()
        if len(upper) == len(text) == len(lower):
            counts = (sum(a != b for a, b in zip(text, lower)), sum(a != b for a, b in zip(lower, upper)))
        else:
            counts = (sum(c.isupper() for c in text), sum(c.isupper() or c.islower() for c in text))
        return min(CAPITAL_LEVELS * counts[0] // max(counts[1], 1), CAPITAL_LEVELS - 1)

    texts = (NEIGHBOURS + MULTILINGUAL + [RUSSIAN, RUSSIAN.upper(), "ΟΔΟΣ ΣΟΦΟΣ οδος", "STRASSE Straße", "ǅemal ǄEMAL"]
             + tricky_texts(300, 7) + ["Only ASCII", "ONLY ASCII"])
    assert ((copy_defects(BatchText.of(texts)) >> 8).tolist() == [capital_level(t) for t in texts])


def test_the_ascii_fast_path_makes_the_definitions_words():
    """ASCII texts skip the Unicode normalisation: their words hash as the normalised ones would."""
    texts = ["Hello, World! it's a_b  TEST-case 42x\ttab", "MIXED case: Ünïcödé and ASCII", "ﬁne ＦＵＬＬ ｗｉｄｔｈ"]
    by_path = words.word_hashes(BatchText.of(texts))
    normalised = words.word_hashes(BatchText.of([" ".join(words_of(t)) for t in texts]))
    assert all(np.array_equal(a, b) for a, b in zip(by_path, normalised))
    assert by_path[1].tolist() == [len(words_of(t)) for t in texts]


def test_token_shingles_skip_the_n_grams_across_documents():
    """Two documents whose tokens differ only in that the second starts with the first's last
    tokens: no n-gram spans the boundary, and a document shorter than n has no signature."""
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], dtype=np.uint16)
    alone = minhash.signatures(ids, np.array([15]), 5, 64)
    split = minhash.signatures(ids, np.array([8, 2, 5]), 5, 64)
    first = minhash.signatures(ids[:8], np.array([8]), 5, 64)
    last = minhash.signatures(ids[10:], np.array([5]), 5, 64)
    assert np.array_equal(split[0], first[0]) and np.array_equal(split[2], last[0])
    assert (split[1] == minhash.EMPTY).all() and minhash.signed(split).tolist() == [True, False, True]
    assert not np.array_equal(alone[0], first[0])


def test_components_converge_by_stars_and_union_find_agrees():
    """A path of 40 nodes (the worst case for label propagation) and random graphs: rounds of
    large-star and small-star end in stars pointing at each component's smallest node, and
    union-find (the convergence fallback) gives the same components."""
    from transforms.records import Edges

    def run_rounds(src, dst, rounds):
        edges = [(0, Edges(np.concatenate([src, dst]), np.concatenate([dst, src])))]
        for _ in range(rounds):
            edges = [(0, e) for _, e in large_star((0, [e for _, e in edges]))]
            edges = [(0, e) for _, e in small_star((0, [e for _, e in edges]))]
        a = np.concatenate([e.a for _, e in edges])
        b = np.concatenate([e.b for _, e in edges])
        return a[a > b], b[a > b]

    rng = np.random.default_rng(0)
    graphs = [(np.arange(1, 40, dtype=np.uint64), np.arange(0, 39, dtype=np.uint64))]
    for _ in range(5):
        src, dst = rng.integers(0, 300, 250).astype(np.uint64), rng.integers(0, 300, 250).astype(np.uint64)
        graphs.append((src[src != dst], dst[src != dst]))
    for src, dst in graphs:
        nodes, roots = components(src, dst)
        expected = dict(zip(nodes.tolist(), roots.tolist()))
        child, parent = run_rounds(src, dst, 8)
        got = dict(zip(child.tolist(), parent.tolist()))
        assert got == {n: r for n, r in expected.items() if n != r}


def test_a_band_part_gives_back_every_entrys_node_and_refuses_a_node_split_in_two():
    """A BandPart holds each node once, with its count of entries, when that is smaller: what it
    gives back per entry is what it was made of either way; a node whose entries are not
    together would be given back wrong, so it is refused."""
    from transforms.records import BandPart

    rng = np.random.default_rng(8)
    counts = rng.integers(1, 40, 500)
    nodes = np.repeat(np.sort(rng.choice(2**40, 500, replace=False)).astype(np.uint64), counts)
    keys = np.repeat(rng.integers(0, 2**63, 500, dtype=np.uint64), counts)
    hashes = rng.integers(0, 2**63, nodes.size, dtype=np.uint64)
    part = BandPart.of(hashes, nodes, keys)
    assert part.nodes.size == 500
    assert np.array_equal(part.entry_nodes(), nodes) and np.array_equal(part.entry_order_keys(), keys)
    assert np.array_equal(part.hashes, hashes) and part.entries == nodes.size
    # A node's bands spread over many shards: an entry each, held per entry (no smaller held once).
    once = np.flatnonzero(np.concatenate([[True], nodes[1:] != nodes[:-1]]))
    spread = BandPart.of(hashes[once], nodes[once], keys[once])
    assert spread.counts is None and spread.entries == 500
    assert np.array_equal(spread.entry_nodes(), nodes[once]) and np.array_equal(spread.entry_order_keys(), keys[once])
    with pytest.raises(ValueError, match="not together"):
        BandPart.of(hashes[:3], np.array([1, 2, 1], dtype=np.uint64), keys[:3])


def test_pairs_verified_from_node_tables_in_the_spill_directory_are_those_verified_from_fetched_nodes(tmp_path):
    """Local runs write each node table to the spill directory and verify candidate pairs with
    nodes read from there; other runners fetch both nodes of a pair through the runner
    (FetchNodes, AttachNodes). Both find the same linked pairs, near-copies and counts."""
    from apache_beam.pvalue import TaggedOutput

    from transforms.records import Edges, Nodes
    from transforms.tokenize.near_dedup import (_pair_buckets, attach_nodes, read_nodes, verify_local_pairs,
                                                verify_pairs, write_table)

    rng = np.random.default_rng(6)
    k, shards, n = 64, 3, 40
    base = rng.integers(0, 2**16 - 1, (4, k), dtype=np.uint16)
    tables = {}
    for shard in range(shards):
        ids = (np.uint64(shard) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
        signatures = base[rng.integers(0, 4, n)].copy()
        edits = rng.random((n, k)) < rng.uniform(0, 0.5, (n, 1))  # near-copies of 4 texts, and far ones
        signatures[edits] = rng.integers(0, 2**16 - 1, int(edits.sum()), dtype=np.uint16)
        tables[shard] = Nodes(ids, rng.integers(0, 2**63, (n, 2), dtype=np.uint64),
                              rng.integers(0, 2**40, n, dtype=np.uint64), rng.integers(0, 3, n).astype(np.int8),
                              signatures)
        write_table(str(tmp_path), shard, tables[shard])
    every = np.concatenate([t.ids for t in tables.values()])
    pairs = {tuple(sorted(p)) for p in rng.choice(every, (300, 2)).tolist() if p[0] != p[1]}
    a = np.array([p[0] for p in pairs], dtype=np.uint64)
    b = np.array([p[1] for p in pairs], dtype=np.uint64)

    def outputs(results):
        found = []
        for item in results:
            tag, value = (item.tag, item.value) if isinstance(item, TaggedOutput) else ("edges", item)
            if tag == "counts":
                found.append((tag, tuple(sorted(value.items()))))
                continue
            _, v = value
            if hasattr(v, "near"):  # local runs: the linked pairs, which are near-copies
                found += [("edges", e) for e in zip(v.a.tolist(), v.b.tolist())]
                found += [("near", e) for e in zip(v.a[v.near].tolist(), v.b[v.near].tolist())]
            elif hasattr(v, "a"):  # other runners: linked pairs both ways, near-copies
                found += [(tag, e) for e in zip(v.a.tolist(), v.b.tolist()) if tag != "edges" or e[0] < e[1]]
            else:
                found += [(tag, i) for i in v.ids.tolist()]
        return found

    fetched = []
    for shard, table in tables.items():
        requests = []
        for side, ends in ((False, a), (True, b)):
            mine = (ends >> np.uint64(32)) == shard
            requests.append(Edges(a[mine], b[mine], np.full(int(mine.sum()), side)))
        fetched += list(attach_nodes((shard, {"tables": [table], "requests": requests}), 4))
    through_runner = []
    for bucket in {k for k, _ in fetched}:
        through_runner += outputs(verify_pairs((bucket, [e for k, e in fetched if k == bucket]), 0.8))
    local = []
    buckets = _pair_buckets(a, b, 4)
    for bucket in np.unique(buckets).tolist():
        mine = buckets == bucket
        local += outputs(verify_local_pairs((bucket, [Edges(a[mine], b[mine]), Edges(a[mine][:5], b[mine][:5])]),
                                            0.8, str(tmp_path), k))
    def totals(found):
        summed = Counter()
        for tag, value in found:
            if tag == "counts":
                summed.update(dict(value))
        return summed

    def pairs_of(found, tag):
        return sorted(e for t, e in found if t == tag)

    assert pairs_of(local, "edges") == pairs_of(through_runner, "edges")
    assert pairs_of(local, "near") == pairs_of(through_runner, "near")
    # Other runners carry the linked pairs' nodes on; local runs read them at decide_at_once.
    assert sorted(set(pairs_of(through_runner, "nodes"))) == sorted({n for e in pairs_of(local, "edges") for n in e})
    assert totals(local) == totals(through_runner) and totals(local)["near_candidate_pairs"] == len(pairs)
    assert pairs_of(local, "near") and pairs_of(local, "edges")
    with pytest.raises(RuntimeError, match="does not hold"):
        read_nodes(str(tmp_path), np.array([(1 << 32) | n], dtype=np.uint64), k)
    # Every file read back is checked against the Sum written with it, and named when it is
    # not what was written: a table's signatures cut short or with a bit flipped, a table
    # with a bit flipped or another shard's table in its place, a listing with a bit flipped.
    one = np.array([(1 << 32) | (n - 1)], dtype=np.uint64)
    for name, damage, kind in [("nodes-000001.table.signatures", lambda b: b[:-2 * k], "signature file"),
                               ("nodes-000001.table.signatures", flip_a_bit, "signature file"),
                               ("nodes-000001.table", flip_a_bit, "node table"),
                               ("nodes-000001.table", lambda b: (tmp_path / "nodes-000002.table").read_bytes(),
                                "node table"),
                               ("nodes-000001.table.files", flip_a_bit, "node table listing")]:
        path = tmp_path / name
        good = path.read_bytes()
        path.write_bytes(damage(good))
        with pytest.raises(Damaged, match=f"{kind} {re.escape(str(path))}.*: damaged"):
            read_nodes(str(tmp_path), one, k)
        path.write_bytes(good)
        assert read_nodes(str(tmp_path), one, k).ids.tolist() == one.tolist()


def flip_a_bit(data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x04
    return bytes(flipped)


def _graph_by_shard(a, b, first, second, held, rounds):
    """What the near graph decides from verified pairs on runners other than local ones: every
    step run key by key, as a runner groups its input (FindNearDuplicates._decide_by_shard)."""
    from apache_beam.pvalue import TaggedOutput

    from transforms.tokenize import near_dedup as nd

    def run(step, keyed, *args):
        groups = defaultdict(list) if not isinstance(keyed, dict) else defaultdict(lambda: {t: [] for t in keyed})
        for tag, items in (keyed.items() if isinstance(keyed, dict) else [(None, keyed)]):
            for key, value in items:
                (groups[key] if tag is None else groups[key][tag]).append(value)
        main, tagged = [], defaultdict(list)
        for key in sorted(groups):
            for out in step((key, groups[key]), *args):
                if isinstance(out, TaggedOutput):
                    tagged[out.tag].append(out.value)
                else:
                    main.append(out)
        return main, tagged

    edges, verified = [], defaultdict(list)
    for out in nd._verified(a, b, first, second, THRESHOLD):
        (verified[out.tag].append(out.value) if isinstance(out, TaggedOutput) else edges.append(out))
    for _ in range(rounds):
        edges = run(nd.small_star, run(nd.large_star, edges)[0])[0]
    _, checked = run(nd.check_stars, run(nd.star_edges, edges)[0])
    roots, finished = run(nd.finish_residual, checked[nd.RESIDUAL])
    labels, _ = run(nd.relabel, {nd.STARS: checked[nd.STARS], "roots": roots})
    members, labelled = run(nd.label_nodes, {"edges": labels, nd.NODES: verified[nd.NODES], nd.NEAR: verified[nd.NEAR],
                                             nd.HELD: held})
    decisions, chosen = run(nd.choose_kept, {"members": members, nd.NEAR: labelled[nd.NEAR],
                                             nd.HELD: labelled[nd.HELD]}, THRESHOLD, 3, 0.2)
    return decisions, verified[nd.COUNTS] + finished[nd.COUNTS] + chosen[nd.COUNTS]


def _decided(decisions) -> tuple[list, Counter]:
    """Decisions as sorted rows, whatever parts they came in, and the summed counts."""
    from apache_beam.pvalue import TaggedOutput

    rows, counts = [], Counter()
    for out in decisions:
        if isinstance(out, TaggedOutput):
            counts.update(out.value)
            continue
        shard, d = out
        rows += [(shard, *x) for x in zip(map(tuple, d.digests.tolist()), d.removed.tolist(), d.splits.tolist(),
                                           map(tuple, d.kept.tolist()), d.similarity.tolist())]
    return sorted(rows), counts


@pytest.mark.parametrize("rounds", [4, 1])
def test_local_runs_decide_the_graph_at_once_as_other_runners_decide_it_by_shard(tmp_path, rounds):
    """Local runs take the verified pairs of every bucket on one worker and run the graph's steps
    on all of them at once (decide_at_once); other runners run each step shard by shard. Both
    give the same decisions and counts: with the components converged after 4 rounds and not
    after 1 (long chains: the unconverged edges are finished by union-find, and counted the
    same), with texts that earlier datasets hold (--dedup_against)."""
    from apache_beam.pvalue import TaggedOutput

    from transforms.records import Nodes, VerifiedPairs
    from transforms.tokenize.near_dedup import _pair_counts, decide_at_once, pair_links, read_nodes, write_table
    from transforms.tokenize.near_index import HeldNear

    rng = np.random.default_rng(rounds)
    k, shards, n = 64, 3, 60
    tables = {}
    for shard in range(shards):
        ids = (np.uint64(shard) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
        # Chains: each node a near-copy of the one before it in its chain, far from the chain's start.
        signatures = np.empty((n, k), dtype=np.uint16)
        for start in range(0, n, 15):
            signatures[start] = rng.integers(0, 2**16 - 1, k, dtype=np.uint16)
            for i in range(start + 1, min(start + 15, n)):
                signatures[i] = signatures[i - 1]
                edits = rng.random(k) < 0.08
                signatures[i][edits] = rng.integers(0, 2**16 - 1, int(edits.sum()), dtype=np.uint16)
        tables[shard] = Nodes(ids, rng.integers(0, 2**63, (n, 2), dtype=np.uint64),
                              rng.integers(0, 2**40, n, dtype=np.uint64), rng.integers(0, 3, n).astype(np.int8),
                              signatures)
        write_table(str(tmp_path), shard, tables[shard])
    every = np.concatenate([t.ids for t in tables.values()])
    mixed = rng.permutation(every.size)  # chains across shards
    chained = [(every[mixed[i]], every[mixed[i + 1]]) for i in range(every.size - 1) if i % 15 != 14]
    pairs = sorted({tuple(sorted(p)) for p in chained + rng.choice(every, (200, 2)).tolist() if p[0] != p[1]})
    a = np.array([p[0] for p in pairs], dtype=np.uint64)
    b = np.array([p[1] for p in pairs], dtype=np.uint64)
    signatures = np.concatenate([t.signatures for t in tables.values()])
    by_chain = np.empty((every.size, k), dtype=np.uint16)
    for i, j in enumerate(mixed):  # the permuted chains' signatures: node mixed[i] takes chain place i
        by_chain[j] = signatures[i]
    for shard, table in tables.items():
        table.signatures[:] = by_chain[shard * n:(shard + 1) * n]
        write_table(str(tmp_path), shard, table)
    first, second = read_nodes(str(tmp_path), a, k), read_nodes(str(tmp_path), b, k)
    some = rng.choice(every, 10, replace=False)
    held = [(int(shard), HeldNear(ids, np.zeros((ids.size, 2), np.uint64), np.zeros(ids.size, np.int32),
                                  np.zeros((ids.size, 2), np.uint64), np.ones(ids.size, np.float32)))
            for shard in range(shards) for ids in [np.sort(some[(some >> np.uint64(32)) == shard])] if ids.size]

    by_shard, by_shard_counts = _graph_by_shard(a, b, first, second, held, rounds)
    near, linked = pair_links(first, second, THRESHOLD)
    buckets = rng.integers(0, 4, a.size)
    parts = [VerifiedPairs(a[m], b[m], near[m]) for m in (buckets == i for i in range(4)) for m in [m & linked]]
    at_once = list(decide_at_once((0, {"pairs": parts, "held": [h for _, h in held]}), THRESHOLD, 3, 0.2, rounds,
                                  str(tmp_path), k))
    at_once.append(TaggedOutput("counts", _pair_counts(near, linked)))
    rows, counts = _decided(at_once)
    expected_rows, _ = _decided(by_shard)
    expected_counts = Counter()
    for c in by_shard_counts:
        expected_counts.update(c)
    assert rows == expected_rows and counts == expected_counts
    assert counts["near_clusters"] > 5 and any(r[2] for r in rows)
    assert (counts["near_unconverged_edges"] > 0) == (rounds == 1)
    # The held texts are removed by that, never kept for another: none is named as a kept text.
    held_digests = {tuple(d) for t in tables.values() for d, i in zip(t.digests.tolist(), t.ids.tolist())
                    if i in set(some.tolist())}
    assert not held_digests & {r[4] for r in rows if r[2]}


def test_a_near_copy_is_linked_even_where_its_margin_exceeds_the_link_margin(tmp_path):
    """--near_hashes 64, --near_threshold 0.5: a pair agreeing on 24 of its 64 filled bins is a
    near-copy (within VERIFY_Z deviations of the threshold: 0.125) but under threshold -
    LINK_MARGIN. It is linked all the same, so its texts meet in one component and the worse is
    removed (before, its nodes were not sent to the components and its removal was lost)."""
    from transforms.records import Nodes, VerifiedPairs
    from transforms.tokenize.near_dedup import decide_at_once, pair_links, write_table

    rng = np.random.default_rng(3)
    k = 64
    signatures = rng.choice(2**16 - 1, (2, k), replace=False).astype(np.uint16)
    signatures[1, :24] = signatures[0, :24]
    ids = np.arange(2, dtype=np.uint64)
    nodes = Nodes(ids, np.array([[1, 1], [2, 2]], dtype=np.uint64), np.array([5, 9], dtype=np.uint64),
                  np.zeros(2, np.int8), signatures)
    write_table(str(tmp_path), 0, nodes)
    near, linked = pair_links(nodes.take([0]), nodes.take([1]), 0.5)
    assert near.tolist() == [True] and linked.tolist() == [True]
    (decided,) = [d for _, d in (out for out in decide_at_once((0, [VerifiedPairs(ids[:1], ids[1:], near)]), 0.5, 1,
                                                               0.0, 4, str(tmp_path), k) if isinstance(out, tuple))]
    assert decided.removed.tolist() == [False, True] and decided.kept.tolist() == [[1, 1], [1, 1]]


def test_which_pairs_a_crowded_band_compares_does_not_depend_on_node_ids():
    """A band shared by more nodes than are paired each with each (30 here): the pairs come
    from the nodes' content, not their ids, which change with the number of shards."""
    from transforms.records import BandPart

    rng = np.random.default_rng(3)
    digests = rng.integers(0, 2**63, 30, dtype=np.uint64)
    found = []
    for shards in (1, 7):
        ids = (rng.integers(0, shards, 30).astype(np.uint64) << np.uint64(32)) | np.arange(30, dtype=np.uint64)
        parts = [BandPart.of(np.full(m.size, 42, np.uint64), ids[m], digests[m]) for m in np.array_split(np.arange(30), 4)]
        requests = [e for _, e in candidate_pairs((0, parts))]
        by_id = dict(zip(ids.tolist(), digests.tolist()))
        found.append({frozenset((by_id[a], by_id[b])) for e in requests for a, b in zip(e.a.tolist(), e.b.tolist())})
    assert found[0] == found[1] and len(found[0]) == 16 * 15 // 2 + 14 * 16



# ---------------------------------------------------------------------------------------------
# options

@pytest.mark.parametrize("dedup", ["none", "exact"])
def test_near_options_without_dedup_near_are_refused_at_launch(tmp_path, dedup):
    """They would be silently ignored: exit 2, one line naming the option and --dedup near."""
    src = write_jsonl(tmp_path / "in.jsonl", ["a document"])
    for option, value in (("near_threshold", "0.7"), ("near_shingle", "tokens"), ("near_shingle_size", "3"),
                          ("near_hashes", "128"), ("near_bands", "16")):
        line = refused(run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                                    "--dedup", dedup, f"--{option}", value, check=False))
        assert f"--{option} {value} needs --dedup near" in line and f"--dedup {dedup}" in line, line
    if dedup == "none":
        line = refused(run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                                    "--dedup_report", tmp_path / "report", check=False))
        assert "--dedup_report" in line and "needs --dedup exact or near" in line, line
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "report").exists()
    if dedup == "exact":  # a report path that is a file: refused before any data is read
        (tmp_path / "report").write_text("not a directory")
        line = refused(run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                                    "--dedup", dedup, "--dedup_report", tmp_path / "report", check=False))
        assert "--dedup_report" in line and "is a file, not a directory" in line, line
        for inside, what in ((tmp_path / "o.zarr" / "report", "inside --output"), (tmp_path, "overlaps the input")):
            line = refused(run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                                        "--dedup", dedup, "--dedup_report", inside, check=False))
            assert "--dedup_report" in line and what in line, line
        assert not (tmp_path / "o.zarr").exists()


def test_near_options_are_taken_with_dedup_near():
    from apache_beam.options.pipeline_options import PipelineOptions
    from pipeline.options import FlatTokensOptions, check_options
    argv = ["--input", "a.jsonl", "--tokenizer", "bytes", "--output", "o.zarr", "--dedup", "near",
            "--near_threshold", "0.7", "--near_shingle", "tokens", "--near_hashes", "128", "--near_bands", "16"]
    check_options(PipelineOptions(argv).view_as(FlatTokensOptions))


# ---------------------------------------------------------------------------------------------
# which copy is kept

def test_copy_defects_rate_capitals_and_mangled_whitespace_not_length():
    from transforms.tokenize.copy_defects import copy_defects
    prose = "The river ran past the mill. Every morning the miller opened the gates.\n    indented code line\n"
    texts = [prose, prose.upper(), prose.title(), prose.replace(" ", "  "), prose * 5, prose.replace("\n", "  \n"),
             RUSSIAN, RUSSIAN.upper(), "ÉCOLE " * 10, "straße " * 10, ""]
    d = copy_defects(BatchText.of(texts))
    capitals, anomalies = (d >> 8).tolist(), (d & 0xFF).tolist()
    assert capitals[0] == 0 and capitals[1] == 15 and 3 <= capitals[2] <= 6 and capitals[4] == capitals[0]
    assert capitals[6] == 0 and capitals[7] == 15 and capitals[8] == 15 and capitals[9] == 0
    assert anomalies[0] == anomalies[4] == anomalies[6] == 0, "indentation and length are no defect"
    assert anomalies[3] > 50 and anomalies[5] > 0 and d[10] == 0


def test_whitespace_anomalies_are_counted_as_defined():
    """copy_defects' anomaly rate of random texts of blanks, newlines, letters and a non-ASCII
    letter, against the definition read character by character: the first blank of a run of
    2+ after a word, a blank at the end of a line, a newline after two of the text's own
    (each text read as the batch joins them: each ends a line)."""
    from transforms.tokenize.copy_defects import MAX_ANOMALY_RATE, copy_defects
    rng = random.Random(3)
    texts = ["".join(rng.choice("  \t\n\naé") for _ in range(rng.randrange(1, 60))) for _ in range(500)]
    joined = "".join(t + "\n" for t in texts)  # as the batch reads them: each text ends a line
    expected, start = [], 0
    for text in texts:
        n = 0
        for i in range(start, start + len(text) + 1):
            c, before, after = joined[i], joined[i - 1] if i else None, joined[i + 1] if i + 1 < len(joined) else None
            n += c in " \t" and after is not None and after in " \t" and before is not None and before not in " \t\n"
            n += c in " \t" and after == "\n"
            n += c == "\n" and i - 2 >= start and joined[i - 2:i] == "\n\n"
        start += len(text) + 1
        expected.append(min(n * 1024 // len(text.encode()), MAX_ANOMALY_RATE))
    assert (copy_defects(BatchText.of(texts)) & 0xFF).tolist() == expected


@pytest.mark.slow
def test_a_cluster_keeps_the_original_over_its_capitals_and_respaced_copies(tmp_path):
    """Each original with an all-caps copy, a Title Case copy and a re-spaced copy (one
    cluster of Jaccard 1), given in either order and over two worker processes: the original
    is kept, and the others are removed."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")]
    originals = [t for t in texts if len(shingles(t)) >= 40 and t.upper() != t][:25] + [RUSSIAN]
    variants = [v for t in originals for v in (t.upper(), t.title(), re_spaced(t)) if v != t]
    outputs = []
    for name, docs, extra in (("first", variants + originals, []), ("last", originals + variants, MULTI)):
        write_jsonl(tmp_path / name / "in.jsonl", docs)
        out = tmp_path / f"{name}.zarr"
        run_pipeline("--input", tmp_path / name / "in.jsonl", "--tokenizer", "bytes", "--dedup", "near",
                     "--output", out, "--validation_fraction", "0", *extra)
        outputs.append(set(written_texts(out, "train")))
    assert outputs[0] == outputs[1] == set(originals)


def re_spaced(text: str) -> str:
    """Every space doubled, and blanks before each line break: the words unchanged."""
    return text.replace(" ", "  ").replace("\n", " \n")


def byte_shingles(text: str, n: int = 5) -> set:
    """Token shingles under the bytes tokenizer (a token is a UTF-8 byte): byte 5-grams."""
    encoded = text.encode("utf-8")
    return {encoded[i:i + n] for i in range(len(encoded) - n + 1)}


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer, shingle", [("bytes", "tokens"), ("bpe", "words"), ("lowercasing", "words")])
def test_the_reports_similarity_is_the_exact_jaccard_of_the_shingle_sets(tmp_path, bpe_tokenizer, tokenizer, shingle):
    """Near-copies planted in real text: each near row's `similarity` is the Jaccard similarity
    of the two texts' shingle sets, computed here (word 5-grams; byte 5-grams for token
    shingles of the bytes tokenizer). With a tokenizer whose ids do not give back the text (a
    lowercasing normalizer), it is null for texts that held capitals, and exact for the others."""
    from flat_tokens.format.report_files import document_at, read_report
    rng = random.Random(5)
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:400]
    longer = [t for t in texts if len(shingles(t)) >= 80][:50]
    lower = [t.lower() for t in longer[40:]]  # texts without capitals (in place of theirs), and near-copies
    texts = [t for t in texts if t not in longer[40:]] + lower
    variants = [edited(t, rng, rng.uniform(0, 0.03)) for t in longer[:40] + lower]
    write_jsonl(tmp_path / "a.jsonl", texts)
    write_jsonl(tmp_path / "b.jsonl", variants)
    spec = {"bytes": "bytes", "bpe": bpe_tokenizer}.get(tokenizer)
    if tokenizer == "lowercasing":
        from tokenizers import Tokenizer, normalizers
        tok = Tokenizer.from_file(str(bpe_tokenizer))
        tok.normalizer = normalizers.Lowercase()
        spec = tmp_path / "lowercasing.json"
        tok.save(str(spec))
    out = tmp_path / "out.zarr"
    run_pipeline("--input", tmp_path / "a.jsonl", "--input", tmp_path / "b.jsonl", "--output", out,
                 "--tokenizer", spec, "--dedup", "near", "--near_shingle", shingle,
                 "--dedup_report", tmp_path / "report")
    rows = [r for r in read_report(str(tmp_path / "report"), zarr.open_group(str(out), mode="r").attrs["run_id"])
            if r["match"] == "near"]
    assert len(rows) >= 30
    shingles_of = byte_shingles if shingle == "tokens" else shingles
    known = 0
    for r in rows:
        removed, kept = document_at(r["removed_file"], r["removed_offset"]), document_at(r["kept_file"], r["kept_offset"])
        if tokenizer == "lowercasing" and (removed != removed.lower() or kept != kept.lower()):
            assert r["similarity"] is None, r
            continue
        assert r["similarity"] == pytest.approx(jaccard_of(removed, kept, shingles_of), abs=1e-6), r
        known += 1
    assert known >= (5 if tokenizer == "lowercasing" else len(rows))


def test_shingle_sets_give_the_exact_jaccard_and_none_for_texts_not_given_back():
    """ExactShingles on a pair of texts, as the dedup group holds them (ids, lengths, digests):
    the Jaccard similarity of the sets is the one computed here, for words and for tokens; a
    document whose ids do not decode to its digest's text has no set."""
    from transforms.tokenize.dedup import content_digests
    from transforms.tokenize.minhash import jaccard
    from transforms.tokenize.shingle_sets import ExactShingles
    from transforms.tokenize.tokenizer import encode_bytes, resolve_tokenizer
    a = json.loads(next(open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")))["text"]
    b = edited(a, random.Random(1), 0.05).upper()  # a Cyrillic ё would fold too: "What a shingle is"
    ids, lengths = encode_bytes([a, b, a])
    digests = content_digests([a, b, b])  # the third document's ids are not its text
    for shingle, shingles_of in ((minhash.WORDS, shingles), (minhash.TOKENS, byte_shingles)):
        found = ExactShingles(minhash.MinHashSettings(shingle=shingle), resolve_tokenizer("bytes")).sets(
            ids, lengths, digests)
        assert jaccard(found[0], found[1]) == pytest.approx(jaccard_of(a, b, shingles_of), abs=1e-12)
        assert 0 < jaccard(found[0], found[1]) < 1
        assert (found[2] is None) == (shingle == minhash.WORDS)  # token ids are the units as they are
        assert np.isnan(jaccard(found[0], None))
