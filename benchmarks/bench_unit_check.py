#!/usr/bin/env python3
"""What checking staged units' input bytes costs (issue 27.4), next to a whole run.

    python benchmarks/bench_unit_check.py --input /tmp/bench/corpus250.jsonl --tokenizer /tmp/bench/gpt2.json

A staged unit is reused by a rerun only while its input bytes are those it was read from:
the reader records each unit's stored bytes (spans and an xxh3-128 digest) as it reads them, and the
launcher of a rerun reads those spans again (pipeline/resume.py, `unchanged_units`). For
--rounds N (default 3) it measures, in this process (wall, and CPU of all its threads):

  (a) read: the file read in 4 MiB blocks, nothing else (the baseline: no project code);
  (b) read + digest: the same, hashed with xxh3-128 as the reader does (baseline);
  (c) the reader, not recording: ReadRangeFn over every unit of the job (JSONL parsed,
      batches made), as a run with --no_staging reads;
  (d) the reader, recording: the same with each unit's stored bytes hashed, as every run
      with a staging area (the default) now reads: (d) - (c) is what recording costs;
  (e) the resume check: `unchanged_units` over every unit staged whole (their accounts read
      back from a staging area, their spans read again and hashed, 8 threads);

and once, as a subprocess (interpreter, imports and tokenizer load included):

  (f) an uninterrupted run: `python -m pipeline.run`, default options.

It prints each round, the medians, and (e)/(f) and ((d)-(c))/(f): the share of a run that a
resume's check, and the recording, cost. Run it on a quiet machine: it reads the input
from the page cache (a first read warms it).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import xxhash

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import run_measured  # noqa: E402

BLOCK = 1 << 22


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measured(fn) -> dict:
    wall, used = time.perf_counter(), cpu()
    fn()
    return {"wall_seconds": round(time.perf_counter() - wall, 3), "cpu_seconds": round(cpu() - used, 3)}


def plain_read(path: Path, hashed: bool) -> None:
    digest = xxhash.xxh3_128() if hashed else None
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                break
            if digest is not None:
                digest.update(block)


def job_units(input_path: Path, tokenizer: str):
    from pipeline.options import FlatTokensOptions, ViewsMadeOnce
    from pipeline.plan import plan_job
    options = ViewsMadeOnce(["--input", str(input_path), "--tokenizer", tokenizer, "--output",
                             str(input_path) + ".unused.zarr"]).view_as(FlatTokensOptions)
    return plan_job(options)


def read_units(plan, record: bool) -> list:
    """Every unit through the reader, as a run reads it; the StoredBytes of each when recording."""
    from transforms.read.jsonl_documents import ReadRangeFn
    reader = ReadRangeFn(plan.text_key, 1 << 23, plan.batch_documents, None)
    reader.setup()
    reader.record_stored = record
    stored = []
    for unit in plan.read_ranges():
        for _ in reader.process(unit):
            pass
        stored.append(reader.last_stored)
    return stored


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, type=Path)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit_mb", type=float, default=0, help="use only the input's first MB (a smoke run)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args(argv)

    from pipeline import resume
    from transforms.staging import StagingArea

    work = Path(tempfile.mkdtemp(prefix="bench-unit-check-"))
    try:
        source = args.input
        if args.limit_mb:
            source = work / "input.jsonl"
            with open(args.input, "rb") as f, open(source, "wb") as out:
                out.write(f.read(int(args.limit_mb * 2**20)).rsplit(b"\n", 1)[0] + b"\n")
        size = source.stat().st_size
        plan = job_units(source, args.tokenizer)
        by_key = {}
        units, _ = resume.unit_keys(plan, None, by_key)
        area = StagingArea(str(work / "out.zarr"), None, "bench", units)
        plain_read(source, False)  # warm the page cache
        stored = read_units(plan, True)
        staged = []
        for key, unit in by_key.items():
            index = plan.read_ranges().index(unit)
            area.put_unit(key, {"places": [], "counts": {}, "line_counts": None, "rejected": [],
                                "stored": stored[index].describe()})
            staged.append((key, f"unit.0.json", 0))
        rounds = []
        for r in range(args.rounds):
            row = {
                "a_read": measured(lambda: plain_read(source, False)),
                "b_read_digest": measured(lambda: plain_read(source, True)),
                "c_reader": measured(lambda: read_units(plan, False)),
                "d_reader_recording": measured(lambda: read_units(plan, True)),
                "e_resume_check": measured(lambda: resume.unchanged_units(area, staged, by_key)),
            }
            fresh, changed = resume.unchanged_units(area, staged, by_key)
            assert len(fresh) == len(staged) and not changed, "every unit must check out unchanged"
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['wall_seconds']} s wall / {v['cpu_seconds']} s cpu"
                                                 for k, v in row.items()), flush=True)
        out = work / "run.zarr"
        run = run_measured([sys.executable, "-m", "pipeline.run", "--input", str(source), "--tokenizer",
                            args.tokenizer, "--output", str(out), "--quiet"], work / "run.log")
        med = {k: {m: statistics.median(r[k][m] for r in rounds) for m in ("wall_seconds", "cpu_seconds")}
               for k in rounds[0]}
        result = {"input_bytes": size, "units": len(staged), "cores": os.cpu_count(), "medians": med,
                  "f_run": {k: run[k] for k in ("wall_seconds", "cpu_seconds", "peak_rss_mb")},
                  "load_average": os.getloadavg()}
        check = med["e_resume_check"]
        recording = {m: med["d_reader_recording"][m] - med["c_reader"][m] for m in ("wall_seconds", "cpu_seconds")}
        result["check_share_of_run"] = {m: round(check[m] / run[m], 4) for m in ("wall_seconds", "cpu_seconds")}
        result["recording_share_of_run"] = {m: round(recording[m] / run[m], 4) for m in ("wall_seconds", "cpu_seconds")}
        print(f"input: {size / 1e6:,.1f} MB in {len(staged)} units, {os.cpu_count()} cores")
        for k, v in med.items():
            print(f"  {k:20s} {v['wall_seconds']:8.3f} s wall {v['cpu_seconds']:8.3f} s cpu  "
                  f"{size / 1e6 / max(v['wall_seconds'], 1e-9):8.1f} MB/s")
        print(f"  {'f_run':20s} {run['wall_seconds']:8.3f} s wall {run['cpu_seconds']:8.3f} s cpu")
        print(f"resume check / run: {result['check_share_of_run']['wall_seconds']:.1%} of the wall, "
              f"{result['check_share_of_run']['cpu_seconds']:.1%} of the CPU")
        print(f"recording / run:    {result['recording_share_of_run']['wall_seconds']:.1%} of the wall, "
              f"{result['recording_share_of_run']['cpu_seconds']:.1%} of the CPU")
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
