#!/usr/bin/env python3
"""Benchmark resuming (issue 20): what a killed run costs to finish, and what keeping its work
costs a run that is never killed.

    python benchmarks/bench_resume.py --input corpus.jsonl --tokenizer tokenizer.json --scale 5

The input is the file repeated --scale times (default 5: issue 20's targets are on the 250 MB
benchmark corpus five times over). For --rounds N (default 3) it alternates, each a whole
process (interpreter start, imports, tokenizer load included), default options otherwise:

  (a) an uninterrupted run, which keeps its work in OUTPUT/.flat-tokens-staging (the default);
  (b) the same run with --no_staging: the run as it was before issue 20;
  (c) the same run as (a), killed (SIGKILL, its whole process group) at --kill_at (0.8) of
      this round's (a) wall time, then
  (d) the same command again: it resumes. Its wall is compared with (a)'s.

Then, outside the timed rounds, one more run like (a) whose staging area is measured every
50 ms: the peak of its size on disk. The report gives every round, the medians, what each
kill left (units staged, shards recorded) and what each resume reused, and the two targets:
(d) <= 35% of (a)'s wall, and (a) <= 1.1x (b)'s wall (staging's overhead <= 10%).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import median, repeat_file, run_measured, wait_for_load  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STAGING = ".flat-tokens-staging"
TARGET_RESUMED_SHARE = 0.35  # killed at 80% of an uninterrupted run's wall, the rerun takes <= 35% of it
TARGET_OVERHEAD = 0.10  # staging adds <= 10% to an uninterrupted run's wall


def note(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def command(input_path: Path, tokenizer: Path, output: Path, summary: Path, extra=()) -> list[str]:
    return [sys.executable, "-m", "pipeline.run", "--input", str(input_path), "--tokenizer", str(tokenizer),
            "--output", str(output), "--quiet", "--summary_json", str(summary), *extra]


def clear(output: Path) -> None:
    for p in (output, Path(str(output) + ".rejected")):
        shutil.rmtree(p, ignore_errors=True)


def disk_bytes(path: Path) -> int:
    """Bytes the files under `path` take on disk (allocated blocks), 0 when it is gone."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def staged(output: Path) -> dict:
    area = output / STAGING
    return {"units": len(list(area.glob("units/*/unit.*.json"))), "shards": len(list(area.glob("shards/*/*.rec"))),
            "chunks_markers": len(list(area.glob("chunks/*/*"))), "bytes": disk_bytes(area),
            "committed": (output / ".zgroup").exists() or (output / "zarr.json").exists()}


def run(cmd: list[str], log: Path) -> dict:
    measured = run_measured(cmd, log)
    summary = json.loads(Path(cmd[cmd.index("--summary_json") + 1]).read_text())
    measured.update(tokens=summary["tokens"], reused=summary.get("reused"))
    return measured


def killed(cmd: list[str], after: float, log: Path) -> dict:
    """Starts cmd and SIGKILLs its process group `after` seconds after the start."""
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None and time.perf_counter() - started < after:
            time.sleep(0.01)
        finished_first = proc.poll() is not None
        if not finished_first:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"killed_at_seconds": round(time.perf_counter() - started, 3), "finished_before_the_kill": finished_first}


def peak_staging(cmd: list[str], output: Path, log: Path) -> dict:
    """One run like (a), its staging area's size polled every 50 ms on a thread."""
    peak = {"bytes": 0}
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak["bytes"] = max(peak["bytes"], disk_bytes(output / STAGING))
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        r = run(cmd, log)
    finally:
        done.set()
        watcher.join()
    r["staging_peak_bytes"] = peak["bytes"]
    return r


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--input", required=True, help="one JSONL file ({\"text\": ...} per line)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json path (or 'bytes')")
    ap.add_argument("--scale", type=int, default=5, help="the input repeated this many times (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of (a), (b), (c)+(d) (default 3)")
    ap.add_argument("--kill_at", type=float, default=0.8, help="(c) is killed at this share of (a)'s wall")
    ap.add_argument("--json", help="write the results as JSON to this path")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--workdir", help="a new directory is made inside this one (default: the system's temp)")
    ap.add_argument("--wait_load", type=float, default=0,
                    help="first wait (up to --wait_max s) until the 1-min load average is below this")
    ap.add_argument("--wait_max", type=float, default=1200)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.scale < 1 or not 0 < args.kill_at < 1:
        ap.error("--rounds and --scale must be >= 1, --kill_at in (0, 1)")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    source = Path(args.input).resolve()
    tokenizer = Path(args.tokenizer).resolve() if args.tokenizer != "bytes" else Path("bytes")
    if args.wait_load:
        wait_for_load(args.wait_load, args.wait_max)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="flat-tokens-bench-resume-", dir=args.workdir))
    try:
        input_path = source
        if args.scale > 1:
            input_path = work / f"input-x{args.scale}.jsonl"
            repeat_file(source, input_path, args.scale)
        results = run_rounds(args, input_path, tokenizer, work)
        results.update(input=str(source), scale=args.scale, input_bytes=input_path.stat().st_size,
                       tokenizer=str(tokenizer), cpu_count=os.cpu_count(), kill_at=args.kill_at)
        print("\n".join(report(results)))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def run_rounds(args, input_path: Path, tokenizer: Path, work: Path) -> dict:
    results = {"load_average_start": os.getloadavg(), "rounds": []}
    out, summary = work / "out.zarr", work / "summary.json"
    for i in range(args.rounds):
        r = {}
        clear(out)
        r["a"] = run(command(input_path, tokenizer, out, summary), work / f"a{i}.log")
        clear(out)
        r["b"] = run(command(input_path, tokenizer, out, summary, ["--no_staging"]), work / f"b{i}.log")
        clear(out)
        r["c"] = killed(command(input_path, tokenizer, out, summary), args.kill_at * r["a"]["wall_seconds"],
                        work / f"c{i}.log")
        r["c"].update(left=staged(out))
        if not r["c"]["finished_before_the_kill"] and not r["c"]["left"]["committed"]:
            r["d"] = run(command(input_path, tokenizer, out, summary), work / f"d{i}.log")
            r["d"]["share_of_a"] = round(r["d"]["wall_seconds"] / r["a"]["wall_seconds"], 3)
        r["overhead"] = round(r["a"]["wall_seconds"] / r["b"]["wall_seconds"] - 1, 3)
        note(f"round {i + 1}: (a) {r['a']['wall_seconds']:.1f} s, (b) --no_staging {r['b']['wall_seconds']:.1f} s, "
             f"(c) killed at {r['c']['killed_at_seconds']:.1f} s, (d) resumed in "
             + (f"{r['d']['wall_seconds']:.1f} s" if "d" in r else "- (the run had finished)"))
        results["rounds"].append(r)
    clear(out)
    results["peak"] = peak_staging(command(input_path, tokenizer, out, summary), out, work / "peak.log")
    clear(out)
    rounds = results["rounds"]
    resumed = [r["d"]["share_of_a"] for r in rounds if "d" in r]
    results["medians"] = {
        "a_wall_seconds": median([r["a"]["wall_seconds"] for r in rounds]),
        "b_wall_seconds": median([r["b"]["wall_seconds"] for r in rounds]),
        "d_wall_seconds": median([r["d"]["wall_seconds"] for r in rounds if "d" in r]),
        # As bench_pipeline's ratios: of the medians (a/b - 1); the rounds' own ratios beside it.
        "overhead": round(median([r["a"]["wall_seconds"] for r in rounds])
                          / median([r["b"]["wall_seconds"] for r in rounds]) - 1, 3),
        "overhead_of_rounds": median([r["overhead"] for r in rounds]),
        "resumed_share": median(resumed),
    }
    results["load_average_end"] = os.getloadavg()
    return results


def report(r: dict) -> list[str]:
    mb = r["input_bytes"] / 1e6
    lines = ["flat-tokens-beam resume benchmark",
             f"  input: {r['input']} x{r['scale']} ({mb:,.1f} MB); tokenizer: {r['tokenizer']}",
             f"  machine: {r['cpu_count']} cores; load average (1/5/15 min) at start "
             f"{'/'.join(f'{x:.2f}' for x in r['load_average_start'])}, at end "
             f"{'/'.join(f'{x:.2f}' for x in r['load_average_end'])}",
             "",
             "every round (whole processes; (c) killed at its share of the same round's (a))",
             "  round  (a) staged s  (b) --no_staging s  overhead  (c) killed at s  left: units, shards, MB"
             "  (d) resumed s  (d)/(a)  reused: units, chunks"]
    for i, x in enumerate(r["rounds"], 1):
        left = x["c"]["left"]
        d = x.get("d")
        reused = d["reused"] if d else None
        lines.append(
            f"  {i:>5}  {x['a']['wall_seconds']:>12.2f}  {x['b']['wall_seconds']:>18.2f}  {x['overhead']:>+8.1%}"
            f"  {x['c']['killed_at_seconds']:>15.2f}"
            f"  {left['units']:>5}, {left['shards']:>4}, {left['bytes'] / 1e6:>7,.0f}"
            + (f"  {d['wall_seconds']:>13.2f}  {d['share_of_a']:>7.1%}  {reused['input_units']} of "
               f"{reused['input_units_total']}, {reused['chunks']:,} of {reused['chunks_total']:,}"
               if d else "  (finished before the kill)"))
    m = r["medians"]
    peak = r["peak"]
    tokens = peak["tokens"]
    lines += ["",
              f"medians of {len(r['rounds'])} rounds",
              f"  (a) uninterrupted, staged:      {m['a_wall_seconds']:.2f} s",
              f"  (b) uninterrupted, --no_staging: {m['b_wall_seconds']:.2f} s",
              f"  staging's overhead: {m['overhead']:+.1%} (of the medians, a/b - 1; the median of the rounds' "
              f"own: {m['overhead_of_rounds']:+.1%})",
              (f"  (d) resumed after a kill at {r['kill_at']:.0%}: {m['d_wall_seconds']:.2f} s, "
               f"{m['resumed_share']:.1%} of (a)"
               if m["resumed_share"] is not None else "  (d): no round was killed before it finished"),
              "",
              f"staging area on disk (one more run like (a), polled every 50 ms): peak "
              f"{peak['staging_peak_bytes'] / 1e6:,.0f} MB for {tokens:,} tokens "
              f"({peak['staging_peak_bytes'] / max(tokens, 1):.2f} bytes/token, "
              f"{peak['staging_peak_bytes'] / 1e6 / mb:.2f}x the input); removed by the commit",
              "",
              "targets"]
    share = m["resumed_share"]
    lines.append(f"  killed at {r['kill_at']:.0%}, the resumed run takes <= 35% of an uninterrupted run's wall   "
                 + (f"{share:.1%}  {'PASS' if share <= TARGET_RESUMED_SHARE else 'FAIL'}" if share is not None
                    else "n/a"))
    lines.append(f"  staging adds <= 10% to an uninterrupted run's wall                         "
                 f"{m['overhead']:+.1%}  {'PASS' if m['overhead'] <= TARGET_OVERHEAD else 'FAIL'}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
