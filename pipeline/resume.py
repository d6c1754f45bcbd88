"""Resuming, in the launcher: the keys of this job's work, what the staging area under
--output (transforms/staging.py) holds that is still good for it, and how much was reused.

Rerunning the command that made an unfinished output resumes it: no --overwrite needed. The
staging area names that command (`command.json`: a hash of its options), so a different
command still needs --overwrite, as for any existing output; staged work is reused by key
whichever command finds it, so what a changed option or input does not affect is reused then
too. A committed dataset is never resumed (its staging area went with the commit).
"""
import os
from dataclasses import dataclass, field

from pipeline import __version__
from pipeline.options import OPTIONS, FlatTokensOptions
from transforms import staging
from transforms.read.staged_reads import unit_start
from transforms.staging import StagingArea, Staged
from transforms.write.ownership import CONFLICT_PREFIX
from transforms.write.zarr_store import array_length

# Options that change nothing a run writes: they do not make another command.
_NOT_THE_COMMAND = {"overwrite", "restart", "no_staging", "summary_json", "progress_interval", "quiet", "verbose"}
COMPRESSION_RATIO_GUESS = 4  # as pipeline/plan.py: progress only


def command_key(o: FlatTokensOptions) -> str:
    """What makes a command this command: every option that a user gives to say what to
    make. Beam's options (the runner, its workers) are not in it: a job resumes anywhere."""
    return staging.key_of({opt.name: getattr(o, opt.name) for opt in OPTIONS if opt.name not in _NOT_THE_COMMAND})


def same_command(o: FlatTokensOptions, storage_options: dict | None = None) -> bool:
    """Whether the staging area at --output names this command (one small read)."""
    found = StagingArea(o.output, storage_options).read_json(staging.COMMAND) or {}
    return found.get("command") == command_key(o)


def file_version(f, storage_options: dict | None = None) -> str:
    """What tells a file's content from another's of the same name and size: InputFile.version
    when the listing recorded it, else its modification time (local) or generation (GCS)."""
    if getattr(f, "version", None):
        return f.version
    if staging.is_local(f.url):
        return f"mtime {os.stat(f.url.removeprefix('file://')).st_mtime_ns}"
    from fsspec.core import url_to_fs
    fs, path = url_to_fs(f.url, **(storage_options or {}))
    info = fs.info(path)
    for name in ("generation", "mtime", "LastModified", "last_modified", "ETag", "etag"):
        if info.get(name):
            return f"{name} {info[name]}"
    return ""


def _unit_where(unit) -> dict:
    if hasattr(unit, "first_row"):
        return {"row_group": unit.index, "first_row": unit.first_row, "rows": unit.num_rows, "column": unit.column}
    return {"start": unit.start, "stop": unit.stop}


def _unit_text_bytes(unit) -> int:
    if hasattr(unit, "first_row"):
        return unit.text_bytes
    f = unit.file
    end = unit.stop if unit.stop is not None else f.size
    return (end - unit.start) * (COMPRESSION_RATIO_GUESS if f.compression else 1)


@dataclass
class Resume:
    """What this run reuses. Units are read or replayed; shards are written or replayed."""

    area: StagingArea
    target: object = None  # the output's StoreTarget (its write blocks count chunks)
    units: list = field(default_factory=list)  # (unit key, account name, text bytes) to replay
    unit_total: int = 0
    shards: list = field(default_factory=list)  # record names to replay
    finished: frozenset = frozenset()  # (split, shard) of those records
    chunks: frozenset = frozenset()  # shared chunks recorded as written: (split, array, index)
    keep_arrays: bool = False
    reused_chunks: int = 0

    def unread(self, units: list) -> list:
        """The units (ReadRanges or RowGroups) that must be read: those not replayed."""
        replayed = {u for u, _, _ in self.units}
        return [u for u in units if self.area.unit_of(u.file.key, unit_start(u)) not in replayed]

    def report(self, stats: dict) -> dict:
        """How much was reused, for the summary."""
        total = 0
        for split in ("train", "validation"):
            for name in self.target.arrays():
                length = array_length(name, stats[split]["tokens"], stats[split]["sequences"])
                total += -(-length // self.target.write_block(name))
        return {"input_units": len(self.units), "input_units_total": self.unit_total,
                "chunks": self.reused_chunks, "chunks_total": total}


def unit_keys(plan, storage_options: dict | None = None) -> tuple[dict, dict]:
    """(file key -> (sorted unit starts, unit keys)), and (unit key -> text bytes), for every
    unit of the job."""
    # The tokenizer as the dataset's provenance records it (content, vocabulary, backend and its
    # version, checked fraction, special tokens), but not where it was read from.
    tokenizer = {k: v for k, v in plan.tokenizer.provenance().items() if k != "spec"}
    common = {"format": staging.FORMAT, "package": __version__, "batch_documents": plan.batch_documents,
              "digests": plan.dedup_shards is not None, "tokenizer": tokenizer}
    if plan.near:  # only then: the keys of other runs' units stay as they were
        common["signatures"] = plan.near[0].signature_key()
    versions = {}
    by_file, sizes = {}, {}
    for unit in list(plan.read_ranges()) + list(plan.row_groups):
        f = unit.file
        if f.key not in versions:
            versions[f.key] = file_version(f, storage_options)
        url = os.path.abspath(f.url.removeprefix("file://")) if staging.is_local(f.url) else f.url
        key = staging.key_of({**common, "file": {
            "key": f.key, "url": url, "size": f.size, "version": versions[f.key], "split": f.split,
            "format": f.format, "compression": f.compression, "text_key": f.text_key or plan.text_key},
            "unit": _unit_where(unit)})
        by_file.setdefault(f.key, []).append((unit_start(unit), key))
        sizes[key] = _unit_text_bytes(unit)
    return {k: ([s for s, _ in sorted(v)], [u for _, u in sorted(v)]) for k, v in by_file.items()}, sizes


def job_key(plan, units: dict) -> str:
    """Every unit key, with every option that changes the arrays: a shard's record is good
    only for the same job."""
    near = {"near": repr(plan.near)} if plan.near else {}
    return staging.key_of({
        **near, "format": staging.FORMAT, "package": __version__,
        "units": sorted(k for _, keys in units.values() for k in keys),
        "seed": plan.seed, "validation_fraction": plan.validation_fraction, "num_shards": plan.num_shards,
        "dedup_shards": plan.dedup_shards, "mixture": repr(plan.mixture), "source_of_input": plan.source_of_input,
        "record_sources": plan.record_sources, "storage": plan.target.describe(),
        "arrays": list(plan.target.arrays())})


def prepare(plan, o: FlatTokensOptions, found, storage_options: dict | None = None) -> Resume | None:
    """Keys this job's work, looks at the staging area once and decides what to reuse; then
    names this command there. `found`: the launcher's OutputState of --output. With
    --restart or --no_staging, the staging area is thrown away first (the output is this
    tool's: checked); with --no_staging nothing is kept (None)."""
    if o.no_staging:
        if found.kind == "dataset":
            StagingArea(o.output, storage_options).remove()
        return None
    units, sizes = unit_keys(plan, storage_options)
    area = StagingArea(o.output, storage_options, job_key(plan, units), units)
    staged = Staged()
    if found.kind == "dataset":
        if o.restart:
            area.remove()
        else:
            staged = area.listing()
    resume = Resume(area, plan.target, unit_total=len(sizes))
    resume.units = sorted((key, name, sizes[key]) for key, name in staged.units.items() if key in sizes)
    conflicts = any(n.startswith(CONFLICT_PREFIX) for n in found.names)
    if (found.kind == "dataset" and not found.committed and not conflicts
            and staged.arrays_key == area.job_key):
        resume.keep_arrays = True
        records = staged.shards.get(area.job_key, {})
        resume.shards = sorted(name for _, name in records.values())
        resume.finished = frozenset(records)
        resume.chunks = frozenset(staged.chunks.get(area.job_key, set()))
        resume.reused_chunks = sum(n for n, _ in records.values()) + len(resume.chunks)
    area.put_json(staging.COMMAND, {"command": command_key(o)})
    return resume


def describe(resume: Resume | None) -> str | None:
    """The launcher's line when it found staged work to reuse."""
    if resume is None or not resume.units and not resume.shards and not resume.keep_arrays:
        return None
    return (f"flat-tokens: resuming: {len(resume.units):,} of {resume.unit_total:,} input units staged, "
            f"{len(resume.shards):,} shards and {resume.reused_chunks:,} chunks written")
