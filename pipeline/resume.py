"""Resuming, in the launcher: the keys of this job's work, what the staging area under
--output (transforms/staging.py) holds that is still good for it, and how much was reused.

Rerunning the command that made an unfinished output resumes it: no --overwrite needed. The
staging area names that command (`command.json`: a hash of its options, the options
themselves, the tokenizer's sha256 and the input files as listed), so a different command
still needs --overwrite, as for any existing output, and is told which options differ;
staged work is reused by key whichever command finds it, so what a changed option or input
does not affect is reused then too, and the launcher says what changed and what is redone.
A committed dataset is never resumed (its staging area went with the commit): its
provenance names the command and input that built it, so the same command finds it
already built (`built_by`, `input_changes`).

Nothing staged is trusted on its name alone (issue 27): before it chooses what to reuse, the
launcher checks every staged file against the checksum written with it, and every chunk a
shard record or chunk mark vouches for against the size and CRC-32C that landed (`_check_units`,
`_check_written`); and it reads again the input bytes each staged unit was read from
(`input_verdicts`: a file edited in place may keep its size and modification time, and so its
unit's key). What is damaged is redone: a unit is read and tokenized again, a shard written
again (its damaged chunks and its record deleted first, fenced, by CreateOutput:
transforms/write/create_output.py; writes are create-only), a shared chunk merged again. A unit
whose input changed is read again too, and then every shard is written again (each gathers
documents from every unit), as when a damaged unit's account no longer says what it read.
The summary counts them (`reused.damaged`, `reused.input_units_changed`).
"""
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipeline import __version__
from pipeline.options import OPTIONS, FlatTokensOptions
from transforms import staging
from transforms.read.inputs import UNIT_DIGESTS, InputChanged, digest_of
from transforms.read.staged_reads import unit_start
from transforms.staging import StagingArea, Staged
from transforms.tokenize import copy_defects
from transforms.write import zarr_store
from flat_tokens.format.checksums import Damaged, Sum, damaged_objects
from flat_tokens.format.object_trees import gcs_entries, is_gcs
from transforms.write.ownership import CONFLICT_PREFIX
from transforms.write.zarr_store import array_length, filesystem

CHECK_THREADS = 16  # staged files and chunks checked at once (object stores: latency)

# Options that change nothing a run writes: they do not make another command. Nor does --output:
# a command is compared with what is at its output, and a dataset copied elsewhere is what the
# same command would build there.
_NOT_THE_COMMAND = {"output", "overwrite", "restart", "no_staging", "summary_json", "report", "progress_interval",
                    "quiet", "verbose", "storage_patience", "storage_request_timeout"}
COMPRESSION_RATIO_GUESS = 4  # as pipeline/plan.py: progress only


def given_options(o: FlatTokensOptions) -> dict:
    """Every option that a user gives to say what to make, by name. Beam's options (the
    runner, its workers) are not among them: a job resumes anywhere."""
    return {opt.name: getattr(o, opt.name) for opt in OPTIONS if opt.name not in _NOT_THE_COMMAND}


def command_key(o: FlatTokensOptions) -> str:
    """What makes a command this command: a hash of given_options."""
    return staging.key_of(given_options(o))


def earlier_command(o: FlatTokensOptions, storage_options: dict | None = None) -> dict | None:
    """The record of the command that made the unfinished output at --output (`command.json`
    in its staging area: one small read), or None."""
    return StagingArea(o.output, storage_options).read_json(staging.COMMAND)


def is_command(record: dict | None, o: FlatTokensOptions) -> bool:
    return bool(record) and record.get("command") == command_key(o)


def _shown(value) -> str:
    if value is None or value is False:
        return "(not given)" if value is None else "off"
    if value is True:
        return "on"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def option_changes(record: dict | None, o: FlatTokensOptions) -> list[str]:
    """'--seed 0 -> 7' for each option that differs from the recorded command's (options a
    record of an older version does not hold are not compared)."""
    recorded = (record or {}).get("options") or {}
    return [f"--{name} {_shown(recorded[name])} -> {_shown(value)}"
            for name, value in given_options(o).items() if name in recorded and recorded[name] != value]


def _file_record(plan) -> dict:
    """Each input file as listed: absolute URL -> [size, version]."""
    return {(os.path.abspath(f.url.removeprefix("file://")) if staging.is_local(f.url) else f.url):
            [f.size, f.version or ""] for f in plan.files}


def command_record(o: FlatTokensOptions, plan) -> dict:
    """What the staging area says about the command that made it: what a rerun compares."""
    return {"command": command_key(o), "options": given_options(o), "tokenizer": plan.tokenizer.sha256,
            "mixture": repr(plan.mixture), "files": _file_record(plan)}


def built_from(o: FlatTokensOptions, plan) -> dict:
    """The provenance's `command` attribute: this command, and a digest of what it read (the
    input files as listed, the tokenizer's content, the parsed mixture). A rerun of the same
    command over the same input finds the dataset already built."""
    return {"key": command_key(o), "options": given_options(o), "inputs": staging.key_of(
        {"files": _file_record(plan), "tokenizer": plan.tokenizer.sha256, "mixture": repr(plan.mixture)})}


def committed_here(o: FlatTokensOptions, storage_options: dict | None = None) -> dict | None:
    """The root attributes of the committed dataset at --output, or None (nothing committed
    there, or not a dataset at all: the usual checks say what)."""
    try:
        attrs = zarr_store.read_root_attributes(o.output, storage_options)
    except Exception:
        return None
    return attrs if attrs.get("complete") is True else None


def built_by(attrs: dict | None, o: FlatTokensOptions) -> bool:
    """Whether a committed dataset's provenance names this very command (`command` key)."""
    built = (attrs or {}).get("command")
    return isinstance(built, dict) and built.get("key") == command_key(o)


def input_changes(attrs: dict, o: FlatTokensOptions, plan) -> str | None:
    """None when the dataset `attrs` describe was built from the input this command reads
    now; else what differs, in words."""
    if attrs["command"].get("inputs") == built_from(o, plan)["inputs"]:
        return None
    then = (attrs.get("tokenizer") or {}).get("sha256")
    if then and then != plan.tokenizer.sha256:
        return f"the tokenizer's content differs (sha256 {then[:12]}... then, {plan.tokenizer.sha256[:12]}... now)"
    if attrs.get("input_files") != len(plan.files):
        return f"it was built from {attrs.get('input_files')} input files, and {len(plan.files)} are listed now"
    return "an input file (or the mixture file) changed since: its size or modification time differs"


def _what_changed(record: dict | None, o: FlatTokensOptions, plan) -> list[str]:
    """What differs between the command that staged work here and this one, in words."""
    if not record:
        return []
    changes = option_changes(record, o)
    then = record.get("tokenizer")
    if then and then != plan.tokenizer.sha256:
        changes.append(f"the tokenizer's content changed (sha256 {then[:12]}... -> {plan.tokenizer.sha256[:12]}...)")
    files, now = record.get("files"), _file_record(plan)
    if isinstance(files, dict):
        changed = [url for url, listed in now.items() if url in files and files[url] != listed]
        added, gone = [url for url in now if url not in files], [url for url in files if url not in now]
        for what, urls in (("changed (size or modification time)", changed), ("new", added), ("gone", gone)):
            if urls:
                changes.append(f"input {'file' if len(urls) == 1 else 'files'} {what}: {_few(urls)}")
    if record.get("mixture") not in (None, repr(plan.mixture)):
        changes.append("the mixture file's sources changed")
    return changes


def _few(names: list[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


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


DAMAGE_KINDS = ("staged_units", "shard_records", "chunk_marks", "chunks")


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
    changes: list = field(default_factory=list)  # what differs from the command that staged work here
    stale_units: int = 0  # staged units whose keys this job's no longer match: read and tokenized again
    stale_chunks: int = 0  # chunks written by another job, or by this one from input that changed: written again
    changed_units: int = 0  # staged units whose input bytes changed since (their key did not): read again
    # Damaged since they were written, so redone, not reused: counts by kind ("staged units",
    # "shard records", "chunk marks", "chunks"), and a line naming each. `rewrite`: the objects
    # (paths under the output) CreateOutput deletes, fenced, before they are written again
    # (writes are create-only): damaged chunk objects, and the shard records and chunk marks
    # not trusted (damaged, or vouching for a damaged chunk).
    damaged: dict = field(default_factory=dict)
    damage: list = field(default_factory=list)
    rewrite: tuple = ()
    lost_arrays: list = field(default_factory=list)  # arrays the staging area vouches for that the store lost

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
                "input_units_changed": self.changed_units, "chunks": self.reused_chunks, "chunks_total": total,
                "damaged": {kind: self.damaged.get(kind, 0) for kind in DAMAGE_KINDS}}


def unit_keys(plan, storage_options: dict | None = None, by_key: dict | None = None) -> tuple[dict, dict]:
    """(file key -> (sorted unit starts, unit keys)), and (unit key -> text bytes), for every
    unit of the job; `by_key`, when given, gets unit key -> unit (ReadRange or RowGroup)."""
    # The tokenizer as the dataset's provenance records it (content, vocabulary, backend and its
    # version, checked fraction, special tokens), but not where it was read from.
    tokenizer = {k: v for k, v in plan.tokenizer.provenance().items() if k != "spec"}
    common = {"format": staging.FORMAT, "package": __version__, "batch_documents": plan.batch_documents,
              "digests": plan.dedup_shards is not None, "tokenizer": tokenizer}
    if plan.near:  # only then: the keys of other runs' units stay as they were
        common["signatures"] = plan.near[0].signature_key()
        common["copy_defects"] = copy_defects.DEFINITION  # staged with the signatures
        # Locally staged beside the batch (staging.SIGNATURES), not in it: a version that looks
        # for them in the `.batch` does not take such a unit for its own.
        common["signatures_beside"] = True
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
        if by_key is not None:
            by_key[key] = unit
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
        "lengths": plan.length_limits.describe(),
        "arrays": list(plan.target.arrays())})


def prepare(plan, o: FlatTokensOptions, found, storage_options: dict | None = None) -> Resume | None:
    """Keys this job's work, looks at the staging area once and decides what to reuse; then
    names this command there. `found`: the launcher's OutputState of --output. With
    --restart or --no_staging, the staging area is thrown away first (the output is this
    tool's: checked); with --no_staging nothing is kept (None) but the command's record, so
    that rerunning the same command starts over without --overwrite."""
    area = StagingArea(o.output, storage_options)
    if o.no_staging:
        if found.kind == "dataset":
            area.remove()
        area.put_json(staging.COMMAND, command_record(o, plan))
        return None
    by_key = {}
    units, sizes = unit_keys(plan, storage_options, by_key)
    area = StagingArea(o.output, storage_options, job_key(plan, units), units)
    staged, record = Staged(), None
    if found.kind == "dataset":
        if o.restart:
            area.remove()
        else:
            staged, record = area.listing(), area.read_json(staging.COMMAND)
    resume = Resume(area, plan.target, unit_total=len(sizes))
    candidates = {key: name for key, name in staged.units.items() if key in sizes}
    whole = _whole(resume, "staged_units", _check_units(area, candidates, staged.entries))
    # Issue 27.4: the input bytes each staged unit was read from are read again, a damaged
    # unit's too where its account still says which (redone either way; but the shards are
    # kept only if every unit's input is the one they were written from).
    verdicts = input_verdicts(area, sorted(candidates.items()), by_key, storage_options)
    changed = sorted(key for key, verdict in verdicts.items()
                     if verdict == CHANGED or verdict == UNKNOWN and key in whole)
    unknown = sorted(key for key, verdict in verdicts.items() if verdict == UNKNOWN and key not in whole)
    for key in sorted(set(changed) | set(candidates) - set(whole)):  # read and staged again by this run
        area.forget_unit(key)
    resume.units = sorted((key, name, sizes[key]) for key, name in whole.items() if verdicts[key] == UNCHANGED)
    resume.changed_units = len(changed)
    resume.stale_units = sum(1 for key in staged.units if key not in sizes)
    unchecked = []  # why the chunks written from this job's input cannot be kept, in words
    if changed:
        unchecked.append(f"the input bytes of {_units(len(changed))} changed since they were read (same size "
                         f"and modification time: edited in place)")
    if unknown:
        unchecked.append(f"the account of {_units(len(unknown))} is damaged: it no longer says which input bytes "
                         f"{'it was' if len(unknown) == 1 else 'they were'} read from")
    if len(verdicts) < len(sizes):
        n = len(sizes) - len(verdicts)
        unchecked.append(f"{n:,} input unit{'s' if n != 1 else ''} of this job {'was' if n == 1 else 'were'} "
                         f"never staged")
    conflicts = any(n.startswith(CONFLICT_PREFIX) for n in found.names)
    # Every shard gathers documents from every unit: its record is good only when every unit
    # of the job was staged and its input bytes are the ones staged.
    if (found.kind == "dataset" and not found.committed and not conflicts
            and staged.arrays_key == area.job_key and not unchecked):
        # The store may have lost the arrays since (objects deleted under a run): their records
        # then vouch for nothing, and the arrays are created and written again.
        resume.lost_arrays = missing_arrays(plan.target)
    if (found.kind == "dataset" and not found.committed and not conflicts
            and staged.arrays_key == area.job_key and not unchecked and not resume.lost_arrays):
        resume.keep_arrays = True
        records, marks = _check_written(resume, staged.shards.get(area.job_key, {}),
                                        staged.chunks.get(area.job_key, set()))
        resume.shards = sorted(name for _, name in records.values())
        resume.finished = frozenset(records)
        resume.chunks = frozenset(marks)
        resume.reused_chunks = sum(n for n, _ in records.values()) + len(resume.chunks)
    elif staged.arrays_key and not resume.lost_arrays:  # lost: said so (describe), not "changed"
        resume.stale_chunks = (sum(n for n, _ in staged.shards.get(staged.arrays_key, {}).values())
                               + len(staged.chunks.get(staged.arrays_key, ())))
    if resume.stale_units or resume.stale_chunks:
        resume.changes = _what_changed(record, o, plan) + (unchecked if staged.arrays_key == area.job_key else [])
    area.put_json(staging.COMMAND, command_record(o, plan))
    return resume


def missing_arrays(target) -> list[str]:
    """The output's arrays ("train/encoded_tokens", ...) whose metadata is not in the store."""
    fs, _ = filesystem(target.url, target.storage_options)
    paths = {f"{split}/{name}": zarr_store.metadata_path(target, split, name)
             for split in zarr_store.SPLITS for name in target.arrays()}
    fs.invalidate_cache()
    return [key for key, path in paths.items() if not fs.exists(path)]


def _units(n: int) -> str:
    return f"{n:,} staged input unit{'s' if n != 1 else ''}"


def _whole(resume: Resume, kind: str, checked: dict) -> dict:
    """The checked items that are whole ({key: value}); counts and names the damaged ones
    (checked: {key: (value, None) or (None, why)})."""
    whole = {}
    for key, (value, why) in checked.items():
        if why is None:
            whole[key] = value
        else:
            resume.damaged[kind] = resume.damaged.get(kind, 0) + 1
            resume.damage.append(why)
    return whole


def _check_units(area: StagingArea, units: dict, entries: dict) -> dict:
    """{unit: (account name, None)} for each whole unit, {unit: (None, why)} for a damaged one:
    its account and every batch it names (the `.batch`, and the ids against the Sum sealed
    there) match the checksums written with them. The ids are read once (locally: the
    shuffle maps them afterwards from the page cache); GCS lists their CRC-32C, so nothing is
    read there but the small accounts and `.batch` objects."""
    def check(item):
        unit, name = item
        try:
            account = area.read_unit(unit, name)
            for place in account["places"]:
                area.check_batch(unit, place, entries)
        except Damaged as e:
            return unit, (None, str(e))
        except FileNotFoundError as e:  # went since the listing
            return unit, (None, f"staged file {e.filename or e}: gone")
        return unit, (name, None)

    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        return dict(pool.map(check, sorted(units.items())))



UNCHANGED, CHANGED, UNKNOWN = "unchanged", "changed", "unknown"


def input_verdicts(area: StagingArea, staged: list, by_key: dict, storage_options: dict | None = None,
                   threads: int = 8) -> dict:
    """{unit key: UNCHANGED, CHANGED or UNKNOWN} for staged units [(key, account name, ...)].
    A unit's key names its file by size and modification time (or generation): a file edited
    in place with both restored keeps its key, so the bytes each unit was read from (their
    spans and digest, in its account: inputs.StoredBytes) are read again here. UNKNOWN: its
    account cannot say (damaged: flat_tokens/format/checksums.py, or staged without them). Reading is
    cheap next to tokenizing (benchmarks/bench_unit_check.py measures it)."""
    def verdict(item) -> str:
        key, name = item[0], item[1]
        try:
            stored = area.read_unit(key, name).get("stored")
        except (OSError, ValueError, KeyError):  # Damaged (a ValueError), or gone since the listing
            return UNKNOWN
        algorithm = next((n for n in UNIT_DIGESTS if n in (stored or {})), None)  # sha256 before issue 28
        if algorithm is None:
            return UNKNOWN
        try:
            same = digest_of(by_key[key].file, stored["spans"], storage_options, algorithm) == stored[algorithm]
        except (InputChanged, OSError, RuntimeError, ValueError, KeyError, TypeError):
            return CHANGED
        return UNCHANGED if same else CHANGED
    if not staged:
        return {}
    with ThreadPoolExecutor(min(threads, len(staged))) as pool:  # reads: I/O, and hashing frees the GIL
        return dict(zip((item[0] for item in staged), pool.map(verdict, staged)))


def unchanged_units(area: StagingArea, staged: list, by_key: dict, storage_options: dict | None = None,
                    threads: int = 8) -> tuple[list, list]:
    """(the staged units [(key, account name, ...)] whose input bytes are still those they
    were read from, the keys of the others): input_verdicts, UNKNOWN counted as changed."""
    verdicts = input_verdicts(area, staged, by_key, storage_options, threads)
    return ([item for item in staged if verdicts[item[0]] == UNCHANGED],
            [item[0] for item in staged if verdicts[item[0]] != UNCHANGED])


def _check_written(resume: Resume, records: dict, marks: set) -> tuple[dict, set]:
    """The shard records and chunk marks of this job's arrays that can be trusted: each whole
    (its checksum), and every chunk object it vouches for stored with the size and CRC-32C
    that landed. The damaged chunk objects go to `resume.rewrite`, with the records and marks
    not trusted: their shard or chunk writes them again, create-only, so they go first."""
    area, target = resume.area, resume.target
    fs, base = filesystem(target.url, target.storage_options)
    base = base.rstrip("/")

    def read_record(item):
        shard, (chunks, name) = item
        try:
            header, _ = area.read_shard(area.job_key, name)
            objects = [(f"{base}/{header['split']}/{key}", Sum(size, crc)) for key, size, crc in header["objects"]]
            return shard, objects, None
        except (Damaged, KeyError, TypeError, ValueError) as e:
            return shard, None, str(e) if isinstance(e, Damaged) else f"shard record {name}: damaged: {e}"
        except FileNotFoundError as e:
            return shard, None, f"staged file {e.filename or e}: gone"

    def read_mark(mark):
        split, array, index = mark
        try:
            return mark, [(f"{base}/{split}/{key}", summed) for key, summed in
                          area.read_chunk_mark(area.job_key, split, array, index)], None
        except Damaged as e:
            return mark, None, str(e)
        except FileNotFoundError as e:
            return mark, None, f"staged file {e.filename or e}: gone"

    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        read_records = list(pool.map(read_record, sorted(records.items())))
        read_marks = list(pool.map(read_mark, sorted(marks)))
    expected = {path: summed for _, objects, _ in read_records + read_marks if objects for path, summed in objects}
    listed = _listed_chunks(fs, base, expected) if is_gcs(fs) else {}
    broken = damaged_objects(fs, expected, listed, CHECK_THREADS)
    resume.rewrite = tuple(sorted(posixpath.relpath(p, base) for p in broken))
    for path, why in sorted(broken.items()):
        resume.damaged["chunks"] = resume.damaged.get("chunks", 0) + 1
        resume.damage.append(f"chunk {target.url.rstrip('/')}/{posixpath.relpath(path, base)}: {why}")
    good_records, good_marks, untrusted = {}, set(), []
    for kind, items in (("shard_records", read_records), ("chunk_marks", read_marks)):
        for key, objects, why in items:
            if objects is None:
                resume.damaged[kind] = resume.damaged.get(kind, 0) + 1
                resume.damage.append(why)
            elif not any(path in broken for path, _ in objects):
                if kind == "shard_records":
                    good_records[key] = records[key]
                else:
                    good_marks.add(key)
                continue
            untrusted.append(f"{staging.FOLDER}/{staging.SHARDS}/{area.job_key}/{records[key][1]}"
                             if kind == "shard_records" else
                             f"{staging.FOLDER}/{staging.CHUNKS}/{area.job_key}/{'.'.join(map(str, key))}")
    resume.rewrite += tuple(sorted(untrusted))
    return good_records, good_marks


def _listed_chunks(fs, base: str, expected: dict) -> dict:
    """{path: listing entry (size, CRC-32C)} of the expected chunk objects, one GCS listing of
    each array, page by page: no chunk is read."""
    listed = {}
    arrays = {posixpath.join(*posixpath.relpath(p, base).split("/")[:2]) for p in expected}
    for array in sorted(arrays):
        listed.update((path, entry) for path, entry in gcs_entries(fs, f"{base}/{array}") if path in expected)
    return listed



def describe(resume: Resume | None) -> list[tuple[bool, str]]:
    """The launcher's lines about the work it found staged: (notable, line) pairs. Notable
    (a warning): staged work that no longer matches, with what changed since it was staged."""
    if resume is None:
        return []
    lines = []
    if resume.units or resume.shards or resume.keep_arrays or resume.damage or resume.changed_units:
        lines.append((False, f"flat-tokens: resuming: {len(resume.units):,} of {resume.unit_total:,} input units "
                             f"staged, {len(resume.shards):,} shards and {resume.reused_chunks:,} chunks written"))
    if resume.changed_units:
        n = resume.changed_units
        lines.append((True, f"flat-tokens: {resume.area.output}: {_units(n)} {'is' if n == 1 else 'are'} read and "
                            f"tokenized again: the input bytes {'it was' if n == 1 else 'they were'} read from "
                            f"changed since (same size and modification time: edited in place)"))
    if resume.lost_arrays:
        lines.append((True, f"flat-tokens: {resume.area.output}: the staging area says this job's arrays were "
                            f"created, but the store no longer holds {', '.join(resume.lost_arrays)} (objects "
                            f"disappeared from the store): the arrays are created and their chunks written again"))
    if resume.stale_units or resume.stale_chunks:
        redone = [f"{n:,} staged input unit{'s' if n > 1 else ''} no longer match{'es' if n == 1 else ''} this "
                  f"job and {'is' if n == 1 else 'are'} read and tokenized again" for n in [resume.stale_units] if n]
        redone += [f"the {n:,} chunks written before are written again" for n in [resume.stale_chunks] if n]
        why = "; ".join(resume.changes) or "the package, the staging format or another option changed"
        lines.append((True, f"flat-tokens: {resume.area.output}: {' and '.join(redone)}: since that work was "
                            f"staged, {why}"))
    return lines


DAMAGE_SHOWN = 5


def damage_report(resume: Resume | None) -> str | None:
    """The launcher's warning when staged work or written chunks were found damaged: what,
    and that it is redone (the first few, named)."""
    if resume is None or not resume.damage:
        return None
    lines = [f"flat-tokens: resuming: {describe_damage(resume.damaged)}; redoing them, not reusing them:"]
    lines += [f"  {why}" for why in resume.damage[:DAMAGE_SHOWN]]
    if len(resume.damage) > DAMAGE_SHOWN:
        lines.append(f"  and {len(resume.damage) - DAMAGE_SHOWN:,} more")
    return "\n".join(lines)


def describe_damage(damaged: dict) -> str:
    """'damaged since they were written: 1 staged unit, 2 chunks', from Resume.damaged."""
    names = {"staged_units": "staged unit", "shard_records": "shard record", "chunk_marks": "chunk mark",
             "chunks": "chunk"}
    parts = [f"{damaged[k]:,} {names[k]}{'s' if damaged[k] != 1 else ''}" for k in DAMAGE_KINDS if damaged.get(k)]
    return "damaged since they were written: " + ", ".join(parts)
