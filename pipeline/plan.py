"""Planning a job: options -> a JobPlan, when the pipeline is built.

Inputs are listed (globs expanded, Parquet footers read), the first documents peeked at
and the tokenizer loaded and checked here, in the launcher, so that a bad option or input
fails before any worker starts (exit 2). The plan is all the graph needs to be wired
(pipeline/graph.py).
"""
import logging
import math
import uuid
from dataclasses import dataclass, field, replace

from pipeline import __version__, earlier
from pipeline.options import DEFAULT_SHARD_MB, FlatTokensOptions, OptionError, validation_fraction
from transforms.read import mixture as mix
from transforms.read.corpus import peek_input
from transforms.read.inputs import (JSONL, InputFile, ReadRange, absolute, check_no_overlap, check_readable,
                                    input_index, list_inputs, name_places, read_ranges)
from transforms.read.jsonl_documents import check_text_key
from transforms.read.parquet import RowGroup, list_row_groups
from transforms.shuffle.sources import MAX_SOURCES
from transforms.tokenize.lengths import LengthLimits
from transforms.tokenize.minhash import MinHashSettings
from transforms.tokenize.tokenizer import TokenizerInfo, resolve_tokenizer
from transforms.write.zarr_store import StoreTarget

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
    expected_owner: tuple = (0, "", False)  # (claim generation, run id, committed) the launcher found at the output
    take_unfinished: bool = False  # it found no committed dataset: an unfinished output may be taken (resumed)
    spill_dir: str | None = None  # local runs only: where shard parts' ids wait for the sort (transforms/shuffle/spill.py)
    local_processes: int = 1  # local runs: the runner's worker processes (several share their near features)
    provenance: dict = field(default_factory=dict)
    row_groups: list[RowGroup] = field(default_factory=list)  # of the Parquet files, from their footers
    dedup_shards: int | None = None  # --dedup exact or near: shards of the dedup shuffle; None: no dedup
    near: tuple[MinHashSettings, float] | None = None  # --dedup near: (signatures and bands, threshold)
    dedup_report: str | None = None  # --dedup_report: the report's directory (transforms/tokenize/dedup_report.py)
    dedup_against: list[str] = field(default_factory=list)  # --dedup_against's datasets (pipeline/earlier.py)
    # their index files: (dataset number, URL, the entry its dataset's manifest lists for it)
    earlier_index: list[tuple[int, str, tuple | None]] = field(default_factory=list)
    # with --dedup near: (dataset number, exact file URL, its entry, near file URL, its entry)
    earlier_near: list[tuple] = field(default_factory=list)
    mixture: mix.Mixture | None = None
    source_of_input: list[int] | None = None  # with a mixture: the source of each input index
    record_sources: list[int] | None = None  # --record_sources: the recorded source of each input index
    skipped_files: list[str] = field(default_factory=list)  # in directory inputs, not data: not read
    length_limits: LengthLimits = field(default_factory=LengthLimits)  # --min_tokens, --max_tokens
    also_ours: tuple = ()  # top-level files of the output this run writes itself (a --summary_json there)
    resume: "Resume | None" = None  # noqa: F821 - what the staging area lets this run reuse (pipeline/resume.py)

    def read_ranges(self) -> list[ReadRange]:
        """The byte ranges of the JSONL files, each read by one worker."""
        return read_ranges(self.files, self.read_range_bytes)


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
    skipped: list[str] = field(default_factory=list)  # files in directory inputs that are not data


def _list_inputs(o: FlatTokensOptions, storage_options: dict) -> _Inputs:
    listings = []

    def listed(patterns, split, option, first_index):
        listing = list_inputs(list(patterns), split, first_index, option, storage_options)
        listings.append(listing)
        return listing.files

    if not o.mixture:
        train = listed(o.input, "auto" if not o.validation_input else "train", "--input", 0)
        valid = listed(o.validation_input or [], "validation", "--validation_input", len(o.input))
        origins = [f"--input {p}" for p in o.input] + [f"--validation_input {p}" for p in o.validation_input or []]
        inputs = _Inputs(train, valid, origins)
    else:
        mixture = mix.load_mixture(o.mixture, storage_options)
        inputs = _Inputs([], [], [], [], mixture)
        for index, source in enumerate(mixture.sources):
            for patterns, split, files, field_name in (
                    (source.inputs, "train" if source.validation_inputs else "auto", inputs.train, "input"),
                    (source.validation_inputs, "validation", inputs.validation, "validation_input")):
                option = f"--mixture source {source.name!r} {field_name}"
                files += [replace(f, text_key=source.text_key)
                          for f in listed(patterns, split, option, len(inputs.origins))]
                inputs.origins += [f"{option} {p}" for p in patterns]
                inputs.source_of_input += [index] * len(patterns)
    # Keyed by their paths relative to the common root of them all: the same files, however named,
    # give the same places (and so the same dataset).
    named = name_places(inputs.train + inputs.validation)
    inputs.train, inputs.validation = named[:len(inputs.train)], named[len(inputs.train):]
    for listing in listings:
        if listing.skipped:  # a warning: shown with --quiet too
            logging.getLogger("flat_tokens").warning(listing.skipped_message())
        if listing.own:  # expected, when an output lies in its own input directory: said, not warned
            logging.getLogger("flat_tokens").info(listing.own_message())
        inputs.skipped += [path for _, paths in listing.skipped for path in paths]
    return inputs


def _train_text_bytes(inputs: _Inputs, fraction: float, by_file: dict[str, int]) -> float:
    """The train split's text, estimated: with a mixture, T in bytes (see transforms.read.mixture)."""
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
    if o.dedup == "none":
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
                                  o.tokenizer_check_fraction, o.split_special_tokens)
    record, names = _recorded_sources(o, inputs)
    limits = LengthLimits(o.min_tokens, o.max_tokens, o.long_documents)
    target = StoreTarget(
        url=o.output, zarr_format=o.zarr_format, tokens_chunk=o.tokens_chunk_size,
        seq_starts_chunk=o.seq_starts_chunk_size, chunks_per_shard=o.chunks_per_shard or None,
        codec=o.codec, run_id=run_id or uuid.uuid4().hex, storage_options=storage_options,
        record_sources=record is not None)
    provenance = {
        "tokenizer": tokenizer.provenance(),
        "seed": o.seed,
        "validation_fraction": fraction,
        # Absolute, as every path recorded: they mean the same from any working directory.
        "inputs": [absolute(p) for p in o.input] if o.input else [p for s in inputs.mixture.sources for p in s.inputs],
        "validation_inputs": [absolute(p) for p in o.validation_input or []] if o.input else
        [p for s in inputs.mixture.sources for p in s.validation_inputs],
        "text_key": o.text_key,
        "input_files": len(train_files) + len(valid_files),
        "dedup": o.dedup,
        "document_lengths": limits.describe(),
        "package": {"name": "flat-tokens-beam", "version": __version__},
        "run_id": target.run_id,
        "rejected_output": rejected_output(o),
    }
    if o.dedup_report:
        provenance["dedup_report"] = absolute(o.dedup_report)
    against = earlier.resolve_datasets(o.dedup_against, o.output, storage_options) if o.dedup_against else []
    if against:
        provenance["dedup_against"] = against
    if names is not None:
        provenance["sources"] = names
    if o.dedup == "near":
        provenance["near_dedup"] = {"threshold": o.near_threshold, "shingle": o.near_shingle,
                                    "shingle_size": o.near_shingle_size, "hashes": o.near_hashes,
                                    "bands": o.near_bands}
    return JobPlan(
        files=train_files + valid_files, tokenizer=tokenizer, target=target, seed=o.seed,
        validation_fraction=fraction, num_shards=num_shards, text_key=o.text_key,
        overwrite=o.overwrite, read_range_bytes=o.read_range_mb << 20, batch_documents=o.batch_documents,
        max_rejected_fraction=o.max_rejected_fraction, rejected_url=rejected_output(o),
        input_bytes=all_bytes, provenance=provenance, row_groups=row_groups,
        dedup_shards=(o.num_shards or auto_shards(all_bytes)) if o.dedup != "none" else None,
        near=near_settings(o), dedup_report=absolute(o.dedup_report) if o.dedup_report else None,
        dedup_against=against, earlier_index=earlier.index_files(against, storage_options),
        earlier_near=earlier.near_files(against, near_settings(o), storage_options) if o.dedup == "near" else [],
        mixture=inputs.mixture, source_of_input=inputs.source_of_input, record_sources=record,
        skipped_files=inputs.skipped, length_limits=limits)


def near_settings(o: FlatTokensOptions) -> tuple[MinHashSettings, float] | None:
    if o.dedup != "near":
        return None
    return MinHashSettings(o.near_shingle, o.near_shingle_size, o.near_hashes, o.near_bands), o.near_threshold


def _recorded_sources(o: FlatTokensOptions, inputs: _Inputs) -> tuple[list[int] | None, list[str] | None]:
    """With --record_sources (always with a mixture): the recorded source of each input index
    and the sources' names (the mixture's sources, else the --input then --validation_input
    patterns); else (None, None)."""
    if inputs.mixture is not None:
        record, names = inputs.source_of_input, [s.name for s in inputs.mixture.sources]
    elif o.record_sources:
        names = list(o.input) + list(o.validation_input or [])
        record = list(range(len(names)))
    else:
        return None, None
    if len(names) > MAX_SOURCES:
        raise OptionError(f"--record_sources: {len(names)} sources, but source ids are uint16: at most "
                          f"{MAX_SOURCES} (use a glob or a directory for many files)")
    return record, names


def rejected_output(o: FlatTokensOptions) -> str:
    return absolute(o.rejected_output or o.output.rstrip("/") + ".rejected")
