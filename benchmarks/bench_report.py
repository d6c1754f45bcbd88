"""The dataset report's time against the dataset's size (issue 42: within 2x from 250 MB to 5 GB).

    .venv/bin/python benchmarks/bench_report.py [--sizes_mb 25 250] [--repeats 3] [--work DIR]
                                                [--tokenizer pipeline/sample/tokenizer.json]

For each size: a JSONL corpus of that many MB of real text (the bundled sample's docstrings,
each copy numbered so that documents differ), turned into a dataset by the pipeline (not
timed), then `flat-tokens report` run --repeats times (timed: the command's wall time, and the
report's own time as it prints it, without the interpreter's start). Prints one line per size
and the ratio of the largest to the smallest; the report reads a sample of fixed size, so the
ratio should stay near 1 however large the dataset grows.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "pipeline" / "sample"


def corpus(path: Path, megabytes: float) -> int:
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    target, written, n = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            line = json.dumps({"text": f"[{n}] {texts[n % len(texts)]}"}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode())
            n += 1
    return written


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes_mb", type=float, nargs="+", default=[25, 250])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", default=str(SAMPLE / "tokenizer.json"))
    ap.add_argument("--work", default="/tmp/bench_report")
    ap.add_argument("--report_args", default="", help="extra `flat-tokens report` options, one string")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    for mb in args.sizes_mb:
        text, out = work / f"corpus-{mb:g}MB.jsonl", work / f"ds-{mb:g}MB.zarr"
        if not (out / ".zattrs").exists() and not (out / "zarr.json").exists():
            size = corpus(text, mb)
            began = time.monotonic()
            subprocess.run([sys.executable, "-m", "pipeline.run", "--input", str(text), "--tokenizer", args.tokenizer,
                            "--output", str(out), "--overwrite", "--quiet"], check=True, env=env,
                           stdout=subprocess.DEVNULL)
            print(f"built {out}: {size / 1e6:.0f} MB of text in {time.monotonic() - began:.0f} s", flush=True)
        walls, owns = [], []
        for _ in range(args.repeats):
            began = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.report", str(out), "--html", str(work / "r.html"),
                                   *args.report_args.split()], check=True, env=env, capture_output=True, text=True)
            walls.append(time.monotonic() - began)
            owns.append(float(re.search(r"\(([\d.]+) s;", proc.stdout).group(1)))
        attrs = json.loads((out / ".zattrs").read_text()) if (out / ".zattrs").exists() else \
            json.loads((out / "zarr.json").read_text())["attributes"]
        train = attrs["stats"]["train"]
        rows.append((mb, statistics.median(walls), statistics.median(owns)))
        print(f"{mb:>8g} MB of text: {train['tokens']:>12,} train tokens, {train['sequences']:>10,} sequences, "
              f"{du(out) / 2**20:8.1f} MiB on disk | report: {statistics.median(walls):6.2f} s wall "
              f"(median of {args.repeats}), {statistics.median(owns):6.2f} s its own | {proc.stdout.strip()}",
              flush=True)
    if len(rows) > 1:
        small, large = rows[0], rows[-1]
        print(f"ratio {large[0]:g} MB / {small[0]:g} MB: {large[1] / small[1]:.2f}x wall, "
              f"{large[2] / small[2]:.2f}x the report's own time (target: within 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
