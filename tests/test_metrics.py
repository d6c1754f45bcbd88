"""Beam counters, the cluster's progress bar: read back from a real run's
PipelineResult.metrics() and checked against the committed dataset's stats, and against
what this test knows of its input without the pipeline (file sizes, UTF-8 lengths with the
`bytes` tokenizer, chunk objects on disk).

The run is the job's own graph (pipeline.plan + pipeline.graph, as `flat-tokens run` builds
it) on two worker processes, so the counters cross the Fn API from the workers to the runner,
and every bundle is run twice (`--direct_runner_bundle_repeat=1`: the runner replays each
bundle once before the attempt whose results it keeps, as a retry would), so counters that
counted a discarded attempt would be too large. Committed values are read.
"""
import json

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter

from pipeline.graph import build_pipeline
from pipeline.options import FlatTokensOptions, ViewsMadeOnce, check_options
from pipeline.plan import plan_job
from pipeline.run import in_process_runner, summarize
from tests.conftest import sample_texts
from transforms.progress import NAMESPACE

TEXTS = sample_texts()[:300]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Three JSONL files: real text, some of it twice (in two files), blank lines, empty
    texts, non-ASCII text and three broken lines."""
    root = tmp_path_factory.mktemp("metrics")
    texts = TEXTS + TEXTS[:40] + ["", "", "naïve café — 東京 🚀", "x" * 20_000]
    lines = [json.dumps({"text": t}, ensure_ascii=False) for t in texts]
    lines[10:10] = ["", "   ", "{broken", '{"other": 1}', '"a string"']
    for i in range(3):
        (root / f"part-{i}.jsonl").write_text("\n".join(lines[i::3]) + "\n", encoding="utf-8")
    return root, texts


@pytest.fixture(scope="module")
def run(inputs, tmp_path_factory):
    """(metrics by name: committed values, the run's summary, the output directory)."""
    root, _ = inputs
    out = tmp_path_factory.mktemp("metrics-out") / "out.zarr"
    options = ViewsMadeOnce([
        "--input", str(root / "*.jsonl"), "--tokenizer", "bytes", "--output", str(out), "--dedup", "exact",
        "--max_rejected_fraction", "0.1", "--validation_fraction", "0.1", "--num_shards", "3",
        "--tokens_chunk_size", "4096", "--seq_starts_chunk_size", "64",
        "--direct_num_workers=2", "--direct_running_mode=multi_processing", "--direct_runner_bundle_repeat=1"])
    ft = options.view_as(FlatTokensOptions)
    check_options(ft)
    pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
    build_pipeline(pipeline, plan_job(ft))
    result = pipeline.run()
    result.wait_until_finish()
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    metrics = {}
    for kind in ("counters", "distributions"):
        for m in found[kind]:
            name = m.key.metric.name
            # One name may be updated by several steps: Beam reports each step's share.
            metrics[name] = m.committed if kind == "distributions" else metrics.get(name, 0) + m.committed
    return metrics, summarize(str(out), 1.0), out


@pytest.mark.slow
def test_counters_agree_with_the_committed_stats(run, inputs):
    metrics, summary, _ = run
    s = summary["stats"]
    kept = [t for t in inputs[1] if t]
    assert s["duplicates"] == len(kept) - len(set(kept)) >= 40
    assert (s["empty"], s["blank"], s["rejected"]) == (2, 2, 3)
    expected = {
        "documents": s["documents"], "lines": s["lines"], "blank_lines": s["blank"],
        "rejected_lines": s["rejected"], "empty_documents": s["empty"], "duplicates_removed": s["duplicates"],
        "train_tokens": s["train"]["tokens"], "validation_tokens": s["validation"]["tokens"],
        "train_sequences": s["train"]["sequences"], "validation_sequences": s["validation"]["sequences"],
    }
    expected.update({f"rejected_{reason}": n for reason, n in s["rejected_by_reason"].items()})
    assert {name: metrics.get(name) for name in expected} == expected


def test_counters_agree_with_what_the_input_and_the_output_hold(run, inputs):
    metrics, _, out = run
    root, texts = inputs
    assert metrics["input_bytes"] == sum(p.stat().st_size for p in root.glob("*.jsonl"))
    chunk_objects = [p for split in ("train", "validation") for array in ("encoded_tokens", "seq_starts")
                     for p in (out / split / array).iterdir() if not p.name.startswith(".")]
    assert metrics["chunks_written"] == len(chunk_objects) > 10
    # The bytes tokenizer: a document's length in tokens is its UTF-8 length.
    lengths = [len(t.encode("utf-8")) for t in texts]
    assert metrics["tokens"] == sum(lengths)
    d = metrics["document_tokens"]
    assert (d.count, d.sum, d.min, d.max) == (len(lengths), sum(lengths), 0, 20_000)
