#!/usr/bin/env python3
"""Benchmark flat_tokens.reader on a committed flat-tokens dataset.

    python benchmarks/bench_reader.py --dataset out.zarr

For --rounds N (default 3) it alternates four subprocesses, each reading one split:

  (1) iterate: every sequence, ``for ids in split`` (int32 ids per sequence);
  (2) packed: one epoch of ``split.packed_batches(LENGTH, BATCH, epochs=1)`` ((inputs,
      targets) int32 batches, shuffled);
  (3) raw zarr: the leanest honest baseline, with zarr and numpy alone (no project import):
      encoded_tokens read whole chunk by whole chunk, in order, each decoded to ids and
      start flags (``v >> 1``, ``v & 1``);
  (4) per sequence: ``split.sequence(i)`` for the first --sample sequences, the access the
      iterator used before (two reads per sequence, each decompressing whole chunks).

tokens/s is measured inside the child around the reading loop alone (after imports and
opening the dataset); wall, CPU (user + sys, all threads) and peak RSS are those of the
whole child process (os.wait4). Medians of the rounds are printed, with the load average:
on a shared machine the CPU seconds are the steadier number.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("iterate", "packed", "raw", "per_sequence")
LABELS = {
    "iterate": "(1) iterate all sequences",
    "packed": "(2) packed_batches, one epoch",
    "raw": "(3) raw zarr: whole chunks in order",
    "per_sequence": "(4) sequence(i), first --sample",
}
TARGET_TOKENS_PER_SECOND = 20e6  # (1) and (2), local disk


# ---------------------------------------------------------------------------------------
# children: each prints one JSON line

def child_raw(dataset: str, split: str) -> dict:
    """zarr + numpy only: the floor any reader of this store pays (read, decompress, decode)."""
    import numpy as np
    import zarr

    tokens = zarr.open_group(dataset, mode="r")[split]["encoded_tokens"]
    chunk, n = tokens.chunks[0], tokens.shape[0]
    started, cpu = time.perf_counter(), time.process_time()
    count = flags = 0
    for lo in range(0, n, chunk):
        v = tokens[lo:lo + chunk]
        ids = (v >> np.uint32(1)).astype(np.int32)
        starts = (v & np.uint32(1)).astype(bool)
        count += ids.size
        flags += int(starts[0])  # touch the result
    return {"tokens": int(count), "loop_seconds": time.perf_counter() - started,
            "loop_cpu_seconds": time.process_time() - cpu}


def child_reader(mode: str, dataset: str, split: str, length: int, batch: int, sample: int) -> dict:
    sys.path.insert(0, str(REPO))
    from flat_tokens.reader import FlatTokensSplit

    data = FlatTokensSplit(dataset, split)
    started, cpu = time.perf_counter(), time.process_time()
    count, items = 0, 0
    if mode == "iterate":
        for ids in data:
            count += ids.size
            items += 1
    elif mode == "packed":
        for inputs, targets in data.packed_batches(length, batch, epochs=1):
            count += targets.size
            items += 1
    elif mode == "per_sequence":
        for i in range(min(sample, len(data))):
            count += data.sequence(i).size
            items += 1
    return {"tokens": int(count), "items": items, "loop_seconds": time.perf_counter() - started,
            "loop_cpu_seconds": time.process_time() - cpu}


# ---------------------------------------------------------------------------------------
# the parent

def run_child(args, mode: str, log: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--dataset", args.dataset, "--split", args.split,
           "--length", str(args.length), "--batch", str(args.batch), "--sample", str(args.sample)]
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: {mode} failed; log {log}:\n{text[-4000:]}")
    result = json.loads(text.strip().splitlines()[-1])
    result.update(wall_seconds=wall, cpu_seconds=usage.ru_utime + usage.ru_stime,
                  peak_rss_mb=usage.ru_maxrss / 1024)
    result["tokens_per_second"] = result["tokens"] / result["loop_seconds"] if result["loop_seconds"] else 0.0
    return result


def median_of(runs: list[dict]) -> dict:
    keys = ("tokens_per_second", "loop_seconds", "loop_cpu_seconds", "wall_seconds", "cpu_seconds", "peak_rss_mb")
    m = {k: statistics.median(r[k] for r in runs) for k in keys}
    m["tokens"] = runs[0]["tokens"]
    m["all_tokens_per_second"] = [r["tokens_per_second"] for r in runs]
    return m


def describe(dataset: str, split: str) -> dict:
    import zarr

    g = zarr.open_group(dataset, mode="r")[split]
    tokens, starts = g["encoded_tokens"], g["seq_starts"]
    on_disk = sum(p.stat().st_size for p in Path(dataset, split).rglob("*") if p.is_file()) if Path(dataset).exists() else None
    return {"tokens": int(tokens.shape[0]), "sequences": int(starts.shape[0]) - 1,
            "tokens_chunk": int(tokens.chunks[0]), "seq_starts_chunk": int(starts.chunks[0]),
            "compressors": str(tokens.compressors), "zarr_format": tokens.metadata.zarr_format,
            "bytes_on_disk": on_disk}


def report(r: dict) -> list[str]:
    d = r["dataset_info"]
    lines = [
        "flat-tokens-beam reader benchmark",
        f"  dataset: {r['dataset']} split {r['split']}: {d['tokens']:,} tokens, {d['sequences']:,} sequences "
        f"(mean {d['tokens'] / max(1, d['sequences']):,.0f} tokens), zarr v{d['zarr_format']}, chunks "
        f"{d['tokens_chunk']:,} tokens / {d['seq_starts_chunk']:,} starts, {d['compressors']}"
        + (f", {d['bytes_on_disk'] / 1e6:,.1f} MB on disk" if d["bytes_on_disk"] else ""),
        f"  machine: {r['cpu_count']} cores (os.cpu_count); load average (1/5/15 min) at start "
        f"{'/'.join(f'{x:.2f}' for x in r['load_average_start'])}, at end "
        f"{'/'.join(f'{x:.2f}' for x in r['load_average_end'])}",
        f"  packed: length {r['length']}, batch {r['batch']}; per sequence: first {r['sample']} sequences",
        "",
        f"medians of {r['rounds']} alternated rounds (tokens/s over the reading loop; wall, CPU = user+sys of all "
        "threads, and peak RSS of the whole child process)",
        f"  {'run':40s} {'tokens/s':>13s} {'loop s':>7s} {'loop CPU s':>10s} {'wall s':>7s} {'CPU s':>6s} "
        f"{'peak RSS MB':>11s}  tokens/s of each round",
    ]
    for mode in MODES:
        m = r["medians"][mode]
        rounds = " ".join(f"{x / 1e6:.2f}M" for x in m["all_tokens_per_second"])
        lines.append(f"  {LABELS[mode]:40s} {m['tokens_per_second']:13,.0f} {m['loop_seconds']:7.2f} "
                     f"{m['loop_cpu_seconds']:10.2f} {m['wall_seconds']:7.2f} {m['cpu_seconds']:6.2f} "
                     f"{m['peak_rss_mb']:11,.0f}  {rounds}")
    med = r["medians"]
    lines += ["", f"  tokens: iterate {med['iterate']['tokens']:,}, packed {med['packed']['tokens']:,} "
                  f"(full windows), raw {med['raw']['tokens']:,}, per sequence {med['per_sequence']['tokens']:,}"]
    raw = med["raw"]["tokens_per_second"]
    for mode in ("iterate", "packed"):
        lines.append(f"  {LABELS[mode]}: {med[mode]['tokens_per_second'] / raw:.2f}x the raw zarr baseline's tokens/s"
                     if raw else "")
    if med["per_sequence"]["tokens_per_second"]:
        lines.append(f"  iterate vs per-sequence access: "
                     f"{med['iterate']['tokens_per_second'] / med['per_sequence']['tokens_per_second']:.0f}x")
    lines += ["", "targets (local disk)"]
    for mode in ("iterate", "packed"):
        v = med[mode]["tokens_per_second"]
        lines.append(f"  {LABELS[mode]} >= {TARGET_TOKENS_PER_SECOND / 1e6:.0f}M tokens/s: {v / 1e6:.1f}M  "
                     f"{'PASS' if v >= TARGET_TOKENS_PER_SECOND else 'FAIL'}")
    return lines


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="a committed flat-tokens dataset (local path)")
    p.add_argument("--split", default="train", choices=("train", "validation"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--length", type=int, default=2048, help="packed window length (default 2048)")
    p.add_argument("--batch", type=int, default=32, help="packed batch size (default 32)")
    p.add_argument("--sample", type=int, default=300, help="sequences read by (4) (default 300)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.length < 1 or args.batch < 1 or args.sample < 1:
        p.error("--rounds, --length, --batch and --sample must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child == "raw":
        print(json.dumps(child_raw(args.dataset, args.split)))
        return 0
    if args.child:
        print(json.dumps(child_reader(args.child, args.dataset, args.split, args.length, args.batch, args.sample)))
        return 0
    results = {"dataset": args.dataset, "split": args.split, "rounds": args.rounds, "length": args.length,
               "batch": args.batch, "sample": args.sample, "cpu_count": os.cpu_count(),
               "load_average_start": os.getloadavg(), "dataset_info": describe(args.dataset, args.split)}
    runs = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-reader-") as work:
        for k in range(args.rounds):
            for mode in MODES:
                r = run_child(args, mode, Path(work) / f"{mode}-{k}.log")
                runs[mode].append(r)
                print(f"bench: round {k + 1}: {mode} {r['tokens_per_second'] / 1e6:.1f}M tokens/s, "
                      f"wall {r['wall_seconds']:.2f} s", file=sys.stderr, flush=True)
    results["load_average_end"] = os.getloadavg()
    results["runs"] = runs
    results["medians"] = {mode: median_of(runs[mode]) for mode in MODES}
    print("\n".join(report(results)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
