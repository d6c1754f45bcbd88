#!/usr/bin/env python3
"""Benchmark --dedup_against: the dedup index's size per document, and what deduplicating a
day against 10 earlier days costs.

    python benchmarks/bench_dedup_against.py --input corpus.jsonl --tokenizer tokenizer.json

Documents: --days + 1 "days" of --documents_per_day documents each, of about --document_bytes
bytes, cut from the input's texts at line breaks (when the input holds less text, the rest
are made of its lines drawn at random, seeded: distinct documents of real lines). The last
day also repeats --repeat_fraction (10%) of the earlier days' documents.

The earlier --days (default 10) days are built with --dedup exact (not timed); the index size
is read from their stats (bytes per document: target <= 64). Then the last day is built
--rounds times (default 3), alternated: (a) --dedup exact, (b) --dedup exact --dedup_against
the earlier days. Wall, CPU (user + sys, the whole process tree) and peak RSS of each process
(interpreter start, imports and tokenizer load included), medians, and the ratio of median
CPU b/a: target <= 1.3. On a shared, loaded machine the ratio of small runs is noisy: every
round is printed.

--dedup near builds every day with --dedup near (the index then has its near part: bytes per
document are the exact and near files together), and the last day also holds near-copies of
--repeat_fraction of the earlier days' documents (one word in 100 misspelt, a letter added);
the share of them removed as near-copies of earlier texts is printed.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import median, run_measured  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TARGET_CPU_RATIO = 1.3
TARGET_INDEX_BYTES = 64


def documents(input_path: Path, n: int, size: int, seed: int = 0) -> list[str]:
    """n distinct documents of about `size` bytes: the input's text cut at line breaks, then its
    lines drawn at random."""
    lines = [line for raw in open(input_path, encoding="utf-8") for line in json.loads(raw)["text"].splitlines()
             if line.strip()]
    out, current = [], []
    for line in lines:
        current.append(line)
        if sum(len(x) + 1 for x in current) >= size:
            out.append("\n".join(current))
            current = []
        if len(out) == n:
            return out
    rng = random.Random(seed)
    seen = set(out)
    while len(out) < n:
        doc = []
        while sum(len(x) + 1 for x in doc) < size:
            doc.append(rng.choice(lines))
        text = "\n".join(doc)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def write_jsonl(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


def near_copy(text: str, rng: random.Random) -> str:
    """The text with one word in 100 misspelt (a letter added after it)."""
    words = list(re.finditer(r"\w+", text))
    for i in sorted(rng.sample(range(len(words)), max(1, len(words) // 100)), reverse=True):
        text = text[:words[i].end()] + "q" + text[words[i].end():]
    return text


def build(day: Path, tokenizer: str, out: Path, summary: Path, log: Path, extra=(), dedup="exact") -> dict:
    cmd = [sys.executable, "-m", "pipeline.run", "--input", str(day), "--tokenizer", tokenizer, "--output", str(out),
           "--overwrite", "--quiet", "--summary_json", str(summary), "--dedup", dedup, *extra]
    measured = run_measured(cmd, log)
    measured["stats"] = json.loads(summary.read_text())["stats"]
    return measured


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--documents_per_day", type=int, default=5000)
    ap.add_argument("--document_bytes", type=int, default=1024)
    ap.add_argument("--repeat_fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dedup", choices=("exact", "near"), default="exact")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args(argv)

    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-dedup-against-"))
    work.mkdir(parents=True, exist_ok=True)
    per_day = a.documents_per_day
    docs = documents(a.input, per_day * (a.days + 1), a.document_bytes)
    rng = random.Random(1)
    earlier_docs = docs[:per_day * a.days]
    repeated = int(a.repeat_fraction * per_day)
    last = docs[per_day * a.days:] + rng.sample(earlier_docs, repeated)
    if a.dedup == "near":
        last += [near_copy(t, rng) for t in rng.sample(earlier_docs, repeated)]
    earlier = []
    index_bytes = indexed = index_files = 0
    for d in range(a.days):
        day = work / f"day-{d:02d}.jsonl"
        write_jsonl(day, docs[d * per_day:(d + 1) * per_day])
        out = work / f"2024-06-{d + 1:02d}.zarr"
        s = build(day, a.tokenizer, out, work / "summary.json", work / "build.log", dedup=a.dedup)["stats"]
        index_bytes += s["dedup_index"]["bytes"] + s["dedup_index"].get("near", {}).get("bytes", 0)
        index_files += s["dedup_index"]["files"] + s["dedup_index"].get("near", {}).get("files", 0)
        indexed += s["dedup_index"]["documents"]
        earlier.append(str(out))
    per_document = index_bytes / indexed
    # Each file has a header and a seal (20 bytes); per document, what a file adds for each text.
    payload = (index_bytes - 20 * index_files) / indexed
    print(f"index: {indexed:,} documents in {a.days} datasets, {index_bytes:,} bytes in {index_files} files: "
          f"{per_document:.2f} bytes per document, {payload:.2f} without the files' 20-byte headers and seals "
          f"(target <= {TARGET_INDEX_BYTES}) {'PASS' if payload <= TARGET_INDEX_BYTES else 'FAIL'}")

    day = work / "last.jsonl"
    write_jsonl(day, last)
    against = [f"--dedup_against={e}" for e in earlier]
    runs = {"a": [], "b": []}
    for r in range(a.rounds):
        for kind, extra in (("a", ()), ("b", against)):
            m = build(day, a.tokenizer, work / f"last-{kind}.zarr", work / "summary.json", work / f"last-{kind}.log",
                      extra, a.dedup)
            m["removed"] = m["stats"].get("dedup_against", 0)
            m["removed_near"] = m["stats"].get("dedup_against_near", 0)
            m.pop("stats")
            runs[kind].append(m)
            near = (f" ({m['removed_near']} as near-copies, of {repeated} planted)" if a.dedup == "near" and kind == "b"
                    else "")
            print(f"round {r + 1} ({kind}): wall {m['wall_seconds']} s, CPU {m['cpu_seconds']} s, peak RSS "
                  f"{m['peak_rss_mb']} MB, removed as held earlier {m['removed']}{near}", flush=True)
    medians = {k: {key: median([r[key] for r in v]) for key in ("wall_seconds", "cpu_seconds", "peak_rss_mb")}
               for k, v in runs.items()}
    ratio = round(medians["b"]["cpu_seconds"] / medians["a"]["cpu_seconds"], 3)
    print(f"(a) --dedup {a.dedup}: {medians['a']}")
    print(f"(b) --dedup {a.dedup} --dedup_against {a.days} datasets: {medians['b']}")
    print(f"CPU ratio b/a: {ratio} (target <= {TARGET_CPU_RATIO}) {'PASS' if ratio <= TARGET_CPU_RATIO else 'FAIL'}")
    if a.json:
        a.json.write_text(json.dumps({"index_bytes_per_document": round(per_document, 3), "indexed": indexed,
                                      "cpu_ratio": ratio, "medians": medians, "runs": runs,
                                      "repeated": repeated, "dedup": a.dedup}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
