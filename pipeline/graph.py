"""The pipeline graph, as one sentence per step:

    read the corpus -> tokenize it -> shuffle it globally -> lay the shards out
    -> create the output -> report rejected lines -> check the rejected fraction
    -> write the flat-tokens arrays -> commit the dataset.

`plan_job` turns options into a JobPlan when the pipeline is built (listing files and
loading the tokenizer there, so bad options fail before any worker starts);
`build_pipeline` only wires transforms.
"""
import math
import uuid
from dataclasses import dataclass, field

import apache_beam as beam

from pipeline import __version__
from pipeline.options import DEFAULT_SHARD_MB, FlatTokensOptions, validation_fraction
from transforms.commit import CommitDataset, SumCounts
from transforms.inputs import InputFile, check_readable, list_input_files, read_ranges
from transforms.read_jsonl import ReadJsonlDocuments, peek_documents
from transforms.records import TokenizedBatch
from transforms.rejected import CheckRejectedFraction, WriteRejectedLines
from transforms.shuffle import ShuffleGlobally
from transforms.tokenize import TokenizeBatches, TokenizerInfo, resolve_tokenizer
from transforms.write_zarr import CreateOutput, LayOutShards, WriteFlatTokens
from transforms.layout import lay_out
from transforms.zarr_store import SPLITS, StoreTarget

# Compressed inputs are sized on storage; text is about this many times larger.
COMPRESSION_RATIO_GUESS = 4
# How many of the corpus's first documents a fast tokenizer backend must encode exactly
# as HF tokenizers does before the run starts.
GUARD_DOCUMENTS = 256


@dataclass
class JobPlan:
    files: list[InputFile]
    tokenizer: TokenizerInfo
    target: StoreTarget
    seed: int
    validation_fraction: float
    num_shards: dict
    text_key: str
    overwrite: bool
    read_range_bytes: int
    batch_documents: int
    max_rejected_fraction: float
    rejected_url: str
    input_bytes: int = 0
    progress_dir: str | None = None  # local runs only: where workers leave progress totals
    spill_dir: str | None = None  # local runs only: where shard parts' ids wait for the sort (transforms/spill.py)
    provenance: dict = field(default_factory=dict)


def _text_bytes(files: list[InputFile]) -> int:
    return sum(f.size * (COMPRESSION_RATIO_GUESS if f.compression else 1) for f in files)


def auto_shards(text_bytes: float, shard_mb: int = DEFAULT_SHARD_MB) -> int:
    return max(1, math.ceil(text_bytes / (shard_mb << 20)))


def plan_job(o: FlatTokensOptions, storage_options: dict | None = None, run_id: str | None = None) -> JobPlan:
    storage_options = storage_options or {}
    train_files = list_input_files(o.input, "auto" if not o.validation_input else "train",
                                   storage_options=storage_options)
    valid_files = list_input_files(o.validation_input or [], "validation", first_index=len(o.input),
                                   option="--validation_input", storage_options=storage_options)
    check_readable(train_files + valid_files, storage_options)
    fraction = validation_fraction(o)
    train_bytes = _text_bytes(train_files)
    if o.num_shards:
        num_shards = {"train": o.num_shards, "validation": o.num_shards}
    else:
        num_shards = {"train": auto_shards(train_bytes * (1 - fraction)),
                      "validation": auto_shards(train_bytes * fraction + _text_bytes(valid_files))}
    first_documents = [] if o.tokenizer == "bytes" else peek_documents(
        train_files + valid_files, GUARD_DOCUMENTS, o.text_key, storage_options)
    tokenizer = resolve_tokenizer(o.tokenizer, storage_options, o.tokenizer_backend, first_documents,
                                  o.tokenizer_check_fraction)
    target = StoreTarget(
        url=o.output, zarr_format=o.zarr_format, tokens_chunk=o.tokens_chunk_size,
        seq_starts_chunk=o.seq_starts_chunk_size, chunks_per_shard=o.chunks_per_shard or None,
        codec=o.codec, run_id=run_id or uuid.uuid4().hex, storage_options=storage_options)
    provenance = {
        "tokenizer": tokenizer.provenance(),
        "seed": o.seed,
        "validation_fraction": fraction,
        "inputs": list(o.input),
        "validation_inputs": list(o.validation_input or []),
        "text_key": o.text_key,
        "input_files": len(train_files) + len(valid_files),
        "package": {"name": "flat-tokens-beam", "version": __version__},
        "run_id": target.run_id,
        "rejected_output": rejected_output(o),
    }
    return JobPlan(
        files=train_files + valid_files, tokenizer=tokenizer, target=target, seed=o.seed,
        validation_fraction=fraction, num_shards=num_shards, text_key=o.text_key,
        overwrite=o.overwrite, read_range_bytes=o.read_range_mb << 20, batch_documents=o.batch_documents,
        max_rejected_fraction=o.max_rejected_fraction, rejected_url=rejected_output(o),
        input_bytes=_text_bytes(train_files + valid_files), provenance=provenance)


def rejected_output(o: FlatTokensOptions) -> str:
    return o.rejected_output or o.output.rstrip("/") + ".rejected"


def build_pipeline(p: beam.Pipeline, plan: JobPlan):
    """Wires the job; returns the PCollection of the committed dataset's stats."""
    so = plan.target.storage_options
    singleton = beam.pvalue.AsSingleton
    corpus = p | "ReadCorpus" >> ReadJsonlDocuments(
        read_ranges(plan.files, plan.read_range_bytes), plan.text_key,
        batch_documents=plan.batch_documents, storage_options=so, progress_dir=plan.progress_dir)
    tokenized = corpus.documents | "Tokenize" >> beam.ParDo(
        TokenizeBatches(plan.tokenizer, so, plan.progress_dir)).with_output_types(TokenizedBatch)
    shards, sizes = tokenized | "ShuffleGlobally" >> ShuffleGlobally(
        plan.seed, plan.validation_fraction, plan.num_shards, plan.spill_dir)
    # Combines without defaults and one Impulse per "once": a CombineGlobally's default adds
    # five transforms and a Create four, which Beam builds, translates and runs even for
    # tiny inputs. Counts and chunk receipts are never empty (every input range reports its
    # counts; the end markers' chunk always exists); an input without documents has no
    # shard sizes, and lays out no shards.
    layout = sizes | "LayOutShards" >> beam.CombineGlobally(LayOutShards()).without_defaults()
    layout_view = singleton(layout, default_value=lay_out({}, SPLITS))
    counts = (
        (corpus.counts, tokenized | "CountEmpty" >> beam.Map(lambda b: {"empty": b.empty}))
        | "GatherCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombineGlobally(SumCounts()).without_defaults()
    )
    created = (
        p
        | "Once" >> beam.Impulse()
        | "CreateOutput" >> beam.ParDo(CreateOutput(plan.target, plan.overwrite, plan.rejected_url), layout_view))
    reports = corpus.rejected | "ReportRejectedLines" >> WriteRejectedLines(
        plan.rejected_url, beam.pvalue.AsList(corpus.line_counts), singleton(created), so)
    ready = counts | "CheckRejectedFraction" >> beam.ParDo(
        CheckRejectedFraction(plan.max_rejected_fraction, plan.rejected_url),
        beam.pvalue.AsList(reports), singleton(created))
    chunks_written = shards | "WriteFlatTokens" >> WriteFlatTokens(plan.target, layout_view, singleton(ready))
    return (chunks_written, layout, counts) | "CommitDataset" >> CommitDataset(plan.target, plan.provenance)
