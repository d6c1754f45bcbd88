#!/usr/bin/env python3
"""The pipeline on each local way of running it: in-process, N SDK harness threads in one
process (multi_threading), N worker processes (multi_processing); against the raw limit.

    python benchmarks/bench_runners.py --input corpus.jsonl --tokenizer tokenizer.json \\
        --copies 3 --parts 16 --modes in_process,threads:2,threads:4,threads:8,threads:16,processes:2

The input is written `--copies` times, its lines dealt round-robin into `--parts` JSONL files
(the corpus of issue 31: 250 MB x 3 in 16 files). Each mode runs `python -m pipeline.run`
on those files (`--quiet`, default options otherwise), each round in another order of the
modes; the baseline is benchmarks/raw_limit.py (no project imports) on the same lines in one
file. Per run, of the whole process tree:

- wall seconds (interpreter start, imports and tokenizer load included);
- CPU seconds, user + sys, children included: os.wait4's usage of the launcher counts the
  multi_processing workers it reaped (Beam waits for each);
- peak RSS: the largest sum of the RSS of the launcher and its descendants, sampled every
  0.1 s (multi_processing holds a copy of the tokenizer per worker), and the largest
  single process's (ru_maxrss);
- whether its arrays are byte-identical to the first in-process run's (the run ids differ).

Prints the rounds and the medians per mode (and the ratios to in-process); --json writes
everything. Outputs are removed at the end unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAW_LIMIT = Path(__file__).resolve().parent / "raw_limit.py"
MB = 1_000_000
PAGE = os.sysconf("SC_PAGE_SIZE")
DEFAULT_MODES = "in_process,threads:2,threads:4,threads:8,threads:16,processes:2"


def mode_flags(mode: str) -> list[str]:
    """The Beam options of a mode: in_process, threads:N or processes:N."""
    if mode == "in_process":
        return []
    kind, _, n = mode.partition(":")
    running = {"threads": "multi_threading", "processes": "multi_processing"}.get(kind)
    if running is None or not n.isdigit() or int(n) < 1:
        raise SystemExit(f"bench: --modes {mode}: use in_process, threads:N or processes:N")
    return ["--direct_running_mode", running, "--direct_num_workers", n]


def make_parts(source: Path, copies: int, parts: int, where: Path) -> tuple[list[Path], Path]:
    """`source` written `copies` times, its lines dealt round-robin into `parts` files; and the
    same lines in one file, for the raw limit."""
    where.mkdir(parents=True)
    paths = [where / f"part-{i:02d}.jsonl" for i in range(parts)]
    outs = [open(p, "wb") for p in paths]
    whole = where.parent / "all.jsonl"
    k = 0
    with open(whole, "wb") as every:
        for _ in range(copies):
            with open(source, "rb") as f:
                for line in f:
                    outs[k % parts].write(line)
                    every.write(line)
                    k += 1
    for f in outs:
        f.close()
    return paths, whole


def tree_rss_bytes(root: int) -> int:
    """RSS of `root` and every descendant, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * PAGE
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_measured(cmd: list[str], log: Path) -> dict:
    """Runs cmd from the repo root: wall, CPU (children included) and peak RSS of its tree."""
    peak = [0]
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample():
            while not done.wait(0.1):
                peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"bench: {' '.join(map(str, cmd))} exited {code}; log {log}:\n{log.read_text(errors='replace')[-4000:]}")
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_tree_rss_mb": round(peak[0] / 2**20, 1), "peak_process_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def same_arrays(a: Path, b: Path) -> bool:
    """The two datasets' arrays hold the same bytes (zarr, read block by block)."""
    import numpy as np
    import zarr
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    for split in ("train", "validation"):
        names = sorted(n for n, _ in ga[split].arrays())
        if names != sorted(n for n, _ in gb[split].arrays()):
            return False
        for name in names:
            x, y = ga[split][name], gb[split][name]
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            for lo in range(0, x.shape[0], 1 << 24):
                if not np.array_equal(x[lo:lo + (1 << 24)], y[lo:lo + (1 << 24)]):
                    return False
    return True


def median_of(runs: list[dict]) -> dict:
    keys = ("wall_seconds", "cpu_seconds", "peak_tree_rss_mb", "peak_process_rss_mb", "tokens")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="a JSONL file")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    ap.add_argument("--copies", type=int, default=1, help="the input written this many times")
    ap.add_argument("--parts", type=int, default=16, help="into this many JSONL files")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated (default {DEFAULT_MODES})")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no_baseline", action="store_true", help="skip the raw limit")
    ap.add_argument("--json", help="write everything here")
    ap.add_argument("--workdir", help="a fresh directory is made inside it")
    ap.add_argument("--keep", action="store_true", help="keep the corpus and the outputs")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    flags = {m: mode_flags(m) for m in modes}
    if "in_process" not in modes:
        modes.insert(0, "in_process")  # the reference for the ratios and the identity check
        flags["in_process"] = []
    work = Path(tempfile.mkdtemp(prefix="bench-runners-", dir=args.workdir))
    try:
        parts, whole = make_parts(Path(args.input), args.copies, args.parts, work / "parts")
        input_mb = sum(p.stat().st_size for p in parts) / MB
        load_start = os.getloadavg()
        print(f"input: {input_mb:,.1f} MB in {len(parts)} files ({args.copies} x {args.input}); "
              f"{os.cpu_count()} cores; load average {load_start[0]:.2f} at start")
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        reference = None
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                out = work / f"out-{mode.replace(':', '')}-{r}.zarr"
                summary = work / f"summary-{mode.replace(':', '')}-{r}.json"
                cmd = [sys.executable, "-m", "pipeline.run", "--input", str(work / "parts"), "--tokenizer",
                       args.tokenizer, "--output", str(out), "--quiet", "--summary_json", str(summary), *flags[mode]]
                run = run_measured(cmd, work / f"log-{mode.replace(':', '')}-{r}.txt")
                run["tokens"] = json.loads(summary.read_text())["tokens"]
                if reference is None and mode == "in_process":
                    reference = out
                run["identical"] = True if out == reference else None  # checked below, once the reference exists
                run["output"] = str(out)
                runs[mode].append(run)
                print(f"round {r + 1} {mode:>12}: wall {run['wall_seconds']:8.2f} s  CPU {run['cpu_seconds']:8.2f} s  "
                      f"peak RSS {run['peak_tree_rss_mb']:8.1f} MB (largest process {run['peak_process_rss_mb']:.1f})")
        for mode in modes:
            for run in runs[mode]:
                if run["identical"] is None:
                    run["identical"] = same_arrays(reference, Path(run["output"]))
        baseline = None
        if not args.no_baseline:
            baseline = run_measured([sys.executable, str(RAW_LIMIT), str(whole), args.tokenizer],
                                    work / "log-raw-limit.txt")
            baseline["tokens"] = json.loads((work / "log-raw-limit.txt").read_text().strip().splitlines()[-1])["tokens"]
        load_end = os.getloadavg()

        medians = {m: median_of(runs[m]) for m in modes}
        base = medians["in_process"]
        print(f"\nmedians of {args.rounds} round(s); ratios to in-process; load average {load_end[0]:.2f} at end")
        print(f"{'mode':>12} {'wall s':>9} {'CPU s':>9} {'CPU/wall':>9} {'peak RSS MB':>12} {'MB/s':>8} "
              f"{'wall x':>7} {'CPU x':>7} {'RSS x':>7}  identical")
        rows = [(m, medians[m], all(r["identical"] for r in runs[m])) for m in modes]
        if baseline:
            rows.append(("raw limit", {**baseline}, None))
        for name, m, identical in rows:
            wall, cpu, rss = m["wall_seconds"], m["cpu_seconds"], m["peak_tree_rss_mb"]
            print(f"{name:>12} {wall:9.2f} {cpu:9.2f} {cpu / wall:9.2f} {rss:12.1f} {input_mb / wall:8.2f} "
                  f"{wall / base['wall_seconds']:7.2f} {cpu / base['cpu_seconds']:7.2f} "
                  f"{rss / base['peak_tree_rss_mb']:7.2f}  {'-' if identical is None else 'yes' if identical else 'NO'}")
        tokens = {m: medians[m]["tokens"] for m in modes}
        if len(set(tokens.values())) != 1 or (baseline and baseline["tokens"] != base["tokens"]):
            print(f"bench: token counts differ: {tokens}, raw limit {baseline and baseline['tokens']}", file=sys.stderr)
            return 1
        if args.json:
            Path(args.json).write_text(json.dumps({
                "input_mb": input_mb, "files": len(parts), "copies": args.copies, "cpu_count": os.cpu_count(),
                "load_average_start": load_start, "load_average_end": load_end, "rounds": args.rounds,
                "runs": runs, "medians": medians, "raw_limit": baseline}, indent=1))
        return 0 if all(r["identical"] for m in modes for r in runs[m]) else 1
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
