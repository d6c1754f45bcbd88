"""The pipeline graph, as one sentence per step:

    read the corpus -> tokenize it -> [drop duplicate texts] -> [count each source's
    train tokens -> turn them into multipliers] -> shuffle it globally (making a mixture's
    copies) -> lay the shards out -> create the output -> report rejected lines
    -> check the rejected fraction -> write the flat-tokens arrays -> commit the dataset.

The bracketed steps run with --dedup exact and --mixture only; without them the graph is
the plain one.

`plan_job` turns options into a JobPlan when the pipeline is built (listing files and
loading the tokenizer there, so bad options fail before any worker starts);
`build_pipeline` only wires transforms.
"""
import math
import uuid
from dataclasses import dataclass, field, replace

import apache_beam as beam

from pipeline import __version__
from pipeline.options import DEFAULT_SHARD_MB, FlatTokensOptions, validation_fraction
from transforms import mixture as mix
from transforms.commit import CommitDataset, SumCounts
from transforms.dedup import DropDuplicates
from transforms.inputs import (JSONL, InputFile, check_no_overlap, check_readable, input_index, list_input_files,
                               read_ranges)
from transforms.parquet import RowGroup, list_row_groups
from transforms.read_corpus import ReadCorpus, peek_input
from transforms.read_jsonl import check_text_key
from transforms.records import TokenizedBatch
from transforms.rejected import CheckRejectedFraction, WriteRejectedLines
from transforms.shuffle import ShuffleGlobally, count_available, count_copies
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
    expected_owner: tuple = (0, "")  # (claim generation, run id) the launcher found at the output
    spill_dir: str | None = None  # local runs only: where shard parts' ids wait for the sort (transforms/spill.py)
    provenance: dict = field(default_factory=dict)
    row_groups: list[RowGroup] = field(default_factory=list)  # of the Parquet files, from their footers
    dedup_shards: int | None = None  # --dedup exact: shards of the dedup shuffle; None: no dedup
    mixture: mix.Mixture | None = None
    source_of_input: list[int] | None = None  # with a mixture: the source of each input index


def text_bytes_by_file(files: list[InputFile], row_groups: list[RowGroup] = ()) -> dict[str, int]:
    """The text each file holds, estimated: JSONL files by their size (compressed ones times a
    guess of the ratio), Parquet files by the uncompressed size of their text column."""
    sizes = {f.key: f.size * (COMPRESSION_RATIO_GUESS if f.compression else 1) if f.format == JSONL else 0
             for f in files}
    for g in row_groups:
        sizes[g.file.key] += g.text_bytes
    return sizes


def _text_bytes(files: list[InputFile], by_file: dict[str, int]) -> int:
    return sum(by_file[f.key] for f in files)


def auto_shards(text_bytes: float, shard_mb: int = DEFAULT_SHARD_MB) -> int:
    return max(1, math.ceil(text_bytes / (shard_mb << 20)))


@dataclass
class _Inputs:
    """The listed input files, which option and pattern listed each, and (with a mixture)
    the source of each input index."""

    train: list[InputFile]
    validation: list[InputFile]
    origins: list[str]
    source_of_input: list[int] | None = None
    mixture: mix.Mixture | None = None


def _list_inputs(o: FlatTokensOptions, storage_options: dict) -> _Inputs:
    if not o.mixture:
        train = list_input_files(o.input, "auto" if not o.validation_input else "train",
                                 storage_options=storage_options)
        valid = list_input_files(o.validation_input or [], "validation", first_index=len(o.input),
                                 option="--validation_input", storage_options=storage_options)
        origins = [f"--input {p}" for p in o.input] + [f"--validation_input {p}" for p in o.validation_input or []]
        return _Inputs(train, valid, origins)
    mixture = mix.load_mixture(o.mixture, storage_options)
    inputs = _Inputs([], [], [], [], mixture)
    for index, source in enumerate(mixture.sources):
        for patterns, split, files, field_name in (
                (source.inputs, "train" if source.validation_inputs else "auto", inputs.train, "input"),
                (source.validation_inputs, "validation", inputs.validation, "validation_input")):
            option = f"--mixture source {source.name!r} {field_name}"
            listed = list_input_files(list(patterns), split, first_index=len(inputs.origins), option=option,
                                      storage_options=storage_options)
            files += [replace(f, text_key=source.text_key) for f in listed]
            inputs.origins += [f"{option} {p}" for p in patterns]
            inputs.source_of_input += [index] * len(patterns)
    return inputs


def _train_text_bytes(inputs: _Inputs, fraction: float, by_file: dict[str, int]) -> float:
    """The train split's text, estimated: with a mixture, T in bytes (see transforms.mixture)."""
    def held(files):
        return sum(by_file[f.key] * (1 - fraction if f.split == "auto" else 1) for f in files)
    if inputs.mixture is None:
        return held(inputs.train)
    by_source = [held([f for f in inputs.train if inputs.source_of_input[input_index(f.key)] == i])
                 for i in range(len(inputs.mixture.sources))]
    return float(mix.train_total(inputs.mixture, by_source))


def plan_job(o: FlatTokensOptions, storage_options: dict | None = None, run_id: str | None = None) -> JobPlan:
    storage_options = storage_options or {}
    inputs = _list_inputs(o, storage_options)
    train_files, valid_files = inputs.train, inputs.validation
    if o.dedup != "exact":
        check_no_overlap(train_files + valid_files, lambda f: inputs.origins[input_index(f.key)])
    check_readable(train_files + valid_files, storage_options)
    row_groups = list_row_groups(train_files + valid_files, o.text_key, storage_options)
    fraction = validation_fraction(o)
    by_file = text_bytes_by_file(train_files + valid_files, row_groups)
    train_bytes = _train_text_bytes(inputs, fraction, by_file)
    all_bytes = _text_bytes(train_files + valid_files, by_file)
    if o.num_shards:
        num_shards = {"train": o.num_shards, "validation": o.num_shards}
    else:
        held_out = _text_bytes([f for f in train_files if f.split == "auto"], by_file) * fraction
        num_shards = {"train": auto_shards(train_bytes),
                      "validation": auto_shards(held_out + _text_bytes(valid_files, by_file))}
    peek = peek_input(train_files + valid_files, GUARD_DOCUMENTS, o.text_key, storage_options)
    check_text_key(peek, o.text_key)  # for every tokenizer: a wrong key would reject every line
    tokenizer = resolve_tokenizer(o.tokenizer, storage_options, o.tokenizer_backend, peek.texts,
                                  o.tokenizer_check_fraction)
    target = StoreTarget(
        url=o.output, zarr_format=o.zarr_format, tokens_chunk=o.tokens_chunk_size,
        seq_starts_chunk=o.seq_starts_chunk_size, chunks_per_shard=o.chunks_per_shard or None,
        codec=o.codec, run_id=run_id or uuid.uuid4().hex, storage_options=storage_options)
    provenance = {
        "tokenizer": tokenizer.provenance(),
        "seed": o.seed,
        "validation_fraction": fraction,
        "inputs": list(o.input) if o.input else [p for s in inputs.mixture.sources for p in s.inputs],
        "validation_inputs": list(o.validation_input or []) if o.input else
        [p for s in inputs.mixture.sources for p in s.validation_inputs],
        "text_key": o.text_key,
        "input_files": len(train_files) + len(valid_files),
        "dedup": o.dedup,
        "package": {"name": "flat-tokens-beam", "version": __version__},
        "run_id": target.run_id,
        "rejected_output": rejected_output(o),
    }
    return JobPlan(
        files=train_files + valid_files, tokenizer=tokenizer, target=target, seed=o.seed,
        validation_fraction=fraction, num_shards=num_shards, text_key=o.text_key,
        overwrite=o.overwrite, read_range_bytes=o.read_range_mb << 20, batch_documents=o.batch_documents,
        max_rejected_fraction=o.max_rejected_fraction, rejected_url=rejected_output(o),
        input_bytes=all_bytes, provenance=provenance, row_groups=row_groups,
        dedup_shards=(o.num_shards or auto_shards(all_bytes)) if o.dedup == "exact" else None,
        mixture=inputs.mixture, source_of_input=inputs.source_of_input)


def rejected_output(o: FlatTokensOptions) -> str:
    return o.rejected_output or o.output.rstrip("/") + ".rejected"


def build_pipeline(p: beam.Pipeline, plan: JobPlan):
    """Wires the job; returns the PCollection of the committed dataset's stats."""
    so = plan.target.storage_options
    singleton = beam.pvalue.AsSingleton
    corpus = p | "ReadCorpus" >> ReadCorpus(
        read_ranges(plan.files, plan.read_range_bytes), plan.row_groups, plan.text_key,
        batch_documents=plan.batch_documents, storage_options=so, progress_dir=plan.progress_dir)
    tokenized = corpus.documents | "Tokenize" >> beam.ParDo(
        TokenizeBatches(plan.tokenizer, so, plan.progress_dir, digests=plan.dedup_shards is not None)
    ).with_output_types(TokenizedBatch)
    counted = [corpus.counts, tokenized | "CountEmpty" >> beam.Map(lambda b: {"empty": b.empty})]
    batches = tokenized
    if plan.dedup_shards is not None:
        distinct = tokenized | "DropDuplicates" >> DropDuplicates(
            plan.seed, plan.validation_fraction, plan.dedup_shards, plan.source_of_input)
        batches = distinct.batches
        counted.append(distinct.counts)
    sampling = None
    if plan.mixture is not None:
        sampling, source_counts = batches | "WeighSources" >> WeighSources(
            plan.mixture, plan.seed, plan.validation_fraction, plan.source_of_input)
        counted += [tokenized | "CountSourceDocuments" >> beam.Map(count_source_documents, plan.source_of_input),
                    source_counts]
    shards, sizes = batches | "ShuffleGlobally" >> ShuffleGlobally(
        plan.seed, plan.validation_fraction, plan.num_shards, sampling, plan.source_of_input, plan.spill_dir)
    if sampling is not None:
        counted.append(batches | "CountCopies" >> beam.Map(
            count_copies, plan.seed, plan.validation_fraction, plan.source_of_input, sampling))
    # Combines without defaults and one Impulse per "once": a CombineGlobally's default adds
    # five transforms and a Create four, which Beam builds, translates and runs even for
    # tiny inputs. Counts are never empty (every input range reports its counts); an input
    # without documents has no shard sizes, and lays out no shards.
    layout = sizes | "LayOutShards" >> beam.CombineGlobally(LayOutShards()).without_defaults()
    layout_view = singleton(layout, default_value=lay_out({}, SPLITS))
    counts = (
        tuple(counted)
        | "GatherCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombineGlobally(SumCounts()).without_defaults()
    )
    created = (
        p
        | "Once" >> beam.Impulse()
        | "CreateOutput" >> beam.ParDo(
            CreateOutput(plan.target, plan.overwrite, plan.rejected_url, plan.expected_owner), layout_view))
    reports = corpus.rejected | "ReportRejectedLines" >> WriteRejectedLines(
        plan.rejected_url, beam.pvalue.AsList(corpus.line_counts), singleton(created), so, plan.target.run_id)
    ready = counts | "CheckRejectedFraction" >> beam.ParDo(
        CheckRejectedFraction(plan.max_rejected_fraction, plan.rejected_url),
        beam.pvalue.AsList(reports), singleton(created))
    receipts = shards | "WriteFlatTokens" >> WriteFlatTokens(plan.target, layout_view, singleton(ready))
    return (receipts, layout, counts) | "CommitDataset" >> CommitDataset(plan.target, plan.provenance, plan.mixture)


def count_source_documents(batch: TokenizedBatch, source_of_input: list[int]) -> dict:
    """The documents a batch read, and how many were empty, credited to its mixture source."""
    source = source_of_input[input_index(batch.file_key)]
    return {mix.source_key(source, mix.DOCUMENTS): int(batch.offsets.size) + batch.empty,
            mix.source_key(source, mix.EMPTY): batch.empty}


def multipliers(counts: dict, mixture: mix.Mixture) -> list[mix.SourceSampling]:
    return mix.sampling_plan(mixture, mix.train_tokens_of(mixture, counts))[1]


class WeighSources(beam.PTransform):
    """Batches -> (the sampling plan as a singleton side input, the counts it came from).

    Sums each source's distinct train tokens over the whole input (a global combine) and
    turns them into multipliers (transforms.mixture.sampling_plan), inside the graph."""

    def __init__(self, mixture: mix.Mixture, seed: int, validation_fraction: float, source_of_input: list[int]):
        super().__init__()
        self._mixture = mixture
        self._args = (seed, validation_fraction, source_of_input)

    def expand(self, batches):
        available = batches | "CountAvailable" >> beam.Map(count_available, *self._args)
        plan = (
            available
            | "SumAvailable" >> beam.CombineGlobally(SumCounts())
            | "Multipliers" >> beam.Map(multipliers, self._mixture))
        return beam.pvalue.AsSingleton(plan), available
