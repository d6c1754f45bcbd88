#!/usr/bin/env python3
"""Benchmark --dedup near against --dedup exact: what it costs, and how well it finds near-copies.

    python benchmarks/bench_dedup.py --input corpus.jsonl --tokenizer tokenizer.json

Cost. The input written --scale times into one file (default 5: issue 30's target is on the
250 MB benchmark corpus five times over), then for --rounds N (default 3) alternated, each a
whole process (interpreter start, imports and tokenizer load included), default options
otherwise:
  (a) --dedup exact;
  (b) --dedup near (word shingles, the default);
  (c) --dedup near --near_shingle tokens.
Wall, CPU (user + sys) and peak RSS of each process (os.wait4), medians, and the ratios b/a
and c/a; then one run of (a) and (b) on the input once (1x), for peak RSS's growth per GB.
Targets: (b) CPU <= 1.6x (a)'s at --scale; peak RSS <= 1 GB at 1x and growing <= 0.1 GB per
GB of input (issue 21's bounds).

Short documents (issue 39). Real web text is many short documents. --short_corpus PATH takes
them from a JSONL file as it is: e.g. real documentation cut into sections of at most 2,400
characters by make_corpus.py (`--max-doc-chars 2400 --mb 166`: about 100,000 documents of 1.7
KB in 25 languages, from the Debian packages it lists). Without it, --short_documents N
(default 100,000; 0 skips) documents of about --short_bytes (2,048) bytes each are cut from
the input's texts at line breaks; when the input holds less text than that, the rest are made
of its lines drawn at random (seeded: distinct documents of real lines). Then (a) and (b)
--rounds times, alternated, and the ratio of their median CPU: target <= 1.6x too. Both ratios
are printed with PASS or FAIL; --no_cost skips the 5x corpus (minutes of CPU per run).

Every run's CPU includes its child processes' (this script is their subreaper), and the
project's bytecode is compiled before the first run, as an install would.

Quality. --quality_documents documents of the input (default 3000) get near-copies planted:
a third of those with >= 60 words get 1 to 3 variants, words replaced, dropped or doubled at
rates that put their Jaccard similarity between about 0.4 and 1, some with a header added,
their lines re-wrapped or their case changed. Every pair's exact Jaccard similarity is then
computed by brute force, over word 5-grams and over token 5-grams (this script's own
shingling, with the `tokenizers` library: no project code), and each --quality_setting (a
--dedup near run on the planted corpus, --validation_fraction 0.3) is scored against both:
recall of the pairs at or above threshold + 0.05 (not both kept), precision (each removed
text has a kept text at or above threshold - 0.1), the pairs at or above the threshold across
train and validation, and what the dataset's stats say (clusters, candidate pairs, estimated
false-positive rate).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import (become_subreaper, compile_project, median, repeat_file, run_measured,  # noqa: E402
                            wait_for_load)

REPO = Path(__file__).resolve().parent.parent
TARGET_CPU_RATIO = 1.6
TARGET_RSS_MB = 1024
TARGET_RSS_GROWTH = 0.1  # GB per GB of input
THRESHOLD = 0.8
WORD = re.compile(rb"[0-9A-Za-z_\x80-\xff]+")  # a rough word count, to pick longer texts


def words_of(text: str) -> list[str]:
    """Words as docs/dedup.md defines them (NFKC, case folding, accents dropped, runs of \\w)."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return re.sub(r"\W+", " ", "".join(c for c in folded if not unicodedata.category(c).startswith("M"))).split()
COST_RUNS = {"a": ["--dedup", "exact"], "b": ["--dedup", "near"],
             "c": ["--dedup", "near", "--near_shingle", "tokens"]}
DEFAULT_QUALITY_SETTINGS = ("words", "tokens", "words --near_hashes 128 --near_bands 16",
                            "words --near_hashes 256 --near_bands 16", "words --near_shingle_size 3")


def note(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def command(input_path: Path, tokenizer: str, output: Path, summary: Path, extra=()) -> list[str]:
    return [sys.executable, "-m", "pipeline.run", "--input", str(input_path), "--tokenizer", str(tokenizer),
            "--output", str(output), "--overwrite", "--quiet", "--summary_json", str(summary), *extra]


def clear(output: Path) -> None:
    for p in (output, Path(str(output) + ".rejected")):
        shutil.rmtree(p, ignore_errors=True)


def measured_run(work: Path, name: str, input_path: Path, tokenizer: str, extra) -> dict:
    output, summary = work / f"{name}.zarr", work / f"{name}.summary.json"
    clear(output)
    result = run_measured(command(input_path, tokenizer, output, summary, extra), work / f"{name}.log")
    stats = json.loads(summary.read_text())["stats"]
    result.update(sequences=stats["train"]["sequences"] + stats["validation"]["sequences"],
                  near_duplicates=stats.get("near_duplicates", 0))
    clear(output)
    return result


# ---------------------------------------------------------------------------------------------
# quality: planted near-copies, scored against brute force

def edited(text: str, rng: random.Random, rate: float) -> str:
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
    kind = rng.random()
    if kind < 0.2:
        variant = f"Mirror {rng.randrange(1000)} of this page\n\n" + variant
    elif kind < 0.35:
        variant = variant.replace("\n", " ").replace(". ", ".\n")  # lines re-wrapped
    elif kind < 0.45:
        variant = variant.upper()
    return variant


def planted(texts: list[str], rng: random.Random) -> list[str]:
    longer = [t for t in texts if len(WORD.findall(t.encode("utf-8"))) >= 60]
    originals = rng.sample(longer, len(longer) // 3)
    variants = [edited(t, rng, rng.uniform(0, 0.03) if rng.random() < 0.75 else rng.uniform(0.03, 0.12))
                for t in originals for _ in range(rng.choice((1, 1, 2, 3)))]
    corpus = texts + variants
    rng.shuffle(corpus)
    return corpus


def word_grams(texts: list[str], n: int = 5) -> list[np.ndarray]:
    out = []
    for t in texts:
        words = words_of(t)
        out.append(np.unique(np.array([hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)],
                                      dtype=np.int64)))
    return out


def token_ids(texts: list[str], tokenizer: str) -> list[list[int]]:
    if tokenizer == "bytes":
        return [[b + 1 for b in t.encode("utf-8")] for t in texts]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer))
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def token_grams(ids: list[list[int]], n: int = 5) -> list[np.ndarray]:
    return [np.unique(np.array([hash(tuple(x[i:i + n])) for i in range(len(x) - n + 1)], dtype=np.int64))
            for x in ids]


def all_pairs(grams: list[np.ndarray]) -> dict:
    """(i, j) -> exact Jaccard, for every pair of documents sharing a shingle."""
    sizes = np.array([g.size for g in grams])
    doc = np.repeat(np.arange(len(grams)), sizes)
    values = np.concatenate(grams) if grams else np.empty(0, np.int64)
    order = np.lexsort((doc, values))
    values, doc = values[order], doc[order]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    counts = np.diff(np.r_[starts, values.size])
    codes = []
    n = len(grams)
    for m in np.unique(counts[counts > 1]):  # every group of m documents sharing a shingle, at once
        group = starts[counts == m][:, None] + np.arange(m)
        members = doc[group]
        i, j = np.triu_indices(m, 1)
        codes.append((members[:, i] * n + members[:, j]).ravel())
    if not codes:
        return {}
    pair, shared = np.unique(np.concatenate(codes), return_counts=True)
    a, b = pair // n, pair % n
    jaccard = shared / (sizes[a] + sizes[b] - shared)
    return dict(zip(zip(a.tolist(), b.tolist()), jaccard.tolist()))


def decoded(out: Path, split: str, tokenizer: str) -> list[str]:
    import zarr
    g = zarr.open_group(str(out), mode="r")[split]
    tokens, starts = g["encoded_tokens"][:] >> 1, g["seq_starts"][:]
    if tokenizer == "bytes":
        return [bytes((tokens[a:b] - 1).astype(np.uint8)).decode("utf-8") for a, b in zip(starts[:-1], starts[1:])]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer))
    return tok.decode_batch([tokens[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])],
                            skip_special_tokens=False)


def score(texts: list[str], jaccard: dict, train: list[str], validation: list[str]) -> dict:
    kept = set(train) | set(validation)
    index = {t: i for i, t in enumerate(texts)}
    close = [p for p, s in jaccard.items() if s >= THRESHOLD + 0.05]
    found = sum(not (texts[i] in kept and texts[j] in kept) for i, j in close)
    near: dict[int, list] = {}
    for (i, j), s in jaccard.items():
        if s >= THRESHOLD - 0.1:
            near.setdefault(i, []).append(j)
            near.setdefault(j, []).append(i)
    removed = [index[t] for t in texts if t not in kept]
    justified = sum(any(texts[j] in kept for j in near.get(r, ())) for r in removed)
    in_train, in_validation = {index[t] for t in train if t in index}, {index[t] for t in validation if t in index}
    across = sum(1 for (i, j), s in jaccard.items() if s >= THRESHOLD
                 and ((i in in_train and j in in_validation) or (j in in_train and i in in_validation)))
    return {"pairs_at_threshold_plus_0.05": len(close), "recall": round(found / len(close), 4) if close else None,
            "removed": len(removed), "precision": round(justified / len(removed), 4) if removed else None,
            "pairs_across_splits": across}


def quality(args, work: Path) -> dict:
    texts = []
    with open(args.input, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)[args.text_key])
            if len(texts) >= args.quality_documents:
                break
    corpus = planted(texts, random.Random(args.seed))
    path = work / "planted.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for t in corpus:
            f.write(json.dumps({args.text_key: t}, ensure_ascii=False) + "\n")
    distinct = sorted({t for t in corpus if t})
    started = time.perf_counter()
    truths = {"words": all_pairs(word_grams(distinct)),
              "tokens": all_pairs(token_grams(token_ids(distinct, args.tokenizer)))}
    note(f"quality: {len(corpus):,} documents ({len(corpus) - len(texts):,} planted), brute force over all pairs "
         f"in {time.perf_counter() - started:.0f} s")
    results = {"documents": len(corpus), "planted": len(corpus) - len(texts), "settings": {}}
    for setting in args.quality_setting:
        extra = setting.split()
        shingle = extra[0]
        out, summary = work / "quality.zarr", work / "quality.json"
        clear(out)
        measured = run_measured(command(path, args.tokenizer, out, summary,
                                        ["--text_key", args.text_key, "--dedup", "near", "--near_shingle", shingle,
                                         "--validation_fraction", "0.3", *extra[1:]]), work / "quality.log")
        train, validation = decoded(out, "train", args.tokenizer), decoded(out, "validation", args.tokenizer)
        stats = json.loads(summary.read_text())["stats"]
        results["settings"][setting] = {
            "against word 5-grams": score(distinct, truths["words"], train, validation),
            "against token 5-grams": score(distinct, truths["tokens"], train, validation),
            "near_dedup": stats["near_dedup"], "cpu_seconds": measured["cpu_seconds"]}
        clear(out)
    return results


# ---------------------------------------------------------------------------------------------

def cost(args, work: Path) -> dict:
    scaled = work / f"input-{args.scale}x.jsonl"
    repeat_file(Path(args.input), scaled, args.scale)
    input_gb = scaled.stat().st_size / 1e9
    runs = {k: [] for k in COST_RUNS}
    for r in range(args.rounds):
        wait_for_load(args.wait_load * 2, 600) if args.wait_load else None
        for k, extra in COST_RUNS.items():
            runs[k].append(measured_run(work, f"cost-{k}", scaled, args.tokenizer, extra))
            note(f"round {r + 1} ({k}) {runs[k][-1]}")
    medians = {k: {m: median([x[m] for x in v]) for m in ("wall_seconds", "cpu_seconds", "peak_rss_mb")}
               for k, v in runs.items()}
    out = {"scale": args.scale, "input_gb": round(input_gb, 3), "runs": runs, "medians": medians,
           "ratios": {k: {m: round(medians[k][m] / medians["a"][m], 3) for m in ("wall_seconds", "cpu_seconds")}
                      for k in ("b", "c")}}
    scaled.unlink()
    if not args.no_1x:
        one_gb = Path(args.input).stat().st_size / 1e9
        out["1x"] = {k: measured_run(work, f"cost1x-{k}", Path(args.input), args.tokenizer, COST_RUNS[k])
                     for k in ("a", "b")}
        grow = (medians["b"]["peak_rss_mb"] - out["1x"]["b"]["peak_rss_mb"]) * 1.048576 / 1000
        out["rss_growth_gb_per_gb"] = round(grow / max(input_gb - one_gb, 1e-9), 3)
    return out


def short_corpus(source: Path, out: Path, documents: int, size: int, seed: int) -> int:
    """Writes `documents` documents of about `size` bytes made of the texts' lines; returns
    the bytes written."""
    lines = [line for raw in open(source, encoding="utf-8") for line in json.loads(raw).get("text", "").split("\n")
             if line.strip()]
    rng = random.Random(seed)
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        at = 0
        for d in range(documents):
            doc, n = [], 0
            while n < size:
                if at < len(lines):  # the input's lines in order first, then drawn at random
                    line, at = lines[at], at + 1
                else:
                    line = rng.choice(lines)
                doc.append(line)
                n += len(line.encode("utf-8")) + 1
            text = json.dumps({"text": "\n".join(doc)}, ensure_ascii=False) + "\n"
            f.write(text)
            written += len(text.encode("utf-8"))
    return written


def cost_short(args, work: Path) -> dict:
    if args.short_corpus:
        corpus = Path(args.short_corpus)
        size = corpus.stat().st_size
        with open(corpus, "rb") as f:
            documents = sum(1 for _ in f)
    else:
        corpus = work / "short.jsonl"
        size = short_corpus(Path(args.input), corpus, args.short_documents, args.short_bytes, args.seed)
        documents = args.short_documents
    runs = {k: [] for k in ("a", "b")}
    for r in range(args.rounds):
        wait_for_load(args.wait_load * 2, 600) if args.wait_load else None
        for k in runs:
            runs[k].append(measured_run(work, f"short-{k}", corpus, args.tokenizer, COST_RUNS[k]))
            note(f"short round {r + 1} ({k}) {runs[k][-1]}")
    if not args.short_corpus:
        corpus.unlink()
    medians = {k: {m: median([x[m] for x in v]) for m in ("wall_seconds", "cpu_seconds", "peak_rss_mb")}
               for k, v in runs.items()}
    return {"corpus": str(args.short_corpus or "cut from the input's lines"), "documents": documents, "bytes": size,
            "runs": runs, "medians": medians,
            "cpu_ratio": round(medians["b"]["cpu_seconds"] / medians["a"]["cpu_seconds"], 3)}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(results: dict) -> None:
    s = results.get("short")
    if s:
        print(f"cost on short documents: {s['documents']:,} documents, {s['bytes'] / 1e6:.1f} MB "
              f"({s['bytes'] / max(s['documents'], 1) / 1e3:.2f} KB each; {s['corpus']}), "
              f"{len(s['runs']['a'])} alternated rounds")
        for k, m in s["medians"].items():
            print(f"  ({k}) {'--dedup exact' if k == 'a' else '--dedup near'}: wall {m['wall_seconds']:.1f} s  "
                  f"CPU {m['cpu_seconds']:.1f} s  peak RSS {m['peak_rss_mb']:.0f} MB")
        print(f"  short documents: --dedup near CPU / --dedup exact CPU = {s['cpu_ratio']:.3f} "
              f"(target <= {TARGET_CPU_RATIO}): {verdict(s['cpu_ratio'] <= TARGET_CPU_RATIO)}")
    c = results.get("cost")
    if c:
        print(f"cost: the input {c['scale']}x ({c['input_gb']:.2f} GB), {len(c['runs']['a'])} alternated rounds")
        print("  every round (wall s / CPU s / peak RSS MB):")
        names = {"a": "(a) --dedup exact", "b": "(b) --dedup near (words)", "c": "(c) --dedup near tokens"}
        for k, v in c["runs"].items():
            print(f"    {names[k]:28s} " + "  ".join(f"{x['wall_seconds']:.1f}/{x['cpu_seconds']:.1f}/"
                                                    f"{x['peak_rss_mb']:.0f}" for x in v))
        print("  medians:")
        for k, m in c["medians"].items():
            print(f"    {names[k]:28s} wall {m['wall_seconds']:.1f} s  CPU {m['cpu_seconds']:.1f} s  "
                  f"peak RSS {m['peak_rss_mb']:.0f} MB")
        for k in ("b", "c"):
            print(f"  ratio {k}/a: wall {c['ratios'][k]['wall_seconds']:.3f}  CPU {c['ratios'][k]['cpu_seconds']:.3f}")
        if "1x" in c:
            for k, x in c["1x"].items():
                print(f"  1x {names[k]:25s} wall {x['wall_seconds']:.1f} s  CPU {x['cpu_seconds']:.1f} s  "
                      f"peak RSS {x['peak_rss_mb']:.0f} MB")
            print(f"  (b) peak RSS growth: {c['rss_growth_gb_per_gb']:.3f} GB per GB of input")
        print("  targets:")
        ok = c["ratios"]["b"]["cpu_seconds"] <= TARGET_CPU_RATIO
        print(f"    {c['scale']}x: --dedup near CPU / --dedup exact CPU = {c['ratios']['b']['cpu_seconds']:.3f} "
              f"(target <= {TARGET_CPU_RATIO}): {verdict(ok)}")
        if "1x" in c:
            ok = c["1x"]["b"]["peak_rss_mb"] <= TARGET_RSS_MB
            print(f"    1x: peak RSS <= {TARGET_RSS_MB:,} MB: {c['1x']['b']['peak_rss_mb']:.0f} "
                  f"{'met' if ok else 'NOT met'}")
            ok = c["rss_growth_gb_per_gb"] <= TARGET_RSS_GROWTH
            print(f"    {c['scale']}x: peak RSS grows <= {TARGET_RSS_GROWTH} GB per GB: "
                  f"{c['rss_growth_gb_per_gb']:.3f} {'met' if ok else 'NOT met'}")
    q = results.get("quality")
    if q:
        print(f"quality: {q['documents']:,} documents, {q['planted']:,} of them planted near-copies; threshold "
              f"{THRESHOLD}; scored against brute-force Jaccard over every pair")
        for setting, r in q["settings"].items():
            print(f"  --near_shingle {setting}: CPU {r['cpu_seconds']:.1f} s; stats {json.dumps(r['near_dedup'])}")
            for truth in ("against word 5-grams", "against token 5-grams"):
                s = r[truth]
                print(f"    {truth:22s} recall {s['recall']} of {s['pairs_at_threshold_plus_0.05']:,} pairs >= "
                      f"{THRESHOLD + 0.05:.2f}; precision {s['precision']} of {s['removed']:,} removed; "
                      f"{s['pairs_across_splits']} pairs >= {THRESHOLD} across train and validation")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text_key", default="text")
    p.add_argument("--scale", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no_1x", action="store_true", help="skip the 1x runs (RSS growth)")
    p.add_argument("--no_cost", action="store_true")
    p.add_argument("--no_quality", action="store_true")
    p.add_argument("--short_documents", type=int, default=100_000,
                   help="documents of the short-document corpus (0: skip it)")
    p.add_argument("--short_bytes", type=int, default=2048, help="bytes of each short document, about")
    p.add_argument("--short_corpus", help="a JSONL file of short documents, used as it is (e.g. from make_corpus.py "
                                          "--max-doc-chars 2400) instead of --short_documents cut from --input")
    p.add_argument("--quality_documents", type=int, default=3000)
    p.add_argument("--quality_setting", action="append",
                   help="'SHINGLE [more --dedup near options]'; repeatable (default: "
                        + "; ".join(DEFAULT_QUALITY_SETTINGS) + ")")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait_load", type=float, default=0.0, help="wait for the load average to fall below 2x this")
    p.add_argument("--json")
    p.add_argument("--workdir")
    args = p.parse_args(argv)
    args.quality_setting = args.quality_setting or list(DEFAULT_QUALITY_SETTINGS)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {"subreaper": become_subreaper(), "bytecode_compiled": compile_project()}
    try:
        if args.short_documents or args.short_corpus:
            results["short"] = cost_short(args, work)
        if not args.no_cost:
            results["cost"] = cost(args, work)
        if not args.no_quality:
            results["quality"] = quality(args, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
