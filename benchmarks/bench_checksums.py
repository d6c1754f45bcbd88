#!/usr/bin/env python3
"""What checksums cost (issue 27): writing and reading with them, against without.

    python benchmarks/bench_checksums.py --input corpus.jsonl --tokenizer tokenizer.json \\
        [--before CHECKOUT] [--rounds 3] [--json results.json]

Target: writing and reading with checksums cost at most 3% more CPU than without, on the
benchmark corpus. Three measurements, each in rounds that alternate with and without:

  (A) writing, end to end (only with --before: a checkout of this repository from before
      chunks carried checksums, e.g. `git worktree add /tmp/before <commit>`): the pipeline
      from CHECKOUT and from this one, whole processes, default options; wall, CPU
      (user+sys) and peak RSS of each run. Anything else that differs between the two
      checkouts counts too, so the commit just before the checksums is the fair choice.
  (B) what checksums add to writing, one core, in this process, over every chunk of the
      dataset (A) wrote: zstd-1 with the CRC-32C frame after each frame against plain
      zstd-1 (the chunk writer's work), and the CRC-32C of the staged ids (each batch's
      ids, summed as they are staged); in CPU seconds, and as a share of the pipeline's CPU.
      With the pipeline's malloc settings (pipeline/local/allocator.py: freed memory is reused), as
      a local run has them: otherwise every new chunk object costs fresh pages.
  (C) reading: `for ids in split` over the train split (and one epoch of
      `packed_batches(2048, 32)`), each in a process of its own, on the dataset as written
      and on a copy with its checksums stripped (plain zstd frames, no `storage.checksums`:
      the format before, which the reader reads unchecked); CPU of the reading loop.

Prints a table of every round and the medians; --json writes everything.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import wait_for_load  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TARGET = 0.03  # at most 3% more CPU
READS = ("iterate", "packed")


def note(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------
# (C) reading, in a child process: prints one JSON line

def child_read(mode: str, dataset: str) -> dict:
    sys.path.insert(0, str(REPO))
    from flat_tokens.reader import FlatTokensSplit

    split = FlatTokensSplit(dataset, "train")
    started, cpu, count = time.perf_counter(), time.process_time(), 0
    if mode == "iterate":
        for ids in split:
            count += ids.size
    else:
        # An epoch is num_windows // batch_size full batches (docs/reader.md): a small split
        # (the smoke test's) is read in batches of what it holds.
        batch_size = max(1, min(32, split.num_windows(2048)))
        for _, targets in split.packed_batches(2048, batch_size, epochs=1):
            count += targets.size
    return {"tokens": count, "loop_seconds": time.perf_counter() - started,
            "loop_cpu_seconds": time.process_time() - cpu, "checksums": split.chunk_checksums}


def run_read(mode: str, dataset: Path, log: Path) -> dict:
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--dataset", str(dataset)], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    text = log.read_text(errors="replace")
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"bench: reading {dataset} ({mode}) failed; log {log}:\n{text[-4000:]}")
    r = json.loads(text.strip().splitlines()[-1])
    r.update(wall_seconds=time.perf_counter() - started, cpu_seconds=usage.ru_utime + usage.ru_stime)
    return r


# ---------------------------------------------------------------------------------------
# datasets

def chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*/*") if p.is_file() and not p.name.startswith("."))


def strip_checksums(src: Path, dst: Path) -> None:
    """A copy of a zarr 2 zstd dataset as written before chunks carried checksums
    (bit_flips.strip_checksums does the stripping, for both benchmarks)."""
    from bit_flips import strip_checksums as strip_in_place  # beside this file, on sys.path

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    strip_in_place(dst)


def chunk_values(root: Path) -> list:
    """Every chunk's values, as the writer encodes them (uint32 tokens, uint64 starts)."""
    import numcodecs
    import numpy as np

    out = []
    reader = numcodecs.Zstd()
    for path in chunk_files(root):
        dtype = np.uint32 if path.parent.name == "encoded_tokens" else np.uint64
        if path.parent.name in ("encoded_tokens", "seq_starts"):
            out.append(np.frombuffer(reader.decode(path.read_bytes()), dtype).copy())
    return out


# ---------------------------------------------------------------------------------------
# (B) the added work, one core

def best_cpu(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.process_time()
        fn()
        times.append(time.process_time() - started)
    return min(times)


def added_work(values: list, rounds: int) -> dict:
    import numcodecs
    import numpy as np

    from pipeline.local import allocator
    from flat_tokens.format.checksums import Sum
    from flat_tokens.format import chunk_checksums

    allocator.keep_freed_memory_for_reuse()  # as the pipeline's local runs do: freed memory reused
    plain = numcodecs.Zstd(level=1)
    encoded_plain = [plain.encode(v) for v in values]
    encoded_checked = [chunk_checksums.seal_zstd_frame(e) for e in encoded_plain]
    decoder = numcodecs.Zstd()
    # the staged ids: each token's id (value >> 1) in its narrowest type, about a batch at a time
    tokens = [v for v in values if v.dtype == np.uint32]
    ids = [(v >> np.uint32(1)).astype(np.uint16 if not v.size or v.max() >> 1 < 1 << 16 else np.uint32)
           for v in tokens]
    r = {
        "encode_plain": best_cpu(lambda: [plain.encode(v) for v in values], rounds),
        # what ChunkWriter does: the frame, the CRC-32C frame after it, and the Sum of the
        # object for the shard record
        "encode_checked": best_cpu(lambda: [chunk_checksums.sealed_zstd_frame(plain.encode(v))
                                            for v in values], rounds),
        "staged_ids_sums": best_cpu(lambda: [Sum.of(i) for i in ids], rounds),
        "decode_plain": best_cpu(lambda: [decoder.decode(e) for e in encoded_plain], rounds),
        "decode_checked": best_cpu(lambda: [(chunk_checksums.problem(e, chunk_checksums.ZSTD_FRAME),
                                             decoder.decode(e)) for e in encoded_checked], rounds),
        "chunks": len(values), "values_bytes": sum(v.nbytes for v in values),
        "stored_bytes_plain": sum(len(e) for e in encoded_plain),
        "stored_bytes_checked": sum(len(e) for e in encoded_checked),
    }
    r["write_added"] = r["encode_checked"] - r["encode_plain"] + r["staged_ids_sums"]
    r["read_added"] = r["decode_checked"] - r["decode_plain"]
    return r


# ---------------------------------------------------------------------------------------

def pipeline_cmd(checkout: Path, args, output: Path, summary: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline.run", "--input", str(Path(args.input).resolve()), "--tokenizer",
            str(Path(args.tokenizer).resolve()), "--output", str(output), "--overwrite", "--quiet",
            "--summary_json", str(summary)]


def write_round(checkout: Path, args, output: Path, log: Path) -> dict:
    """One pipeline run from `checkout` (`python -m` finds the package in its working
    directory first): wall, CPU (user+sys) and peak RSS of the process."""
    summary = output.with_suffix(".summary.json")
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(pipeline_cmd(checkout, args, output, summary), cwd=checkout, stdout=out,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"bench: the pipeline from {checkout} failed; log {log}:\n{log.read_text(errors='replace')[-4000:]}")
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "tokens": json.loads(summary.read_text())["tokens"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input")
    ap.add_argument("--tokenizer")
    ap.add_argument("--before", help="a checkout from before chunks carried checksums, for (A)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait_load", type=float, default=None, help="before each round, wait until the 1-minute "
                    "load average is below this (at most 10 minutes)")
    ap.add_argument("--workdir")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=READS, help=argparse.SUPPRESS)
    ap.add_argument("--dataset", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child_read(args.child, args.dataset)))
        return 0
    if not (args.input and args.tokenizer):
        ap.error("--input and --tokenizer are required")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-checksums-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {"input": args.input, "tokenizer": args.tokenizer, "rounds": args.rounds, "before": args.before,
               "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(), "write": {}, "read": {}}
    try:
        after = work / "after.zarr"
        # (A) writing end to end, alternated
        writes = {"before": [], "after": []}
        kinds = ("before", "after") if args.before else ("after",)
        for k in range(args.rounds if args.before else 1):
            for kind in kinds:
                if args.wait_load:
                    wait_for_load(args.wait_load, 600)
                checkout = Path(args.before).resolve() if kind == "before" else REPO
                r = write_round(checkout, args, work / f"{kind}.zarr", work / f"{kind}-{k}.log")
                writes[kind].append(r)
                note(f"round {k + 1}: write {kind}: CPU {r['cpu_seconds']:.2f} s, wall {r['wall_seconds']:.2f} s")
        results["write"] = {kind: runs for kind, runs in writes.items() if runs}
        pipeline_cpu = median([r["cpu_seconds"] for r in writes["after"]])
        # (B) the added work
        values = chunk_values(after)
        results["added"] = added_work(values, max(3, args.rounds))
        # (C) reading, alternated
        stripped = work / "stripped.zarr"
        strip_checksums(after, stripped)
        reads = {f"{mode} {kind}": [] for mode in READS for kind in ("without", "with")}
        for k in range(args.rounds):
            for mode in READS:
                for kind, dataset in (("without", stripped), ("with", after)):
                    if args.wait_load:
                        wait_for_load(args.wait_load, 600)
                    r = run_read(mode, dataset, work / f"read-{mode}-{kind}-{k}.log")
                    reads[f"{mode} {kind}"].append(r)
                    note(f"round {k + 1}: read {mode} {kind} checksums: loop CPU {r['loop_cpu_seconds']:.2f} s")
        results["read"] = reads
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    results["load_average_end"] = os.getloadavg()

    lines = [f"checksums: what they cost (issue 27 target: <= {TARGET:.0%} more CPU), {os.cpu_count()} cores, load "
             f"{'/'.join(f'{x:.2f}' for x in results['load_average_start'])} at start, "
             f"{'/'.join(f'{x:.2f}' for x in results['load_average_end'])} at end"]
    summary = {}
    if args.before:
        b = {key: median([r[key] for r in writes["before"]]) for key in ("cpu_seconds", "wall_seconds", "peak_rss_mb")}
        a = {key: median([r[key] for r in writes["after"]]) for key in ("cpu_seconds", "wall_seconds", "peak_rss_mb")}
        summary["write_end_to_end"] = a["cpu_seconds"] / b["cpu_seconds"] - 1
        rounds_cpu = {kind: [r["cpu_seconds"] for r in writes[kind]] for kind in writes}
        lines += [f"(A) writing end to end, medians of {args.rounds} alternated rounds (each round's CPU s: before "
                  f"{rounds_cpu['before']}, after {rounds_cpu['after']})",
                  f"  without checksums ({args.before}): CPU {b['cpu_seconds']:.2f} s, wall {b['wall_seconds']:.2f} s, "
                  f"peak RSS {b['peak_rss_mb']:.0f} MB",
                  f"  with checksums (this checkout):  CPU {a['cpu_seconds']:.2f} s, wall {a['wall_seconds']:.2f} s, "
                  f"peak RSS {a['peak_rss_mb']:.0f} MB",
                  f"  CPU: {summary['write_end_to_end']:+.1%}  "
                  f"{'PASS' if summary['write_end_to_end'] <= TARGET else 'FAIL'} (target <= +{TARGET:.0%})"]
    d = results["added"]
    summary["write_added"] = d["write_added"] / pipeline_cpu
    summary["read_added_decode"] = d["read_added"] / d["decode_plain"]
    lines += [f"(B) the work checksums add, one core, best of {max(3, args.rounds)}, over the {d['chunks']} chunks "
              f"({d['values_bytes'] / 1e6:,.0f} MB of values; stored {d['stored_bytes_plain'] / 1e6:,.1f} MB plain, "
              f"{d['stored_bytes_checked'] / 1e6:,.1f} MB with checksums)",
              f"  encode: zstd-1 {d['encode_plain']:.3f} s; with the CRC-32C frame and the object's Sum "
              f"{d['encode_checked']:.3f} s",
              f"  staged ids' CRC-32C: {d['staged_ids_sums']:.3f} s",
              f"  writing adds {d['write_added']:.3f} s of CPU: {summary['write_added']:+.2%} of the pipeline's "
              f"{pipeline_cpu:.2f} s  {'PASS' if summary['write_added'] <= TARGET else 'FAIL'}",
              f"  decode: zstd {d['decode_plain']:.3f} s; with the CRC-32C check {d['decode_checked']:.3f} s: "
              f"{summary['read_added_decode']:+.1%}"]
    lines.append(f"(C) reading the train split, loop CPU, medians of {args.rounds} alternated rounds")
    for mode in READS:
        without = median([r["loop_cpu_seconds"] for r in reads[f"{mode} without"]])
        with_ = median([r["loop_cpu_seconds"] for r in reads[f"{mode} with"]])
        summary[f"read_{mode}"] = with_ / without - 1
        each = {kind: [round(r["loop_cpu_seconds"], 3) for r in reads[f"{mode} {kind}"]]
                for kind in ("without", "with")}
        lines.append(f"  {mode:8}: without checksums {without:.3f} s {each['without']}, with {with_:.3f} s "
                     f"{each['with']}: {summary[f'read_{mode}']:+.1%}  {'PASS' if summary[f'read_{mode}'] <= TARGET else 'FAIL'}")
    results["summary"] = summary
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
