#!/usr/bin/env python3
"""Benchmark the pipeline end to end against the raw tokenization limit.

One command, on one JSONL file and one tokenizer.json:

    python benchmarks/bench_pipeline.py --input corpus.jsonl --tokenizer tokenizer.json

For --rounds N (default 3) it alternates two subprocesses (three with --hf), each
measured as a whole process (interpreter start, imports and tokenizer load included):

  (a) the pipeline: python -m pipeline.run ... --overwrite --quiet --summary_json S
      (default options: DirectRunner, default codec);
  (b) the raw limit: benchmarks/raw_limit.py, a standalone script (no project imports):
      orjson over readlines(4 MiB) blocks, the pipeline's tokenizer backend on batches of
      1024 documents into numpy, nothing written;
  (c) with --hf: the same script with HF tokenizers' encode_batch_fast (slow).

Wall time, CPU time (user + sys) and peak RSS are those of each process (os.wait4). The
report gives every round, medians and minimums, the ratios a/b of wall and CPU against
the targets, and the load average at the start and the end. Then, outside the timed
rounds: one pipeline run per --codecs entry (output bytes per token of an alternative
codec), one pipeline run under cProfile (where the time goes), and with --scale K one
pipeline run on the input repeated K times (peak RSS and time per byte at Kx vs 1x).
--json writes everything machine-readable.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAW_LIMIT = Path(__file__).resolve().parent / "raw_limit.py"
MB = 1_000_000
CODECS = ("zstd", "blosc-zstd", "blosc-lz4")
DEFAULT_CODEC = "zstd"  # the pipeline's default (pipeline/options.py)

TARGET_WALL_RATIO = 2.0  # pipeline wall <= 2x the raw limit's, same run
TARGET_CPU_RATIO = 2.0  # pipeline CPU (user + sys) <= 2x the raw limit's
TARGET_RSS_MB = 1024  # peak RSS <= 1 GB at ~250 MB of input (RSS in MiB, as ru_maxrss gives it)
TARGET_RSS_SCALED_MB = 1536  # peak RSS <= 1.5 GB at 5x that input
TARGET_SCALE = 1.1  # Kx input takes <= 1.1x the time per byte


# ---------------------------------------------------------------------------------------
# measuring subprocesses

def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Runs cmd from the repo root; wall, peak RSS and CPU of that process alone."""
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = {"wall_seconds": round(wall, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
              "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2), "returncode": proc.returncode}
    if proc.returncode != 0:
        text = log.read_text(errors="replace")
        sys.exit(f"bench: {' '.join(map(str, cmd))} exited {proc.returncode}; log {log}:\n{text[-4000:]}")
    return result


def pipeline_cmd(input_path, tokenizer, output, summary, extra=(), prefix=()) -> list[str]:
    return [sys.executable, *prefix, "-m", "pipeline.run", "--input", str(input_path), "--tokenizer",
            str(tokenizer), "--output", str(output), "--overwrite", "--quiet", "--summary_json", str(summary),
            *extra]


def clear_output(output: Path) -> None:
    """Removes an earlier round's output (not timed; the run still passes --overwrite)."""
    for p in (output, Path(str(output) + ".rejected")):
        shutil.rmtree(p, ignore_errors=True)


def run_pipeline(work: Path, name: str, input_path, tokenizer, extra=(), prefix=()) -> dict:
    output, summary = work / f"{name}.zarr", work / f"{name}.summary.json"
    clear_output(output)
    summary.unlink(missing_ok=True)
    measured = run_measured(pipeline_cmd(input_path, tokenizer, output, summary, extra, prefix),
                            work / f"{name}.log")
    s = json.loads(summary.read_text())
    measured.update(tokens=s["tokens"], output_bytes=s["output_bytes"], bytes_per_token=s["bytes_per_token"],
                    pipeline_wall_seconds=s["wall_seconds"], backend=(s.get("tokenizer") or {}).get("backend"))
    return measured


def run_raw(work: Path, name: str, backend: str, input_path, tokenizer) -> dict:
    """benchmarks/raw_limit.py as its own process; its JSON line added to the measurement."""
    log = work / f"{name}.log"
    measured = run_measured([sys.executable, str(RAW_LIMIT), str(input_path), str(tokenizer),
                             "--backend", backend], log)
    measured.update(json.loads(log.read_text().strip().splitlines()[-1]))
    return measured


# ---------------------------------------------------------------------------------------
# the profile: where the time goes

BUCKETS = {
    "tokenizer": "tokenizer (native encode + load)",
    "zarr": "zarr/numcodecs (incl. waits on zarr's I/O thread)",
    "json": "orjson/json",
    "beam": "beam overhead (runner, coders, graph, pickling)",
    "imports": "module imports (importlib)",
    "other": "other (stdlib/numpy not called from the above)",
}
_TOKENIZER_BUILTIN = re.compile(r"encode_batch|from_json_str|from_str|from_file|'(builtins|tokenizers)\.Tokenizer'")


def _qualnames(path: str) -> dict[int, str]:
    """first line (def or decorator) -> Class.function, for our own source files."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}
    found: dict[int, str] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    for line in [child.lineno] + [d.lineno for d in child.decorator_list]:
                        found.setdefault(line, name)
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return found


class _Classifier:
    def __init__(self):
        self.ours = tuple(str(REPO / d) + os.sep for d in ("transforms", "pipeline"))
        self._names: dict[str, dict[int, str]] = {}

    def our_label(self, func) -> str:
        filename, line, name = func
        if filename not in self._names:
            self._names[filename] = _qualnames(filename)
        names = self._names[filename]
        rel = os.path.relpath(filename, REPO)
        if name == "<lambda>" or name.startswith("<"):
            return f"{rel}:{name}@{line}"
        label = names.get(line)
        if label is None or label.rsplit(".", 1)[-1] != name:
            # the file changed since the run: take the def of that name nearest to the line
            near = sorted((abs(n - line), q) for n, q in names.items() if q.rsplit(".", 1)[-1] == name)
            label = near[0][1] if near else name
        return f"{rel}:{label}"

    def __call__(self, func) -> str | None:
        """A row label for a function whose self time is its own, or None: charge its callers."""
        filename, _, name = func
        if filename.startswith(self.ours):
            return self.our_label(func)
        if filename == "~":
            if _TOKENIZER_BUILTIN.search(name):
                return BUCKETS["tokenizer"]
            if "orjson" in name:
                return BUCKETS["json"]
            return None
        parts = filename.replace("\\", "/")
        if "/apache_beam/" in parts:
            return BUCKETS["beam"]
        if "/zarr/" in parts or "/numcodecs/" in parts:
            return BUCKETS["zarr"]
        if "/tokenizers/" in parts or "/fastokens/" in parts:
            return BUCKETS["tokenizer"]
        if "/json/" in parts or "/orjson/" in parts:
            return BUCKETS["json"]
        if filename.startswith("<frozen importlib"):
            return BUCKETS["imports"]
        return None


def profile_tables(prof_path: Path) -> dict:
    """Self time per row: our functions one by one, the rest in buckets. Self time of
    stdlib, numpy, builtins and other libraries is charged to whoever called them, edge by
    edge, so bytes.split in iter_lines counts for iter_lines and a lock wait inside zarr
    counts for zarr. Also: inclusive time of our entry points (our functions Beam calls)."""
    stats = pstats.Stats(str(prof_path)).stats  # func -> (cc, nc, tt, ct, callers)
    classify = _Classifier()
    memo: dict = {}
    in_progress: set = set()

    def share(func) -> dict[str, float]:
        """How a function's time splits over rows: itself if classified, else its callers
        (weighted by the inclusive time of each calling edge; edges closing a cycle are skipped)."""
        if func in memo:
            return memo[func]
        label = classify(func)
        if label:
            memo[func] = {label: 1.0}
            return memo[func]
        in_progress.add(func)
        callers = stats.get(func, (0, 0, 0, 0, {}))[4]
        weights = {c: edge[3] for c, edge in callers.items() if c not in in_progress and edge[3] > 0}
        total = sum(weights.values())
        result: dict[str, float] = {}
        for c, w in weights.items():
            for k, v in share(c).items():
                result[k] = result.get(k, 0.0) + v * w / total
        in_progress.discard(func)
        memo[func] = result or {BUCKETS["other"]: 1.0}
        return memo[func]

    rows: dict[str, float] = {}
    for func, (_, _, tt, _, callers) in stats.items():
        if tt <= 0:
            continue
        if classify(func):
            parts = {classify(func): tt}
        elif callers:
            # the callee's self time per calling edge is exact; further up it is proportional
            parts = {}
            edge_total = sum(e[2] for e in callers.values())
            for c, edge in callers.items():
                w = edge[2] if edge_total > 0 else tt / len(callers)
                for k, v in share(c).items():
                    parts[k] = parts.get(k, 0.0) + w * v
            scale = tt / sum(parts.values()) if parts and sum(parts.values()) > 0 else 0
            parts = {k: v * scale for k, v in parts.items()}
        else:
            parts = {BUCKETS["other"]: tt}
        for k, v in parts.items():
            rows[k] = rows.get(k, 0.0) + v
    total = sum(rows.values())

    return {"total_seconds": round(total, 3),
            "self_time": sorted(([k, round(v, 3)] for k, v in rows.items()), key=lambda r: -r[1]),
            "stages": stage_table(stats, classify.ours, total)}


STAGES = {  # our modules -> the pipeline stage their runtime work belongs to
    "read (ReadJsonlDocuments)": ("read_jsonl.py", "jsonl.py", "inputs.py"),
    "tokenize (TokenizeBatches)": ("tokenize.py", "tokenizer_backends.py"),
    "shuffle (ShuffleGlobally)": ("shuffle.py", "shuffle_keys.py", "records.py"),
    "write + commit (WriteFlatTokens, CommitDataset)": ("write_zarr.py", "zarr_store.py", "layout.py", "commit.py",
                                                       "rejected.py"),
}
_NOT_RUNTIME = {"expand", "<module>", "default_label", "_add_argparse_args", "display_data", "__init__",
                "run_via_runner_api"}  # our runner subclass wraps all of Pipeline.run: that is Beam's time


def stage_table(stats: dict, ours: tuple, total: float) -> list:
    """Inclusive time per step: start-up, planning, graph building, then inside Beam's
    Pipeline.run the time Beam spends in our DoFns/CombineFns per stage (everything they
    call included: tokenizer, zarr, numpy), and the rest of Pipeline.run (Beam itself)."""
    def cumtime(match) -> float:
        return sum(v[3] for f, v in stats.items() if match(f))

    def ours_named(module, name):
        return lambda f: f[0] == str(REPO / module) and f[2] == name

    main = cumtime(ours_named("pipeline/run.py", "main"))
    module = cumtime(ours_named("pipeline/run.py", "<module>"))
    plan = cumtime(ours_named("pipeline/plan.py", "plan_job"))
    build = cumtime(ours_named("pipeline/graph.py", "build_pipeline"))
    beam_run = cumtime(lambda f: f[0].endswith(os.path.join("apache_beam", "pipeline.py")) and f[2] == "run")
    stages = {k: 0.0 for k in STAGES}
    stages["other of ours (progress, ...)"] = 0.0
    for func, (_, _, _, _, callers) in stats.items():
        if not func[0].startswith(ours) or func[2] in _NOT_RUNTIME:
            continue
        from_beam = sum(e[3] for c, e in callers.items() if f"{os.sep}apache_beam{os.sep}" in c[0])
        if from_beam:
            base = os.path.basename(func[0])
            stage = next((k for k, mods in STAGES.items() if base in mods), "other of ours (progress, ...)")
            stages[stage] += from_beam
    in_stages = sum(stages.values())
    rows = [["start-up: interpreter imports before main()", total - main if module else 0.0],
            ["plan_job: list inputs, load tokenizer, backend guard", plan],
            ["build_pipeline: wire the graph", build],
            ["Beam Pipeline.run, of which:", beam_run]]
    rows += [[f"  {k}", v] for k, v in stages.items()]
    rows += [["  Beam itself (runner, coders, shuffle, graph translation)", max(0.0, beam_run - in_stages)],
             ["rest of main() (checks, summary, du of the output)", max(0.0, main - plan - build - beam_run)]]
    return [[k, round(v, 3)] for k, v in rows]


def format_profile(p: dict, top_ours: int = 12) -> list[str]:
    total = p["total_seconds"] or 1
    lines = [f"  self time by row (s, share of {p['total_seconds']:.1f} s profiled):"]
    ours = [r for r in p["self_time"] if r[0].startswith(("transforms/", "pipeline/"))]
    buckets = [r for r in p["self_time"] if r not in ours]
    top = [r for r in ours[:top_ours] if r[1] >= 0.005]
    shown = buckets + top
    rest = sum(v for _, v in ours) - sum(v for _, v in top)
    for label, v in sorted(shown, key=lambda r: -r[1]):
        lines.append(f"    {v:9.2f}  {100 * v / total:5.1f}%  {label}")
    if rest:
        lines.append(f"    {rest:9.2f}  {100 * rest / total:5.1f}%  (our other functions)")
    ours_total = sum(v for _, v in ours)
    lines.append(f"    our own functions together (transforms/*, pipeline/*): {ours_total:.2f} s, "
                 f"{100 * ours_total / total:.1f}%")
    lines.append("  by step (inclusive: a stage counts everything its DoFns call; s, share):")
    for label, v in p["stages"]:
        lines.append(f"    {v:9.2f}  {100 * v / total:5.1f}%  {label}")
    return lines


# ---------------------------------------------------------------------------------------
# the benchmark

def load1() -> float:
    return round(os.getloadavg()[0], 2)


def wait_for_load(limit: float, max_seconds: float, poll: float = 30) -> None:
    deadline = time.time() + max_seconds
    while load1() >= limit and time.time() < deadline:
        print(f"bench: load average {load1()} >= {limit}; waiting", file=sys.stderr, flush=True)
        time.sleep(poll)


def repeat_file(src: Path, dst: Path, times: int) -> None:
    with open(src, "rb") as f:
        f.seek(-1, os.SEEK_END)
        newline = f.read(1) != b"\n"
    with open(dst, "wb") as out:
        for _ in range(times):
            with open(src, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
            if newline:
                out.write(b"\n")


def median(values):
    return statistics.median(values) if values else None


def summarize_runs(runs: list[dict], input_bytes: int) -> dict:
    """Medians and minimums of one kind of run over the rounds."""
    out = {"tokens": runs[0]["tokens"], "rounds": len(runs)}
    for key in ("wall_seconds", "cpu_seconds", "peak_rss_mb"):
        values = [r[key] for r in runs]
        out[key] = round(median(values), 3)
        out[key + "_min"] = min(values)
        out[key + "_max"] = max(values)
    out["tokens_per_second"] = round(out["tokens"] / out["wall_seconds"], 1)
    out["input_mb_per_second"] = round(input_bytes / MB / out["wall_seconds"], 2)
    out["walls"] = [r["wall_seconds"] for r in runs]
    return out


def ratios(a: dict, b: dict) -> dict:
    """The pipeline's cost over the raw limit's: of the medians, and of the minimums."""
    return {"wall": round(a["wall_seconds"] / b["wall_seconds"], 3),
            "cpu": round(a["cpu_seconds"] / b["cpu_seconds"], 3),
            "wall_of_minimums": round(a["wall_seconds_min"] / b["wall_seconds_min"], 3),
            "cpu_of_minimums": round(a["cpu_seconds_min"] / b["cpu_seconds_min"], 3)}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--input", required=True, help="one JSONL file ({\"text\": ...} per line)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json path")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of (a), (b) [and (c)] (default 3)")
    ap.add_argument("--hf", action="store_true",
                    help="also run (c), the raw limit with HF tokenizers (about 20x slower than (b))")
    ap.add_argument("--scale", type=int, default=5,
                    help="also run the pipeline on the input repeated K times (default 5; 0 = skip)")
    ap.add_argument("--codecs", default="",
                    help=f"comma-separated alternative codecs, one extra pipeline run each, for bytes/token "
                         f"(from {', '.join(CODECS)}; default none)")
    ap.add_argument("--no_profile", action="store_true", help="skip the cProfile run")
    ap.add_argument("--json", help="write the results as JSON to this path")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (outputs, logs, profile)")
    ap.add_argument("--workdir", help="a new directory is made inside this one for the outputs "
                                      "(default: the system's temporary directory)")
    ap.add_argument("--wait_load", type=float, default=0,
                    help="first wait (up to --wait_max s, polling every 30 s) until the 1-min load "
                         "average is below this (default 0: do not wait)")
    ap.add_argument("--wait_max", type=float, default=1200)
    args = ap.parse_args(argv)
    args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    for c in args.codecs:
        if c not in CODECS:
            ap.error(f"--codecs {c}: not one of {', '.join(CODECS)}")
    if args.rounds < 1 or args.scale < 0 or args.scale == 1:
        ap.error("--rounds must be >= 1 and --scale 0 or >= 2")
    return args


def note(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def _round_note(i: int, name: str, r: dict) -> None:
    note(f"round {i + 1}: {name} {r['wall_seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, "
         f"{r['peak_rss_mb']:,.0f} MB peak RSS")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    input_path, tokenizer = Path(args.input).resolve(), Path(args.tokenizer).resolve()
    input_bytes = input_path.stat().st_size
    if args.wait_load:
        wait_for_load(args.wait_load, args.wait_max)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="flat-tokens-bench-", dir=args.workdir))
    results: dict = {"input": str(input_path), "input_bytes": input_bytes, "tokenizer": str(tokenizer),
                     "rounds": args.rounds, "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(),
                     "python": platform.python_version(),
                     "command": " ".join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])}
    started = time.time()
    try:
        runs = {"a": [], "b": []} | ({"c": []} if args.hf else {})
        for i in range(args.rounds):
            runs["a"].append(run_pipeline(work, "a", input_path, tokenizer))
            _round_note(i, "(a) pipeline", runs["a"][-1])
            # (b) tokenizes with the backend the pipeline chose (fastokens once it passed the guard)
            backend = runs["a"][0]["backend"] or "hf"
            runs["b"].append(run_raw(work, "b", backend, input_path, tokenizer))
            _round_note(i, f"(b) raw limit ({backend})", runs["b"][-1])
            if args.hf:
                runs["c"].append(run_raw(work, "c", "hf", input_path, tokenizer))
                _round_note(i, "(c) raw hf", runs["c"][-1])
        results["raw_backend"] = runs["a"][0]["backend"] or "hf"
        results["runs"] = runs
        med = {k: summarize_runs(v, input_bytes) for k, v in runs.items()}
        results["medians"] = med
        results["ratios"] = ratios(med["a"], med["b"])

        codecs = {DEFAULT_CODEC: {"bytes_per_token": runs["a"][0]["bytes_per_token"],
                                  "output_bytes": runs["a"][0]["output_bytes"],
                                  "wall_seconds": med["a"]["wall_seconds"], "default": True}}
        for codec in args.codecs:
            if codec == DEFAULT_CODEC:
                continue
            r = run_pipeline(work, f"codec-{codec}", input_path, tokenizer, ["--codec", codec])
            codecs[codec] = {"bytes_per_token": r["bytes_per_token"], "output_bytes": r["output_bytes"],
                             "wall_seconds": r["wall_seconds"], "peak_rss_mb": r["peak_rss_mb"], "default": False}
            note(f"codec {codec}: {r['bytes_per_token']} bytes/token, {r['wall_seconds']:.1f} s")
        results["codecs"] = codecs

        if not args.no_profile:
            prof = work / "pipeline.prof"
            r = run_pipeline(work, "profile", input_path, tokenizer, prefix=["-m", "cProfile", "-o", str(prof)])
            results["profile"] = {"wall_seconds": r["wall_seconds"], **profile_tables(prof)}
            note(f"profile run: {r['wall_seconds']:.1f} s")

        if args.scale:
            big = work / f"input-x{args.scale}.jsonl"
            repeat_file(input_path, big, args.scale)
            r = run_pipeline(work, f"scale-x{args.scale}", big, tokenizer)
            big.unlink()
            k_bytes = input_bytes * args.scale
            results["scale"] = {
                "k": args.scale, "wall_seconds_1x": med["a"]["wall_seconds"], "wall_seconds_kx": r["wall_seconds"],
                "cpu_seconds_1x": med["a"]["cpu_seconds"], "cpu_seconds_kx": r["cpu_seconds"],
                "peak_rss_mb_1x": med["a"]["peak_rss_mb_max"], "peak_rss_mb_kx": r["peak_rss_mb"],
                "tokens_kx": r["tokens"],
                "seconds_per_mb_1x": round(med["a"]["wall_seconds"] / input_bytes * MB, 4),
                "seconds_per_mb_kx": round(r["wall_seconds"] / k_bytes * MB, 4),
                "ratio": round(r["wall_seconds"] / args.scale / med["a"]["wall_seconds"], 3),
                "cpu_ratio": round(r["cpu_seconds"] / args.scale / med["a"]["cpu_seconds"], 3),
                "ratio_without_startup": round(
                    r["pipeline_wall_seconds"] / args.scale / median([x["pipeline_wall_seconds"] for x in runs["a"]]),
                    3)}
            note(f"scale x{args.scale}: {r['wall_seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, "
                 f"{r['peak_rss_mb']:,.0f} MB peak RSS")
    finally:
        results["load_average_end"] = os.getloadavg()
        results["benchmark_seconds"] = round(time.time() - started, 1)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            results["workdir"] = str(work)

    print("\n".join(report(results)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(r: dict) -> list[tuple[str, str, bool]]:
    """(target, value reached, met?) for each target the run measured."""
    q, med = r["ratios"], r["medians"]
    rss = med["a"]["peak_rss_mb_max"]
    found = [
        (f"pipeline wall <= {TARGET_WALL_RATIO:g}x the raw limit's (medians)", f"{q['wall']:.2f}x",
         q["wall"] <= TARGET_WALL_RATIO),
        (f"pipeline CPU (user+sys) <= {TARGET_CPU_RATIO:g}x the raw limit's (medians)", f"{q['cpu']:.2f}x",
         q["cpu"] <= TARGET_CPU_RATIO),
        (f"pipeline peak RSS <= {TARGET_RSS_MB:,} MB at {r['input_bytes'] / MB:,.0f} MB of input (worst round)",
         f"{rss:,.0f} MB", rss <= TARGET_RSS_MB),
    ]
    if "scale" in r:
        s = r["scale"]
        found += [
            (f"peak RSS <= {TARGET_RSS_SCALED_MB:,} MB at {s['k']}x the input", f"{s['peak_rss_mb_kx']:,.0f} MB",
             s["peak_rss_mb_kx"] <= TARGET_RSS_SCALED_MB),
            (f"time per byte at {s['k']}x <= {TARGET_SCALE:g}x that at 1x", f"{s['ratio']:.2f}x",
             s["ratio"] <= TARGET_SCALE),
        ]
    return found


def report(r: dict) -> list[str]:
    med, runs, raw = r["medians"], r["runs"], r["raw_backend"]
    la0, la1 = r["load_average_start"], r["load_average_end"]
    names = {"a": "(a) pipeline (DirectRunner, defaults)", "b": f"(b) raw limit: orjson + {raw}",
             "c": "(c) raw limit with HF encode_batch_fast"}
    lines = [
        "flat-tokens-beam benchmark",
        f"  input: {r['input']} ({r['input_bytes'] / MB:,.1f} MB); tokenizer: {r['tokenizer']}",
        f"  machine: {r['cpu_count']} cores (os.cpu_count), Python {r['python']}",
        f"  load average (1/5/15 min): at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, "
        f"at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}",
        "",
        f"every round (alternated; whole process: interpreter start, imports, tokenizer load included)",
        f"  {'round':>5s}  {'run':40s} {'wall s':>8s} {'CPU s':>8s} {'peak RSS MB':>12s}",
    ]
    for i in range(r["rounds"]):
        for k in runs:
            x = runs[k][i]
            lines.append(f"  {i + 1:5d}  {names[k]:40s} {x['wall_seconds']:8.2f} {x['cpu_seconds']:8.2f} "
                         f"{x['peak_rss_mb']:12,.0f}")
    lines += ["", f"medians (minimums) of {r['rounds']} rounds; CPU = user + sys; MB/s = 10^6 bytes of JSONL per s",
              f"  {'run':40s} {'wall s':>14s} {'CPU s':>14s} {'peak RSS MB':>18s} {'tokens/s':>12s} {'MB/s':>7s}"]
    for k, m in med.items():
        lines.append(f"  {names[k]:40s} {m['wall_seconds']:6.2f} ({m['wall_seconds_min']:5.2f}) "
                     f"{m['cpu_seconds']:6.2f} ({m['cpu_seconds_min']:5.2f}) "
                     f"{m['peak_rss_mb']:8,.0f} ({m['peak_rss_mb_min']:7,.0f}) "
                     f"{m['tokens_per_second']:12,.0f} {m['input_mb_per_second']:7.2f}")
    tokens = {k: m["tokens"] for k, m in med.items()}
    lines.append("  tokens: " + ", ".join(f"{k} {v:,}" for k, v in tokens.items())
                 + ("" if len(set(tokens.values())) == 1 else "  (differ: the pipeline drops empty documents)"))
    q = r["ratios"]
    lines.append(f"  ratio a/b: wall {q['wall']:.2f}x, CPU {q['cpu']:.2f}x (of the minimums: wall "
                 f"{q['wall_of_minimums']:.2f}x, CPU {q['cpu_of_minimums']:.2f}x)")
    lines += ["", "output bytes per token"]
    for codec, c in r["codecs"].items():
        lines.append(f"  {codec + (' (default)' if c['default'] else ''):22s} {c['bytes_per_token']:.3f} bytes/token, "
                     f"{c['output_bytes'] / MB:,.1f} MB, pipeline wall {c['wall_seconds']:.1f} s"
                     + ("" if c["default"] else " (one run)"))
    if "profile" in r:
        p = r["profile"]
        lines += ["", f"where the pipeline's time goes (one more run under cProfile: {p['wall_seconds']:.1f} s wall "
                      f"vs {med['a']['wall_seconds']:.1f} s unprofiled; cProfile inflates Python-heavy code)"]
        lines += format_profile(p)
    if "scale" in r:
        s = r["scale"]
        lines += ["", f"scale: input x{s['k']} ({s['k'] * r['input_bytes'] / MB:,.0f} MB), one run",
                  f"  1x: {s['wall_seconds_1x']:.1f} s wall, {s['cpu_seconds_1x']:.1f} s CPU, "
                  f"{s['seconds_per_mb_1x']:.4f} s/MB (medians of the rounds), peak RSS {s['peak_rss_mb_1x']:,.0f} MB",
                  f"  {s['k']}x: {s['wall_seconds_kx']:.1f} s wall, {s['cpu_seconds_kx']:.1f} s CPU, "
                  f"{s['seconds_per_mb_kx']:.4f} s/MB, peak RSS {s['peak_rss_mb_kx']:,.0f} MB",
                  f"  time per byte {s['k']}x / 1x: wall {s['ratio']:.2f}, CPU {s['cpu_ratio']:.2f}; "
                  f"without process start-up (the summary's wall_seconds): {s['ratio_without_startup']:.2f}"]
    lines += ["", "targets"]
    for label, value, ok in targets(r):
        lines.append(f"  {label:66s} {value:>9s}  {_verdict(ok)}")
    lines.append(f"(benchmark took {r['benchmark_seconds']:,.0f} s)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
