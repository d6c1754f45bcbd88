"""Mixtures (--mixture): several real sources, each sampled to its share of the train tokens.

The expectations are computed here from the definition in docs/mixtures.md (T = min over sources
of max_epochs * tokens / share; multiplier = share * T / tokens), from the texts this test
wrote and tokenized itself, never from the pipeline's own numbers."""
import json
import math
from collections import Counter

import numpy as np
import pytest
import zarr
from tokenizers import Tokenizer

from flat_tokens.tools import verify
from tests.helpers import SAMPLE, check_flat_tokens, run_pipeline, write_jsonl
from transforms.read.mixture import MixtureError, load_mixture

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def paragraphs(path) -> list[str]:
    """The distinct paragraphs of a sample file's documents, in order: real text, short and many."""
    seen = {}
    for line in open(path, encoding="utf-8"):
        for p in json.loads(line)["text"].split("\n\n"):
            if p.strip():
                seen.setdefault(p.strip(), None)
    return list(seen)


def split_sequences(out, split: str) -> list[tuple[int, ...]]:
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:] >> 1, g["seq_starts"][:]
    return [tuple(tokens[a:b].tolist()) for a, b in zip(starts[:-1], starts[1:])]


def encode_all(tokenizer_path, texts) -> list[tuple[int, ...]]:
    tok = Tokenizer.from_file(str(tokenizer_path))
    return [tuple(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, bpe_tokenizer):
    """Two real sources, disjoint: 'docs' (paragraphs of corpus-1, over two files, weight 0.6,
    max_epochs 2) and 'more' (paragraphs of corpus-2 with half of docs' text, under the key
    `content`, weight 0.4, max_epochs 4). docs binds: T = 2 * docs / 0.6, and more is used
    0.4 * T / more ~ 2.7 times."""
    root = tmp_path_factory.mktemp("mixture")
    docs = paragraphs(SAMPLE / "corpus-1.jsonl")
    taken, more = set(docs), []
    budget = sum(map(len, docs)) // 2
    for p in paragraphs(SAMPLE / "corpus-2.jsonl"):
        if p not in taken and budget > 0:
            more.append(p)
            budget -= len(p)
    write_jsonl(root / "docs" / "a.jsonl", docs[::2])
    write_jsonl(root / "docs" / "b.jsonl", docs[1::2])
    write_jsonl(root / "more.jsonl", more, key="content")
    mixture = root / "mix.yaml"
    mixture.write_text("sources:\n"
                       "  - name: docs\n    input: ['docs/*.jsonl']\n    weight: 0.6\n    max_epochs: 2\n"
                       "  - name: more\n    input: more.jsonl\n    weight: 0.4\n    max_epochs: 4\n"
                       "    text_key: content\n")
    ids = {}
    for name, texts in (("docs", docs), ("more", more)):
        for text, seq in zip(texts, encode_all(bpe_tokenizer, texts)):
            assert seq not in ids, "the test's sources must be disjoint token sequences"
            ids[seq] = name
    return type("Sources", (), {"root": root, "mixture": mixture, "ids": ids,
                                "count": {"docs": len(docs), "more": len(more)}})


@pytest.fixture(scope="module")
def mixed(sources, bpe_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "out.zarr"
    proc = run_pipeline("--mixture", sources.mixture, "--tokenizer", bpe_tokenizer, "--output", out,
                        "--num_shards", "3", "--seed", "3")
    return out, proc


@pytest.mark.slow
def test_shares_epochs_and_every_sequence_a_document_of_its_source(sources, mixed):
    out, proc = mixed
    train, valid = split_sequences(out, "train"), split_sequences(out, "validation")
    # Every sequence is a document of one of the sources.
    assert all(s in sources.ids for s in train + valid)
    # Validation: held out per source before sampling, each once, never in train.
    in_valid = Counter(valid)
    assert max(in_valid.values()) == 1 and not set(in_valid) & set(train)
    assert {sources.ids[s] for s in valid} == {"docs", "more"}
    copies = Counter(train)
    # The binding source is used exactly max_epochs (2) times: every document not held out.
    docs_train = [s for s, n in sources.ids.items() if n == "docs" and s not in in_valid]
    assert len(docs_train) + sum(sources.ids[s] == "docs" for s in valid) == sources.count["docs"]
    assert all(copies[s] == 2 for s in docs_train)
    # The other source's multiplier, from the definition: share * T / tokens.
    docs_tokens = sum(map(len, docs_train))
    more_train = [s for s, n in sources.ids.items() if n == "more" and s not in in_valid]
    more_tokens = sum(map(len, more_train))
    total = min(2 * docs_tokens / 0.6, 4 * more_tokens / 0.4)
    m = 0.4 * total / more_tokens
    assert 2 < m < 3
    assert all(copies[s] in (math.floor(m), math.ceil(m)) for s in more_train)
    # Achieved token shares within 1.5 points of the weights.
    by_source = Counter()
    for s in train:
        by_source[sources.ids[s]] += len(s)
    share = by_source["docs"] / sum(by_source.values())
    assert abs(share - 0.6) < 0.015, by_source

    check_flat_tokens(out)
    assert verify.verify_dataset(str(out)) == []
    attrs = zarr.open_group(str(out), mode="r").attrs
    reported = {s["name"]: s for s in attrs["mixture"]["sources"]}
    assert reported["docs"]["multiplier"] == pytest.approx(2.0, rel=1e-12)
    assert reported["more"]["multiplier"] == pytest.approx(m, rel=1e-9)
    assert (reported["docs"]["tokens_available"], reported["more"]["tokens_available"]) == (docs_tokens, more_tokens)
    assert {n: reported[n]["train_tokens"] for n in reported} == dict(by_source)
    assert reported["docs"]["train_share"] == pytest.approx(share)
    # The summary shows the same per source.
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["more"])
    assert row[1] == "0.400" and f"{by_source['more']:,}" in row


@pytest.mark.slow
def test_same_bytes_with_other_shards_and_two_worker_processes(sources, mixed, bpe_tokenizer, tmp_path):
    again = tmp_path / "again.zarr"
    run_pipeline("--mixture", sources.mixture, "--tokenizer", bpe_tokenizer, "--output", again,
                 "--num_shards", "7", "--seed", "3", "--batch_documents", "100", *MULTI)
    check_flat_tokens(again, "--compare", mixed[0])


def test_inspect_shows_the_shares_per_source(mixed):
    import subprocess
    import sys

    from tests.helpers import REPO
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", str(mixed[0]), "--sequences", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if "train share" in line)
    assert header.split()[:2] == ["source", "share"]
    attrs = zarr.open_group(str(mixed[0]), mode="r").attrs["mixture"]["sources"]
    for s in attrs:
        row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == [s["name"]])
        assert f"{s['train_share']:.3f}" in row and f"{s['share']:.3f}" in row


@pytest.mark.slow
def test_dedup_with_a_mixture_credits_the_first_source(tmp_path):
    """Texts in both sources are kept once and credited to the first source (the kept copy is
    the one at the smallest place), so they are used as often as its documents."""
    texts = paragraphs(SAMPLE / "corpus-2.jsonl")[:600]
    first, second = texts[:200], texts[150:600]  # 50 texts in both
    write_jsonl(tmp_path / "first.jsonl", first + first[:10])  # and 10 repeated inside the first
    write_jsonl(tmp_path / "second.jsonl", second)
    (tmp_path / "mix.json").write_text(json.dumps({"sources": [
        {"name": "first", "input": "first.jsonl", "weight": 1, "max_epochs": 3},
        {"name": "second", "input": ["second.jsonl"], "weight": 1, "max_epochs": 1}]}))
    out = tmp_path / "out.zarr"
    run_pipeline("--mixture", tmp_path / "mix.json", "--dedup", "exact", "--tokenizer", "bytes", "--output", out,
                 "--validation_fraction", "0.05")

    def text(seq):
        return (np.array(seq) - 1).astype(np.uint8).tobytes().decode("utf-8")

    train = Counter(map(text, split_sequences(out, "train")))
    valid = Counter(map(text, split_sequences(out, "validation")))
    assert set(train) | set(valid) == set(texts) and not set(train) & set(valid)
    assert max(valid.values()) == 1
    # The 50 shared texts count as first's: they are used as often as its other texts.
    first_tokens = sum(len(t.encode()) for t in first if t not in valid)
    second_tokens = sum(len(t.encode()) for t in second[50:] if t not in valid)
    total = min(3 * first_tokens / 0.5, 1 * second_tokens / 0.5)
    m_first, m_second = 0.5 * total / first_tokens, 0.5 * total / second_tokens
    assert all(train[t] in (math.floor(m_first), math.ceil(m_first)) for t in first if t not in valid)
    assert all(train[t] in (math.floor(m_second), math.ceil(m_second)) for t in second[50:] if t not in valid)
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert stats["duplicates"] == 60 and stats["duplicates_by_source"] == {"first": 10, "second": 50}
    check_flat_tokens(out)


@pytest.mark.slow
def test_a_source_without_train_tokens_fails_naming_it(tmp_path):
    write_jsonl(tmp_path / "fine.jsonl", paragraphs(SAMPLE / "corpus-1.jsonl")[:50])
    write_jsonl(tmp_path / "hollow.jsonl", ["", "", ""])
    (tmp_path / "mix.yaml").write_text("sources:\n  - {name: fine, input: fine.jsonl, weight: 1}\n"
                                       "  - {name: hollow, input: hollow.jsonl, weight: 1}\n")
    out = tmp_path / "out.zarr"
    proc = run_pipeline("--mixture", tmp_path / "mix.yaml", "--tokenizer", "bytes", "--output", out, check=False)
    assert proc.returncode == 1
    assert "'hollow' has no train tokens" in proc.stderr
    assert not out.exists() or verify.verify_dataset(str(out))


BAD_MIXTURES = [
    ("[1, 2]", "expected a mapping with a 'sources' list"),
    ("sources: []", "sources: must be a non-empty list"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1}\nextra: 1", "extra: unknown key"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1, epochs: 2}", "sources[0].epochs: unknown key"),
    ("sources:\n  - {input: x.jsonl, weight: 1}", "sources[0].name: missing"),
    ("sources:\n  - {name: a, weight: 1}", "sources[0].input: missing"),
    ("sources:\n  - {name: a, input: x.jsonl}", "sources[0].weight: missing"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1}\n  - {name: a, input: x.jsonl, weight: 1}",
     "sources[1].name: duplicate source name 'a'"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1}\n  - {name: b, input: x.jsonl, weight: -1}",
     "sources[1].weight: must be > 0"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 0}", "sources[0].weight: must be > 0"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1e-1}", "write 0.1"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: true}", "sources[0].weight: must be a number"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1, max_epochs: 0}", "sources[0].max_epochs: must be > 0"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: .nan}", "sources[0].weight: must be > 0"),
    ("sources:\n  - {name: a, input: [], weight: 1}", "sources[0].input: must name at least one"),
    ("sources:\n  - {name: a, input: [3], weight: 1}", "sources[0].input: must be a path"),
    ("sources:\n  - {name: '', input: x.jsonl, weight: 1}", "sources[0].name: must be a non-empty string"),
    ("sources:\n  - {name: a, input: x.jsonl, weight: 1, text_key: 5}", "sources[0].text_key: must be"),
    ("sources:\n  - name: a\n   input: x", "not valid YAML"),
]


@pytest.mark.parametrize("text, message", BAD_MIXTURES, ids=[m for _, m in BAD_MIXTURES])
def test_a_bad_mixture_file_is_refused_naming_the_file_and_the_field(tmp_path, text, message):
    path = tmp_path / "mix.yaml"
    path.write_text(text)
    with pytest.raises(MixtureError) as e:
        load_mixture(str(path))
    assert str(e.value).startswith(f"--mixture {path}: ") and message in str(e.value)


@pytest.mark.slow
def test_bad_mixtures_and_combinations_exit_2_before_reading(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", ["a document"])
    (tmp_path / "bad.json").write_text('{"sources": [{"name": "a", "input": "x.jsonl", "weight": 1,}]}')
    (tmp_path / "nomatch.yaml").write_text("sources:\n  - {name: web, input: 'web/*.jsonl', weight: 1}\n")
    (tmp_path / "good.yaml").write_text("sources:\n  - {name: a, input: x.jsonl, weight: 1}\n")
    (tmp_path / "twice.yaml").write_text("sources:\n  - {name: a, input: x.jsonl, weight: 1}\n"
                                         "  - {name: b, input: '*.jsonl', weight: 1}\n")
    common = ["--tokenizer", "bytes", "--output", tmp_path / "out.zarr"]
    cases = [
        (["--mixture", tmp_path / "bad.json"], f"--mixture {tmp_path / 'bad.json'}: not valid JSON"),
        (["--mixture", tmp_path / "missing.yaml"], f"--mixture {tmp_path / 'missing.yaml'}: no such file"),
        (["--mixture", tmp_path / "nomatch.yaml"], "--mixture source 'web' input"),
        (["--mixture", tmp_path / "good.yaml", "--input", tmp_path / "x.jsonl"], "--input and --mixture cannot"),
        (["--mixture", tmp_path / "good.yaml", "--validation_input", tmp_path / "x.jsonl"],
         "validation_input in the mixture file"),
        (["--mixture", tmp_path / "twice.yaml"],
         f"by --mixture source 'a' input {tmp_path / 'x.jsonl'} and by --mixture source 'b' input {tmp_path}/*.jsonl"),
    ]
    for args, message in cases:
        proc = run_pipeline(*args, *common, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "out.zarr").exists()


@pytest.mark.slow
def test_a_source_with_its_own_validation_input(tmp_path):
    """A source's validation_input forms its share of the validation split, used once, and all
    of its input is train; a source without one holds out --validation_fraction of its input."""
    texts = paragraphs(SAMPLE / "corpus-1.jsonl")
    write_jsonl(tmp_path / "a" / "train.jsonl", texts[:300])
    write_jsonl(tmp_path / "a" / "valid.jsonl", texts[300:320])
    write_jsonl(tmp_path / "b.jsonl", texts[400:1000])  # about twice a: b binds, a is used about twice
    (tmp_path / "mix.yaml").write_text(
        "sources:\n"
        "  - {name: a, input: a/train.jsonl, validation_input: [a/valid.jsonl], weight: 1, max_epochs: 3}\n"
        "  - {name: b, input: b.jsonl, weight: 1}\n")
    out = tmp_path / "out.zarr"
    run_pipeline("--mixture", tmp_path / "mix.yaml", "--tokenizer", "bytes", "--output", out,
                 "--validation_fraction", "0.1")

    def texts_of(split):
        return Counter((np.array(s) - 1).astype(np.uint8).tobytes().decode("utf-8") for s in split_sequences(out, split))

    train, valid = texts_of("train"), texts_of("validation")
    assert set(texts[300:320]) <= set(valid) and max(valid.values()) == 1
    assert not set(valid) & set(train)
    held_from_b = set(valid) - set(texts[300:320])
    assert held_from_b <= set(texts[400:1000]) and 30 <= len(held_from_b) <= 90
    assert set(train) == set(texts[:300]) | (set(texts[400:1000]) - held_from_b)
    assert all(train[t] == 1 for t in texts[400:1000] if t in train)
    assert all(train[t] >= 1 for t in texts[:300])
    sources = {s["name"]: s for s in zarr.open_group(str(out), mode="r").attrs["mixture"]["sources"]}
    assert sources["a"]["validation_sequences"] == 20 and sources["a"]["train_documents"] == 300
    check_flat_tokens(out)


def test_multipliers_are_exact_whatever_the_float_weights(tmp_path):
    """0.7 and 0.3 are not exact binary fractions, yet the binding source's multiplier must be
    exactly its max_epochs (every document used that many times, no Bernoulli draw), and a
    fractional max_epochs 2.5 must mean 2 copies plus a fair coin."""
    from fractions import Fraction

    from transforms.read.mixture import parse_mixture, sampling_plan
    mixture = parse_mixture("sources:\n  - {name: a, input: a, weight: 0.7, max_epochs: 3}\n"
                            "  - {name: b, input: b, weight: 0.3}\n", str(tmp_path / "m.yaml"))
    for tokens in ([1000, 10**9], [123457, 7], [3, 5]):
        total, plan = sampling_plan(mixture, tokens)
        binding = [i for i, p in enumerate(plan) if p.multiplier == Fraction((3, 1)[i])]
        assert len(binding) == 1, plan
        assert plan[binding[0]].threshold == 0 and plan[binding[0]].whole == (3, 1)[binding[0]]
        # The other source gets exactly its share: multiplier * tokens / T = weight / (0.7 + 0.3).
        other = 1 - binding[0]
        assert plan[other].multiplier * tokens[other] / total == Fraction(mixture.sources[other].weight) / (
            Fraction(0.7) + Fraction(0.3))
    halves = parse_mixture("sources:\n  - {name: a, input: a, weight: 1, max_epochs: 2.5}\n", "m.yaml")
    _, [only] = sampling_plan(halves, [100])
    assert (only.whole, only.threshold) == (2, 2**63)
