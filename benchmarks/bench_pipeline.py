#!/usr/bin/env python3
"""Benchmark the pipeline end to end against the raw tokenization limit.

One command, on one JSONL file and one tokenizer.json:

    python benchmarks/bench_pipeline.py --input corpus.jsonl --tokenizer tokenizer.json

For --rounds N (default 3) it alternates three subprocesses, each timed as a whole
process (interpreter start, imports and tokenizer load included):

  (a) the pipeline: python -m pipeline.run ... --overwrite --quiet --summary_json S
      (default options: DirectRunner, default codec);
  (b) the raw limit: read the JSONL, parse each line with orjson, tokenize batches of
      8192 documents into numpy with the fastest installed backend that passes the
      pipeline's guard (transforms.tokenizer_backends.choose_backend); writes nothing;
  (c) the same with HF tokenizers (encode_batch_fast), a second reference.

Peak RSS and CPU time are per subprocess (os.wait4). Then, outside the timed rounds:
one pipeline run per --codecs entry (output bytes per token of an alternative codec),
one pipeline run in-process under cProfile (where the time goes), and with --scale K
one pipeline run on the input repeated K times (time per byte at 1x vs Kx).
Medians and the targets are printed; --json writes everything machine-readable.
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
MB = 1_000_000
RAW_BATCH_DOCUMENTS = 8192  # the pipeline's default --batch_documents
CODECS = ("zstd", "blosc-zstd", "blosc-lz4")
DEFAULT_CODEC = "zstd"  # the pipeline's default (pipeline/options.py)

TARGET_RATIO = 3.0  # pipeline wall <= 3x the raw limit
TARGET_RSS_MB = 2048  # peak RSS <= 2 GB (at 250 MB of input)
TARGET_SCALE = 1.2  # Kx input takes <= 1.2x the time per byte


# ---------------------------------------------------------------------------------------
# (b), (c): the raw child process

def raw_child(backend: str, input_path: str, tokenizer_path: str, batch: int) -> None:
    """Runs in a subprocess: JSONL -> orjson -> encoder -> numpy; prints one JSON line."""
    started = time.perf_counter()
    sys.path.insert(0, str(REPO))
    import orjson

    from transforms.tokenizer_backends import make_encoder

    with open(tokenizer_path, encoding="utf-8") as f:
        encode = make_encoder(backend, f.read())
    loaded = time.perf_counter()
    tokens = documents = 0
    texts: list[str] = []

    def flush():
        nonlocal tokens, documents
        if texts:
            ids, lengths = encode(texts)
            tokens += int(ids.size)
            documents += int(lengths.size)
            texts.clear()

    with open(input_path, "rb") as f:
        for line in f:
            if line.strip():
                texts.append(orjson.loads(line)["text"])
                if len(texts) >= batch:
                    flush()
    flush()
    print(json.dumps({"backend": backend, "tokens": tokens, "documents": documents,
                      "load_seconds": round(loaded - started, 3),
                      "seconds_in_process": round(time.perf_counter() - started, 3)}))


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
    log = work / f"{name}.log"
    measured = run_measured([sys.executable, str(Path(__file__).resolve()), "--_raw_child", backend,
                             str(input_path), str(tokenizer), str(RAW_BATCH_DOCUMENTS)], log)
    measured.update(json.loads(log.read_text().strip().splitlines()[-1]))
    return measured


# ---------------------------------------------------------------------------------------
# choosing the raw backend exactly as the pipeline does

def first_documents(input_path) -> list[str]:
    """The documents the pipeline's guard compares before a run (pipeline.graph.plan_job)."""
    from pipeline.graph import GUARD_DOCUMENTS
    from transforms.inputs import list_input_files
    from transforms.read_jsonl import peek_documents
    return peek_documents(list_input_files([str(input_path)], "auto"), GUARD_DOCUMENTS, "text")


def fastest_backend(input_path, tokenizer) -> tuple[str, str | None]:
    from transforms import tokenizer_backends as backends
    json_text = Path(tokenizer).read_text(encoding="utf-8")
    return backends.choose_backend(backends.AUTO, json_text, first_documents(input_path))


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
_NOT_RUNTIME = {"expand", "<module>", "default_label", "_add_argparse_args", "display_data", "__init__"}


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
    plan = cumtime(ours_named("pipeline/graph.py", "plan_job"))
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
    wall = median([r["wall_seconds"] for r in runs])
    tokens = runs[0]["tokens"]
    return {"wall_seconds": round(wall, 3), "tokens": tokens,
            "tokens_per_second": round(tokens / wall, 1), "input_mb_per_second": round(input_bytes / MB / wall, 2),
            "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
            "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
            "cpu_seconds": median([r["cpu_seconds"] for r in runs]),
            "walls": [r["wall_seconds"] for r in runs]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--input", required=True, help="one JSONL file ({\"text\": ...} per line)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json path")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of (a), (b), (c) (default 3)")
    ap.add_argument("--scale", type=int, default=5,
                    help="also run the pipeline on the input repeated K times (default 5; 0 = skip)")
    ap.add_argument("--codecs", default="blosc-zstd",
                    help=f"comma-separated alternative codecs, one extra pipeline run each, for bytes/token "
                         f"(from {', '.join(CODECS)}; default blosc-zstd; '' = none)")
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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_raw_child"]:
        raw_child(argv[1], argv[2], argv[3], int(argv[4]))
        return 0
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    input_path, tokenizer = Path(args.input).resolve(), Path(args.tokenizer).resolve()
    input_bytes = input_path.stat().st_size
    if args.wait_load:
        wait_for_load(args.wait_load, args.wait_max)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="flat-tokens-bench-", dir=args.workdir))
    results: dict = {"input": str(input_path), "input_bytes": input_bytes, "tokenizer": str(tokenizer),
                     "rounds": args.rounds, "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(),
                     "python": platform.python_version(), "command": " ".join([sys.argv[0], *argv])}
    started = time.time()
    try:
        raw_backend, warning = fastest_backend(input_path, tokenizer)
        from transforms.tokenizer_backends import version_of
        results["raw_backend"] = {"name": raw_backend, "version": version_of(raw_backend), "note": warning}
        note(f"raw backend: {raw_backend} {version_of(raw_backend)}{' (' + warning + ')' if warning else ''}")

        runs = {"a": [], "b": [], "c": []}
        for i in range(args.rounds):
            runs["a"].append(run_pipeline(work, "a", input_path, tokenizer))
            note(f"round {i + 1}: (a) pipeline {runs['a'][-1]['wall_seconds']:.1f} s")
            runs["b"].append(run_raw(work, "b", raw_backend, input_path, tokenizer))
            note(f"round {i + 1}: (b) raw {raw_backend} {runs['b'][-1]['wall_seconds']:.1f} s")
            runs["c"].append(run_raw(work, "c", "hf", input_path, tokenizer))
            note(f"round {i + 1}: (c) raw hf {runs['c'][-1]['wall_seconds']:.1f} s")
        results["runs"] = runs
        med = {k: summarize_runs(v, input_bytes) for k, v in runs.items()}
        results["medians"] = med
        results["ratio_a_b"] = round(med["a"]["wall_seconds"] / med["b"]["wall_seconds"], 3)

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
            one = med["a"]["wall_seconds"] / input_bytes
            many = r["wall_seconds"] / (input_bytes * args.scale)
            inner_one = median([x["pipeline_wall_seconds"] for x in runs["a"]]) / input_bytes
            results["scale"] = {"k": args.scale, "wall_seconds_1x": med["a"]["wall_seconds"],
                                "wall_seconds_kx": r["wall_seconds"], "peak_rss_mb_kx": r["peak_rss_mb"],
                                "tokens_kx": r["tokens"],
                                "seconds_per_mb_1x": round(one * MB, 4), "seconds_per_mb_kx": round(many * MB, 4),
                                "ratio": round(many / one, 3),
                                "ratio_without_startup": round(
                                    r["pipeline_wall_seconds"] / (input_bytes * args.scale) / inner_one, 3)}
            note(f"scale x{args.scale}: {r['wall_seconds']:.1f} s")
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


def report(r: dict) -> list[str]:
    med, raw = r["medians"], r["raw_backend"]["name"]
    la0, la1 = r["load_average_start"], r["load_average_end"]
    lines = [
        "flat-tokens-beam benchmark",
        f"  input: {r['input']} ({r['input_bytes'] / MB:,.1f} MB); tokenizer: {r['tokenizer']}",
        f"  machine: {r['cpu_count']} cores (os.cpu_count), Python {r['python']}; load average (1/5/15 min) "
        f"at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}",
        f"  raw backend: {raw} {r['raw_backend']['version']} (passed the guard)"
        + (f"; note: {r['raw_backend']['note']}" if r['raw_backend']['note'] else ""),
        "",
        f"medians of {r['rounds']} alternated rounds (whole process: interpreter start, imports, tokenizer load "
        f"included; MB = 10^6 bytes of JSONL)",
        f"  {'run':34s} {'wall s':>8s} {'tokens/s':>12s} {'MB/s':>7s} {'peak RSS MB':>12s} {'CPU s':>7s}  walls",
    ]
    names = {"a": "(a) pipeline (DirectRunner)", "b": f"(b) raw limit: orjson + {raw}",
             "c": "(c) orjson + HF encode_batch_fast"}
    for k in "abc":
        m = med[k]
        lines.append(f"  {names[k]:34s} {m['wall_seconds']:8.1f} {m['tokens_per_second']:12,.0f} "
                     f"{m['input_mb_per_second']:7.2f} {m['peak_rss_mb']:12,.0f} {m['cpu_seconds']:7.1f}  "
                     + " ".join(f"{w:.1f}" for w in m["walls"]))
    tokens = {k: med[k]["tokens"] for k in "abc"}
    lines.append(f"  tokens: pipeline {tokens['a']:,}, raw {tokens['b']:,}, hf {tokens['c']:,}"
                 + ("" if len(set(tokens.values())) == 1 else "  (differ: the pipeline drops empty documents)"))
    lines.append(f"  ratio a/b: {r['ratio_a_b']:.2f}x (target <= {TARGET_RATIO:g}x)")
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
        lines += ["", f"scale: input x{s['k']} ({s['k'] * r['input_bytes'] / MB:,.0f} MB)",
                  f"  1x: {s['wall_seconds_1x']:.1f} s = {s['seconds_per_mb_1x']:.4f} s/MB (median of the rounds)",
                  f"  {s['k']}x: {s['wall_seconds_kx']:.1f} s = {s['seconds_per_mb_kx']:.4f} s/MB (one run), "
                  f"peak RSS {s['peak_rss_mb_kx']:,.0f} MB",
                  f"  time per byte {s['k']}x / 1x: {s['ratio']:.2f} (target <= {TARGET_SCALE}); without process "
                  f"start-up (the summary's wall_seconds): {s['ratio_without_startup']:.2f}"]
    rss = med["a"]["peak_rss_mb_max"]
    lines += ["", "targets"]
    lines.append(f"  pipeline wall <= {TARGET_RATIO:g}x raw limit: {r['ratio_a_b']:.2f}x  "
                 f"{'PASS' if r['ratio_a_b'] <= TARGET_RATIO else 'FAIL'}")
    lines.append(f"  peak RSS <= {TARGET_RSS_MB} MB (at {r['input_bytes'] / MB:,.0f} MB input): {rss:,.0f} MB  "
                 f"{'PASS' if rss <= TARGET_RSS_MB else 'FAIL'}")
    if "scale" in r:
        ok = r["scale"]["ratio"] <= TARGET_SCALE
        lines.append(f"  {r['scale']['k']}x input <= {TARGET_SCALE}x time per byte: {r['scale']['ratio']:.2f}x  "
                     f"{'PASS' if ok else 'FAIL'}")
    lines.append("  bytes/token: " + ", ".join(f"{k} {v['bytes_per_token']:.3f}" for k, v in r["codecs"].items()))
    lines.append(f"(benchmark took {r['benchmark_seconds']:,.0f} s)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
