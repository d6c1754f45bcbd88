"""Smoke tests of benchmarks/bench_pipeline.py, bench_reader.py, bench_resume.py, bench_unit_check.py,
bench_codecs.py, bench_runners.py, bench_checksums.py, bench_dedup.py, bench_dedup_against.py, bench_report.py,
bit_flips.py and
simulate_scale.py on tiny
inputs: they run end to end and
report every field (no timing assertions: the numbers depend on the machine)."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, SAMPLE, run_pipeline, write_jsonl

BENCH = REPO / "benchmarks" / "bench_pipeline.py"


@pytest.mark.slow
def test_bench_pipeline_smoke(tmp_path):
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:200]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results, work = tmp_path / "bench.json", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--input", str(corpus), "--tokenizer", str(SAMPLE / "tokenizer.json"),
         "--rounds", "2", "--hf", "--scales", "5", "--codecs", "blosc-lz4", "--modes", "multi_processing",
         "--workers", "2", "--json", str(results), "--workdir", str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    out = proc.stdout
    n = os.cpu_count() if not hasattr(os, "sched_getaffinity") else len(os.sched_getaffinity(0))
    for field in ("(a) pipeline, default options", "(p) pipeline, multi_processing x2", "(b) raw limit, 1 process",
                  "(d) same-output limit", "(c) raw limit with HF encode_batch_fast", "every round",
                  "medians (minimums)", "wall s", "CPU s", "tokens/s", "MB/s", "peak RSS MB", "(a) over (b): wall",
                  "(a) over (d): wall", "(p) over (a): wall", "(a) used: one process", "cores (this process",
                  "load average", "at start", "at end", "zstd (default)", "blosc-lz4", "bytes/token",
                  "self time by row", "beam overhead", "tokenizer", "zarr/numcodecs", "orjson/json", "by step",
                  "tokenize (TokenizeBatches, staging)", "by input size", "RSS GB/GB", "targets",
                  "2 cores, 5x: multi_processing x2 CPU <= 1.15x the default's",
                  "2 cores, 5x: pipeline wall <= 1.3x the same-output limit's (d)",
                  "2 cores, 5x: pipeline CPU <= 1.3x the same-output limit's (d)",
                  "2 cores, 5x: pipeline wall <= 1.9x the raw limit's (b)",
                  "2 cores, 5x: pipeline CPU <= 1.9x the raw limit's (b)",
                  "16 cores, >= 2.5 GB: default wall <= 2x the raw limit's on all cores (e)",
                  "16 cores, >= 2.5 GB: default CPU <= 1.3x the raw limit's on all cores (e)",
                  "1x: peak RSS <= 1,024 MB", "5x: peak RSS grows <= 0.1 GB per GB", "output bytes per token (default codec) <= 1.11"):
        assert field in out, f"{field!r} missing from:\n{out}"
    if n > 1:
        assert f"(e) raw limit, {n} processes at once" in out
    target_lines = out[out.index("\ntargets"):].splitlines()[2:-1]
    assert target_lines and all(line.rstrip().endswith(("PASS", "FAIL")) or "not measured (" in line
                                for line in target_lines), target_lines
    # on a machine of fewer than 16 cores the 16-core targets cannot be measured, and say so
    many = [line for line in target_lines if line.lstrip().startswith("16 cores")]
    assert len(many) == 2 and (n >= 16 or all("not measured" in line for line in many)), many
    two = [line for line in target_lines if line.lstrip().startswith("2 cores, 5x")]
    assert len(two) == 5 and (n != 2 or all(line.rstrip().endswith(("PASS", "FAIL")) for line in two)), two

    r = json.loads(results.read_text())
    assert r["cpu_count"] == n and len(r["load_average_start"]) == 3 and len(r["load_average_end"]) == 3
    assert r["modes"] == ["multi_processing"] and r["workers"] == 2
    kinds = {"a", "p", "b", "d", "c"} | ({"e"} if n > 1 else set())
    assert set(r["medians"]) == kinds
    tokens = {k: m["tokens"] for k, m in r["medians"].items()}
    assert tokens["a"] > 0 and len(set(tokens.values())) == 1, tokens  # same corpus, same tokenizer, same ids
    for k, m in r["medians"].items():
        assert m["wall_seconds"] > 0 and m["peak_rss_mb"] > 0 and m["tokens_per_second"] > 0
        assert m["cpu_seconds"] > 0 and m["input_mb_per_second"] > 0 and len(m["walls"]) == 2
        assert m["wall_seconds_min"] == min(x["wall_seconds"] for x in r["runs"][k])
        assert m["peak_rss_mb_max"] == max(x["peak_rss_mb"] for x in r["runs"][k])
    # the worker processes' CPU is in (p)'s: a tree's CPU, at least its launcher's share
    assert all(x["parallelism"]["mode"] == "multi_processing" and x["parallelism"]["workers"] == 2
               for x in r["runs"]["p"])
    assert all(x["parallelism"]["mode"] == "in_memory" for x in r["runs"]["a"])
    for key in ("b", "d", "c"):
        q = r["ratios"][key]
        assert q["wall"] == round(r["medians"]["a"]["wall_seconds"] / r["medians"][key]["wall_seconds"], 3)
        assert q["cpu"] == round(r["medians"]["a"]["cpu_seconds"] / r["medians"][key]["cpu_seconds"], 3)
    assert r["mode_ratios"]["p"]["cpu"] == round(r["medians"]["p"]["cpu_seconds"] / r["medians"]["a"]["cpu_seconds"], 3)
    assert r["raw_backend"] in ("fastokens", "hf")
    assert set(r["codecs"]) == {"zstd", "blosc-lz4"}
    assert all(c["bytes_per_token"] > 0 for c in r["codecs"].values())
    stages = dict(r["profile"]["stages"])
    assert stages["Beam Pipeline.run, of which:"] > 0
    assert r["profile"]["self_time"] and r["profile"]["total_seconds"] > 0
    levels = r["levels"]
    assert [(lv["k"], lv["rounds"]) for lv in levels] == [(1, 2), (5, 1)]
    for lv in levels:
        assert set(lv["medians"]) == (kinds if lv["k"] == 1 else kinds - {"c"})
        assert lv["medians"]["a"]["tokens"] == lv["medians"]["b"]["tokens"] == lv["k"] * tokens["a"]
        assert all(len(lv["runs"][k]) == lv["rounds"] for k in lv["runs"])
        assert lv["ratios"]["b"]["cpu"] == round(lv["medians"]["a"]["cpu_seconds"]
                                                 / lv["medians"]["b"]["cpu_seconds"], 3)
    for lv in levels[1:]:
        grown = (lv["medians"]["a"]["peak_rss_mb_max"] - levels[0]["medians"]["a"]["peak_rss_mb_max"]) * 2**20 / 1e9
        assert lv["rss_growth_gb_per_gb"] == round(grown / ((lv["input_bytes"] - r["input_bytes"]) / 1e9), 4)
        assert lv["time_per_byte_vs_1x"] > 0
    assert not any(work.iterdir()), "the work directory is removed without --keep"


@pytest.mark.slow
def test_bench_reader_smoke(tmp_path):
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:200]
    dataset = tmp_path / "ds.zarr"
    run_pipeline("--input", write_jsonl(tmp_path / "tiny.jsonl", texts), "--tokenizer", "bytes", "--output", dataset)
    results = tmp_path / "bench-reader.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_reader.py"), "--dataset", str(dataset), "--rounds", "1",
         "--length", "64", "--batch", "4", "--sample", "5", "--json", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("(1) iterate all sequences", "(2) packed_batches, one epoch", "(3) raw zarr", "(4) sequence(i)",
                  "tokens/s", "loop CPU s", "peak RSS MB", "load average", "targets"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    r = json.loads(results.read_text())
    m = r["medians"]
    tokens = r["dataset_info"]["tokens"]
    assert m["iterate"]["tokens"] == m["raw"]["tokens"] == tokens > 0
    assert m["packed"]["tokens"] == tokens // 64 * 64
    assert 0 < m["per_sequence"]["tokens"] < tokens
    assert all(v["tokens_per_second"] > 0 and v["cpu_seconds"] > 0 and v["peak_rss_mb"] > 0 for v in m.values())


@pytest.mark.slow
def test_raw_limit_is_standalone_and_counts_every_token(tmp_path):
    """benchmarks/raw_limit.py imports no module of this project (-X importtime lists every
    import) and counts the tokens HF tokenizers gives, with both backends."""
    from tokenizers import Tokenizer
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")]
    texts = texts * (2500 // len(texts) + 1)  # more than two 1024-document batches, and a partial one
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    tok = Tokenizer.from_file(str(SAMPLE / "tokenizer.json"))
    expected = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    for backend in ("fastokens", "hf"):
        proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "benchmarks" / "raw_limit.py"), str(corpus),
                               str(SAMPLE / "tokenizer.json"), "--backend", backend],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "orjson" in imported and not imported & {"pipeline", "transforms", "flat_tokens", "benchmarks"}, imported
        counted = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (counted["tokens"], counted["documents"]) == (expected, len(texts)), (backend, counted)


@pytest.mark.slow
def test_raw_limit_on_several_processes_counts_every_token_once(tmp_path):
    """--processes N splits the file into N byte ranges, one process each: every line is
    read by exactly one of them, wherever the ranges' bounds fall (lines of all lengths,
    blank lines, no newline at the end)."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")]
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    with open(corpus, "ab") as f:
        f.write(b"\n\n" + json.dumps({"text": "the last line, without a newline"}).encode())
    counted = []
    for n in (1, 2, 3, 7):
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "raw_limit.py"), str(corpus),
                               str(SAMPLE / "tokenizer.json"), "--processes", str(n)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        counted.append((found["tokens"], found["documents"]))
    assert counted[0][1] == len(texts) + 1 and len(set(counted)) == 1, counted


@pytest.mark.slow
def test_same_output_limit_is_standalone_and_writes_the_encoded_ids(tmp_path):
    """benchmarks/same_output_limit.py imports no module of this project, and its files hold
    every document's ids in order as the format encodes them (2*id + 1 on a document's first
    token), zstd-compressed, in chunks of 262,144 tokens."""
    import numcodecs
    import numpy as np
    from tokenizers import Tokenizer
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")]
    texts = (texts * 6)[:3000] + [""]  # more than a chunk of tokens, and an empty document
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    tok = Tokenizer.from_file(str(SAMPLE / "tokenizer.json"))
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    expected = np.concatenate([np.array(i, dtype=np.uint32) * 2 + (np.arange(len(i)) == 0) for i in ids if i])
    for backend in ("fastokens", "hf"):
        out = tmp_path / f"out-{backend}"
        proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "benchmarks" / "same_output_limit.py"),
                               str(corpus), str(SAMPLE / "tokenizer.json"), str(out), "--backend", backend],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "numcodecs" in imported and not imported & {"pipeline", "transforms", "flat_tokens", "benchmarks"}, imported
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        chunks = sorted(out.iterdir(), key=lambda p: int(p.name))
        assert found["chunks"] == len(chunks) >= 2 and found["bytes_written"] == sum(p.stat().st_size for p in chunks)
        codec = numcodecs.Zstd(level=1)
        decoded = [np.frombuffer(codec.decode(p.read_bytes()), dtype=np.uint32) for p in chunks]
        assert all(d.size == 1 << 18 for d in decoded[:-1])
        assert np.array_equal(np.concatenate(decoded), expected)
        assert (found["tokens"], found["documents"]) == (expected.size, len(texts))


@pytest.mark.slow
def test_simulate_scale_smoke(tmp_path):
    """benchmarks/simulate_scale.py on a small layout: every phase runs, the commit re-made from
    the run's own parts matches what the run committed (the script asserts it), and the
    projection has every row of docs/design.md's "1 TB of text" table."""
    results = tmp_path / "scale.json"
    # the worker processes' CPU per byte, from a bench_pipeline.py result's slope (the shape it writes)
    level = lambda k, x, a: {"k": k, "input_bytes": k * 10**8, "medians": {  # noqa: E731
        "x": {"cpu_seconds": x}, "a": {"cpu_seconds": a}}}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"cpu_count": 2, "levels": [level(5, 9.0, 8.0), level(1, 3.0, 2.4)]}))
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "simulate_scale.py"), "--work", str(tmp_path / "work"),
         "--documents", "3000", "--num_shards", "200", "--gcs_objects", "30", "--gcs_io_mb", "4",
         "--bench_json", str(bench), "--json", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    r = json.loads(results.read_text())
    m = r["measured"]
    assert m["simulated"]["documents"] == 3000 and m["layout_commit"]["shards"] > 200
    assert m["simulated"]["chunks"] == sum(v for k, v in m["run"]["objects"].items() if k != "all")
    assert m["gcs"]["gcsfs_find"]["result"] == 30 and m["shard"]["tokens"] > 15_000_000
    assert m["gcs"]["io"]["bytes"] == 4 << 20 and m["gcs"]["io"]["cpu_ns_per_byte"] > 0
    assert m["workers"]["key"] == "x" and m["workers"]["cpu_per_byte"] == 6.0 / 4e8
    assert m["workers"]["over_one_process"] == round(6.0 / 5.6, 3)
    cpu = dict((row[0], row[1:]) for row in r["projection"])["CPU"]
    assert "15.0 ns/byte on worker processes" in cpu[1] and "gcsfs" in cpu[1], cpu
    rows = [row[0] for row in r["projection"]]
    for row in ("shuffle shards (auto)", "zarr chunks (objects)", "objects written", "layout side input",
                "receipts side input (commit)", "commit step", "launcher: job graph", "CPU", "Dataflow workers"):
        assert row in rows, rows
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_bench_resume_smoke(tmp_path):
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:300]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results, work = tmp_path / "bench-resume.json", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_resume.py"), "--input", str(corpus), "--tokenizer", "bytes",
         "--scale", "2", "--rounds", "1", "--json", str(results), "--workdir", str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("every round", "(a) staged s", "(b) --no_staging s", "overhead", "(c) killed at s",
                  "staging's overhead", "staging area on disk", "bytes/token", "targets",
                  "the resumed run takes <= 35%", "staging adds <= 10%"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    r = json.loads(results.read_text())
    (one,) = r["rounds"]
    assert one["a"]["tokens"] == one["b"]["tokens"] > 0 and one["c"]["killed_at_seconds"] > 0
    assert "d" in one or one["c"]["finished_before_the_kill"] or one["c"]["left"]["committed"]
    assert r["peak"]["staging_peak_bytes"] > 0 and r["medians"]["overhead_of_rounds"] == one["overhead"]
    assert r["medians"]["overhead"] == round(one["a"]["wall_seconds"] / one["b"]["wall_seconds"] - 1, 3)
    assert not any(work.iterdir()), "the work directory is removed without --keep"


@pytest.mark.slow
def test_bench_unit_check_smoke(tmp_path):
    """benchmarks/bench_unit_check.py on a tiny corpus: every measurement, the run, the shares."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:300]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results = tmp_path / "unit-check.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_unit_check.py"), "--input", str(corpus), "--tokenizer",
         "bytes", "--rounds", "1", "--json", str(results)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("a_read", "b_read_digest", "c_reader", "d_reader_recording", "e_resume_check", "f_run",
                  "resume check / run:", "recording / run:"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    r = json.loads(results.read_text())
    assert r["units"] >= 1 and r["f_run"]["wall_seconds"] > 0 and 0 <= r["check_share_of_run"]["cpu_seconds"]


@pytest.mark.slow
def test_bench_codecs_smoke(tmp_path):
    """benchmarks/bench_codecs.py on a dataset the pipeline wrote: every setting's line, and
    level 1 reports the dataset's own bytes per token for the chunks it re-encoded."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [f"document {i} " + "some words " * (i % 40) for i in range(3000)])
    out = tmp_path / "out.zarr"
    run_pipeline("--input", corpus, "--output", out, "--tokenizer", "bytes", "--tokens_chunk_size", "4096",
                 "--quiet")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_codecs.py"), str(out), "--chunks", "5",
                           "--rounds", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert lines[0].startswith("5 chunks of "), proc.stdout
    for name in ("zstd level 1 (numcodecs)", "zstd level 3 (numcodecs)", "zstd level -1 (zstandard)"):
        assert any(line.startswith(name) for line in lines), proc.stdout
    folder = out / "train" / "encoded_tokens"
    names = sorted((n for n in folder.iterdir() if n.name.isdigit()), key=lambda p: int(p.name))
    step = max(1, len(names) // 5)
    sampled = names[::step][:5]
    stored = sum(p.stat().st_size for p in sampled) / (4096 * len(sampled))
    level1 = next(line for line in lines if line.startswith("zstd level 1 (numcodecs)"))
    assert abs(float(level1.split()[-2]) - stored) < 0.01, (level1, stored)


def test_bench_page_cost_smoke(tmp_path):
    """benchmarks/bench_page_cost.py: one line per measurement, each with its size and
    seconds, and nothing left in the directory it wrote into."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_page_cost.py"), "--mb", "8",
                           "--dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "write into a new file", "write into another new file", "write into a new file, after deleting one",
        "touch fresh anonymous memory (first time)", "touch fresh anonymous memory (second time)",
        "touch fresh anonymous memory (third time)"], proc.stdout
    for line in lines:
        fields = line.split()
        assert "8 MiB" in line and all(float(fields[fields.index(k) + 1]) >= 0 for k in ("wall", "sys", "sys/GiB"))
    assert list(tmp_path.iterdir()) == []
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_page_cost.py"), "--mb", "6"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--mb must be a positive multiple of 4" in bad.stderr


@pytest.mark.slow
def test_bench_runners_smoke(tmp_path):
    """benchmarks/bench_runners.py on a tiny corpus dealt into files: every mode runs, every
    output is compared with the in-process one, and the raw limit counts the same tokens."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:200]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results = tmp_path / "runners.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_runners.py"), "--input", str(corpus), "--tokenizer",
         str(SAMPLE / "tokenizer.json"), "--copies", "2", "--parts", "3", "--modes", "threads:2,processes:2",
         "--json", str(results), "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("in_process", "threads:2", "processes:2", "raw limit", "wall s", "CPU s", "peak RSS MB",
                  "identical", "load average"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    r = json.loads(results.read_text())
    assert (r["files"], r["copies"]) == (3, 2)
    assert set(r["medians"]) == {"in_process", "threads:2", "processes:2"}
    assert all(run["identical"] for runs in r["runs"].values() for run in runs)
    tokens = {m["tokens"] for m in r["medians"].values()} | {r["raw_limit"]["tokens"]}
    assert len(tokens) == 1 and tokens.pop() > 0
    for m in r["medians"].values():
        assert m["wall_seconds"] > 0 and m["cpu_seconds"] > 0 and m["peak_tree_rss_mb"] > 0
    # The workers are processes of their own: the tree holds more than its largest process.
    workers = r["runs"]["processes:2"][0]
    assert workers["peak_tree_rss_mb"] > workers["peak_process_rss_mb"]
    assert [p for p in tmp_path.iterdir() if p.name.startswith("bench-runners-")] == []  # removed


@pytest.mark.slow
def test_bench_checksums_smoke(tmp_path):
    """benchmarks/bench_checksums.py against a checkout of this repository (standing in for
    one from before the checksums): every part reports, and the reads compare a dataset with
    checksums and its stripped copy."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:200]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results = tmp_path / "bench-checksums.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_checksums.py"), "--input", str(corpus), "--tokenizer",
         str(SAMPLE / "tokenizer.json"), "--before", str(REPO), "--rounds", "1", "--json", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("(A) writing end to end", "without checksums", "with checksums (this checkout)",
                  "(B) the work checksums add", "staged ids' CRC-32C", "writing adds", "decode:",
                  "(C) reading the train split", "iterate", "packed", "target: <= 3% more CPU"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    r = json.loads(results.read_text())
    assert len(r["write"]["before"]) == len(r["write"]["after"]) == 1
    assert {k: len(v) for k, v in r["read"].items()} == {
        "iterate without": 1, "iterate with": 1, "packed without": 1, "packed with": 1}
    assert r["read"]["iterate with"][0]["checksums"] == "zstd+crc32c-frame"
    assert r["read"]["iterate without"][0]["checksums"] is None
    assert r["read"]["iterate with"][0]["tokens"] == r["read"]["iterate without"][0]["tokens"] > 0
    assert set(r["summary"]) == {"write_end_to_end", "write_added", "read_added_decode", "read_iterate",
                                 "read_packed"}


@pytest.mark.slow
def test_bit_flips_script_smoke(tmp_path):
    """benchmarks/bit_flips.py: a few flips, each found by verify and by the reader; and (issue 37)
    a swap, a foreign chunk, each split copied from another build and the metadata edits."""
    results = tmp_path / "flips.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bit_flips.py"), "--places", "4",
                           "--placements", "1", "--json", str(results)], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "4 random single-bit flips" in proc.stdout and "every flip found by both: yes" in proc.stdout
    r = json.loads(results.read_text())
    assert r["random"] == {"verify": {"error": 4}, "reader": {"error": 4}} and len(r["flips"]) == 4
    assert set(r["placements"]) == {"swap", "foreign chunk", "split copy", "metadata edit"}
    assert r["placed"] and all(f["verify"] == f["reader"] == "error" for f in r["placed"]), r["placed"]


@pytest.mark.slow
def test_bench_dedup_smoke(tmp_path):
    """benchmarks/bench_dedup.py: exact against near (words, tokens) and the quality scores."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:300]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results = tmp_path / "bench-dedup.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_dedup.py"), "--input", str(corpus), "--tokenizer", "bytes",
         "--scale", "2", "--rounds", "1", "--quality_documents", "300", "--quality_setting", "words",
         "--quality_setting", "tokens --near_hashes 128", "--short_documents", "500", "--short_bytes", "1024",
         "--json", str(results), "--workdir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for field in ("every round", "(a) --dedup exact", "(b) --dedup near (words)", "(c) --dedup near tokens",
                  "ratio b/a", "peak RSS growth", "targets", "1x: peak RSS <= 1,024 MB",
                  "cost on short documents: 500 documents", "short documents: --dedup near CPU / --dedup exact CPU",
                  "quality:", "against word 5-grams", "against token 5-grams", "recall", "precision",
                  "across train and validation"):
        assert field in proc.stdout, f"{field!r} missing from:\n{proc.stdout}"
    verdicts = [line for line in proc.stdout.splitlines() if "(target <= 1.6)" in line]
    assert len(verdicts) == 2 and all(line.endswith(("PASS", "FAIL")) for line in verdicts), proc.stdout
    r = json.loads(results.read_text())
    short = r["short"]
    assert short["cpu_ratio"] == round(short["medians"]["b"]["cpu_seconds"] / short["medians"]["a"]["cpu_seconds"], 3)
    assert short["runs"]["a"][0]["sequences"] == 500 and 400_000 < short["bytes"] < 700_000
    cost = r["cost"]
    assert cost["runs"]["a"][0]["sequences"] == cost["runs"]["b"][0]["sequences"] + cost["runs"]["b"][0][
        "near_duplicates"] > 0
    assert cost["ratios"]["b"]["cpu_seconds"] == round(cost["medians"]["b"]["cpu_seconds"]
                                                      / cost["medians"]["a"]["cpu_seconds"], 3)
    quality = r["quality"]
    assert quality["planted"] > 0 and set(quality["settings"]) == {"words", "tokens --near_hashes 128"}
    words = quality["settings"]["words"]["against word 5-grams"]
    assert words["pairs_at_threshold_plus_0.05"] > 0 and words["recall"] >= 0.95 and words["precision"] >= 0.95
    assert words["pairs_across_splits"] == 0


@pytest.mark.slow
def test_bench_dedup_takes_a_short_document_corpus_as_it_is(tmp_path):
    """--short_corpus: the given documents, every one, are the short-document corpus (the 5x
    and quality runs skipped), and its ratio is printed with PASS or FAIL."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-2.jsonl", encoding="utf-8")][:120]
    corpus = write_jsonl(tmp_path / "short.jsonl", texts)
    results = tmp_path / "bench-dedup.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_dedup.py"), "--input", str(corpus), "--tokenizer", "bytes",
         "--short_corpus", str(corpus), "--no_cost", "--no_quality", "--rounds", "1", "--json", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "cost on short documents: 120 documents" in proc.stdout and str(corpus) in proc.stdout, proc.stdout
    verdicts = [line for line in proc.stdout.splitlines() if "(target <= 1.6)" in line]
    assert len(verdicts) == 1 and verdicts[0].endswith(("PASS", "FAIL")), proc.stdout
    short = json.loads(results.read_text())["short"]
    assert short["runs"]["a"][0]["sequences"] == len(set(texts)) and short["bytes"] == corpus.stat().st_size
    assert corpus.exists()  # a given corpus is the user's: not removed


@pytest.mark.slow
def test_bench_report_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_report.py"), "--sizes_mb", "0.2", "1", "--repeats", "1",
         "--work", str(tmp_path), "--report_args", "--sample_tokens 4096 --sample_sequences 256"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if "MB of text:" in line]
    assert len(lines) == 2 and all("s wall" in line and "s its own" in line for line in lines), proc.stdout
    assert "4,096 tokens" in lines[1] and "256 sequence lengths" in lines[1]  # the larger one is sampled
    assert "ratio 1 MB / 0.2 MB:" in proc.stdout


def bench_dedup_against(tmp_path, *extra):
    """benchmarks/bench_dedup_against.py on two days of 200 of the sample's texts: (the process,
    its --json results)."""
    texts = [json.loads(line)["text"] for line in open(SAMPLE / "corpus-1.jsonl", encoding="utf-8")][:300]
    corpus = write_jsonl(tmp_path / "tiny.jsonl", texts)
    results = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_dedup_against.py"), "--input", str(corpus), "--tokenizer",
         "bytes", "--days", "2", "--documents_per_day", "200", "--rounds", "1", "--json", str(results),
         "--workdir", str(tmp_path / "work"), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc, json.loads(results.read_text())


@pytest.mark.slow
def test_bench_dedup_against_smoke(tmp_path):
    """benchmarks/bench_dedup_against.py: the index's bytes per document, and CPU with and without."""
    proc, r = bench_dedup_against(tmp_path)
    assert r["indexed"] == 400 and 17 <= r["index_bytes_per_document"] < 18  # 17 a document, 20 a file
    assert [run["removed"] for run in r["runs"]["b"]] == [r["repeated"]] == [20]
    assert [run["removed"] for run in r["runs"]["a"]] == [0]
    verdicts = [line for line in proc.stdout.splitlines() if "(target <=" in line]
    assert len(verdicts) == 2 and all(line.endswith(("PASS", "FAIL")) for line in verdicts), proc.stdout


@pytest.mark.slow
def test_bench_dedup_against_near_smoke(tmp_path):
    """bench_dedup_against.py --dedup near: the index with its near part (64 bytes a document
    and the files' headers), and the planted near-copies of earlier texts removed as such."""
    proc, r = bench_dedup_against(tmp_path, "--dedup", "near")
    # Documents of lines drawn at random may be near-copies of each other: a few are removed inside a day.
    assert 390 <= r["indexed"] <= 400 and 64 <= r["index_bytes_per_document"] < 66
    (b,) = r["runs"]["b"]
    assert b["removed"] - b["removed_near"] == r["repeated"] == 20  # the exact repeats
    assert 18 <= b["removed_near"] <= 20 + 2  # the 20 planted near-copies (J about 0.9), recall 0.999 each
    assert [run["removed"] for run in r["runs"]["a"]] == [0]
