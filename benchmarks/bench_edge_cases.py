"""Resource edge cases: one very long document, and millions of tiny ones.

    python benchmarks/bench_edge_cases.py --tokenizer TOKENIZER.json [--long_mb 16] [--tiny 2000000]

Prints, for each case, the pipeline's wall time, peak RSS (the whole process tree of the
run), and documents/s or MB/s, so a regression in memory or per-document overhead shows.
Uses the real entry point (`python -m pipeline.run`) with default options.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = ("the of and to in is for that with as on by this be are from at or an it not which "
         "data token model pipeline beam zarr shard chunk écrit naïve Größe 東京 данные 😀").split()


def write_long_document(path: Path, megabytes: int) -> None:
    """One JSONL line holding `megabytes` of word-like text (real tokenizers need spaces)."""
    words, size, i = [], 0, 0
    while size < megabytes << 20:
        w = WORDS[(i * 7919) % len(WORDS)]
        words.append(w)
        size += len(w.encode()) + 1
        i += 1
    path.write_text(json.dumps({"text": " ".join(words)}, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tiny_documents(path: Path, count: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            f.write(json.dumps({"text": f"{WORDS[i % len(WORDS)]} {i}"}, ensure_ascii=False) + "\n")


# Runs a command and prints its process tree's peak RSS: RUSAGE_CHILDREN keeps the maximum
# over all children ever waited for, so each measured run needs a parent of its own.
_PEAK_RSS = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def run(args: list[str]) -> dict:
    """Runs the pipeline; returns wall seconds, peak RSS (MB) and the summary."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        started = time.perf_counter()
        peak_kb = subprocess.run(
            [sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "pipeline.run", *args,
             "--output", f"{tmp}/out.zarr", "--quiet", "--summary_json", str(summary)],
            cwd=REPO, check=True, capture_output=True, text=True).stdout.split()[-1]
        wall = time.perf_counter() - started
        return {"wall_seconds": wall, "peak_rss_mb": int(peak_kb) / 1024, "summary": json.loads(summary.read_text())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=str(REPO / "pipeline" / "sample" / "tokenizer.json"))
    ap.add_argument("--long_mb", type=int, default=16)
    ap.add_argument("--tiny", type=int, default=2_000_000)
    a = ap.parse_args(argv)
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}, tokenizer {a.tokenizer}")
    with tempfile.TemporaryDirectory() as tmp:
        long_doc = Path(tmp) / "long.jsonl"
        write_long_document(long_doc, a.long_mb)
        r = run(["--input", str(long_doc), "--tokenizer", a.tokenizer])
        tokens = r["summary"]["tokens"]
        print(f"one {a.long_mb} MB document: {r['wall_seconds']:.1f} s wall, peak RSS {r['peak_rss_mb']:,.0f} MB "
              f"(process tree max), {tokens:,} tokens")
        tiny = Path(tmp) / "tiny.jsonl"
        write_tiny_documents(tiny, a.tiny)
        r = run(["--input", str(tiny), "--tokenizer", a.tokenizer])
        docs = r["summary"]["stats"]["documents"]
        print(f"{docs:,} tiny documents ({tiny.stat().st_size / 2**20:.0f} MB): {r['wall_seconds']:.1f} s wall, "
              f"{docs / r['wall_seconds']:,.0f} documents/s, {r['wall_seconds'] / docs * 1e6:.2f} us/document, "
              f"peak RSS {r['peak_rss_mb']:,.0f} MB")
    print(f"load at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
