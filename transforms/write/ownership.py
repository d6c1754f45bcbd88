"""What at the output path belongs to this tool, which run owns it, and the rule that a run
deletes or writes only what it owns.

The marker ("claim") is a small object `OUTPUT/.flat-tokens-run.<generation>` holding the
run id. A run owns the output while its claim has the highest generation there. A run
takes the output by *creating* the claim one above the highest it saw when it was launched,
exclusively (O_EXCL locally, `ifGenerationMatch=0` on GCS): of two runs that saw the same
output, exactly one gets that generation, and the other fails without deleting anything.
The claim is kept by the commit, so a committed dataset says which run wrote it.

"Ours" is recognised from names and the claim, never from arbitrary zarr content: an output
is replaceable only when every top-level entry is one this tool writes (the claims, the
root group metadata, `train/`, `validation/`, and the exact names flat_tokens/format/own_names.py
lists: conflict records, leases, the staging area and their temporary names; a user's
`.flat-tokens-notes.txt` is not one, so it is neither deleted nor ours), a claim says the dataset entries are this
tool's, and every object inside `train/` and `validation/` is one the layout writes there:
group and array metadata, and the data objects the arrays' metadata implies
(flat_tokens/format/chunk_objects.py). A user's `train/NOTES.txt` makes the output foreign.
A committed dataset of an earlier version (no claim) is recognised by the provenance those
versions wrote: root attributes `format: flat-tokens`, `package.name: flat-tokens-beam` and
a `run_id` that both split groups repeat in `flat_tokens_run`.

Writers check the claim before and after each write, and hold a *lease* while the write is
in flight: an object `OUTPUT/.flat-tokens-writing.<run id>.<uuid>`, created before the check
before and deleted after the check after. A run that takes the output over waits, after
claiming it and before deleting anything, until the other runs' leases are gone: their
writes have landed, and any write they start later fails its check before. So the
newcomer's takeover never races the old run's last writes. A lease whose process is seen
dead (same machine: transforms/processes.py) is broken at once, any other after
LEASE_PATIENCE_S (or $FLAT_TOKENS_LEASE_PATIENCE_S). Deleting a lease is what decides.

Fencing. A write whose lease was broken (a stopped process, a Dataflow "zombie" worker)
may still land after the newcomer went on. It cannot change the newcomer's objects: every
write is create-only (transforms/create_only.py), so it fails where the newcomer wrote, and
can only create objects that are absent. When such a run confirms its write and finds that
it lost the output with its lease broken, it takes back exactly the objects that write
created (by identity: never one another writer has made its own since), unless the arrays
it wrote into are still the ones it opened (a resumed run of the same job kept them: its
bytes are that run's bytes). It then stops: "this run lost the output". Only when it cannot
take one back does it leave a conflict record `OUTPUT/.flat-tokens-conflict.<run id>`; a run
that finds other bytes where it writes while it owns the output leaves one too. No commit
publishes an output holding a conflict record, and the reader, `verify` and `export`
refuse one (`refusals`).
"""
import importlib.metadata
import json
import logging
import os
import posixpath
import re
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from transforms import create_only, processes
from flat_tokens.format.own_names import is_own_name
from flat_tokens.format.claims import (ARRAY_METADATA, ARRAYS, CLAIM_PREFIX, CONFLICT_PREFIX, DATASET_ENTRIES,  # noqa: F401
    DEDUP_INDEX, LEASE_PREFIX, OWN_PREFIX, PACKAGE_NAME, ROOT_METADATA, SPLIT_RUN_ATTRIBUTE, SPLITS, STAGING,
    claim_generation, claim_generations, conflicts, is_local, read_json, refusals, split_url, top_level_names)
from flat_tokens.format.chunk_objects import ChunkObjects, chunk_objects
from flat_tokens.format.manifest import MANIFEST
from flat_tokens.format.object_trees import remove_tree, walk_tree

# How long a run taking an output over waits for another run's write in flight, unless that
# run's process is seen dead: far longer than writing one shard's chunks (and sorting the
# next shard, which the writer does before it confirms them) or one batch of deletions.
# $FLAT_TOKENS_LEASE_PATIENCE_S sets another (an operator who knows the old job is gone, a test).
LEASE_PATIENCE_S = 600.0
LEASE_PATIENCE_VARIABLE = "FLAT_TOKENS_LEASE_PATIENCE_S"
DELETE_BATCH = 1000  # objects deleted per fenced step when a run removes what it replaces
LISTED_NAMES = 5


class OutputError(ValueError):
    """The output path cannot be used; the message names it and says what to do."""


class OutputTaken(OutputError):
    """Another run owns the output now: this run must not write or delete anything there.

    `landed_first`: raised after a write, whose lease the newcomer waited for: the write
    landed before the newcomer touched anything, so it harms nothing."""

    def __init__(self, message: str, landed_first: bool = False):
        super().__init__(message)
        self.landed_first = landed_first


class ObjectsVanished(OutputError):
    """This run's claim (and maybe more of its objects) disappeared from the store without
    another run's claim: the store lost them; no run took the output over."""


@dataclass(frozen=True)
class OutputState:
    """What a run found at the output path.

    kind: "absent", "empty", "file", "foreign" (holds something that is not this tool's),
    "dataset" (a committed or unfinished output of this tool)."""

    kind: str
    names: tuple = ()  # top-level entries, directories with a trailing "/"
    foreign: tuple = ()  # the entries that are not this tool's
    owner: tuple = (0, "")  # (generation, run id) of the highest claim; (0, legacy run id) or (0, "")
    committed: bool = False

    @property
    def replaceable(self) -> bool:
        return self.kind in ("absent", "empty", "dataset")


def location(url: str, storage_options: dict | None = None) -> tuple[str, str]:
    """A normalised (protocol, path) for comparing where two URLs point."""
    fs, path = split_url(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return ("file" if is_local(fs) else protocol), (path if is_local(fs) else posixpath.normpath(path))


def contains(outer: tuple[str, str], inner: tuple[str, str]) -> bool:
    return outer[0] == inner[0] and (inner[1] == outer[1] or inner[1].startswith(outer[1].rstrip("/") + "/"))


def refuse_root(url: str, storage_options: dict | None = None) -> None:
    """A bucket root or a filesystem root is never an output, with or without --overwrite."""
    protocol, path = location(url, storage_options)
    if path in ("", "/", ".") or (protocol != "file" and "/" not in path.strip("/")):
        what = "the root of the filesystem" if protocol == "file" else f"the root of bucket {path.strip('/')}"
        raise OutputError(f"--output {url}: is {what}; write the dataset to a path of its own, "
                          f"e.g. {url.rstrip('/')}/datasets/NAME.zarr")


def refuse_overlaps(output_url: str, inputs: list[str], rejected_url: str, storage_options: dict | None = None) -> None:
    """--output may hold neither an input file nor the rejected-lines directory: replacing the
    output would delete them."""
    out = location(output_url, storage_options)
    for url in inputs:
        if contains(out, location(url, storage_options)):
            raise OutputError(f"--output {output_url}: holds the input {url}; the output must be a path of its "
                              f"own, outside every --input, --validation_input and --tokenizer")
    if contains(out, location(rejected_url, storage_options)):
        raise OutputError(f"--output {output_url}: holds the --rejected_output directory {rejected_url}; "
                          f"put the rejected-lines report outside the output")


def _legacy_run_id(fs, path: str) -> str:
    """The run id of a committed dataset written by a version without claims, or ""."""
    root = read_json(fs, f"{path}/.zattrs") or (read_json(fs, f"{path}/zarr.json") or {}).get("attributes") or {}
    run_id = root.get("run_id")
    if not (root.get("format") == "flat-tokens" and isinstance(root.get("package"), dict)
            and root["package"].get("name") == PACKAGE_NAME and isinstance(run_id, str) and run_id):
        return ""
    for split in SPLITS:
        attrs = read_json(fs, f"{path}/{split}/.zattrs") or \
            (read_json(fs, f"{path}/{split}/zarr.json") or {}).get("attributes") or {}
        if attrs.get(SPLIT_RUN_ATTRIBUTE) != run_id:
            return ""
    return run_id


def _tree(fs, base: str):
    """Pages of (path relative to `base`, is a directory) of everything under `base`, listed
    fresh and page by page (a split holds one object per chunk: ~890,000 at 1 TB of text)."""
    fs.invalidate_cache(base)
    return walk_tree(fs, base)


def _array_layouts(fs, split_path: str) -> dict[str, ChunkObjects | None]:
    """Each array's data objects, from its metadata (None where it cannot be read)."""
    layouts = {}
    for array in ARRAYS:
        meta = read_json(fs, f"{split_path}/{array}/.zarray") or read_json(fs, f"{split_path}/{array}/zarr.json")
        layouts[array] = chunk_objects(meta) if meta else None
    return layouts


def _chunk_shaped(key: str) -> bool:
    """A data object's name in any key encoding this tool writes (`7`, `c/7`, `c.7`)."""
    digits = key[2:] if key[:2] in ("c/", "c.") else key
    return digits.isascii() and digits.isdigit()


# zarr's local store writes each object under a temporary name and renames it into place:
# Path.with_suffix(".<32 hex>.partial"), so `.zattrs` is written as `.zattrs.<hex>.partial`,
# `zarr.json` as `zarr.<hex>.partial` and chunk `c/7` as `c/7.<hex>.partial`. While a run
# writes (or after it was killed mid-write) these are ours too.
_ZARR_PARTIAL = re.compile(r"^(?P<stem>.+)\.[0-9a-f]{32}\.partial$")
_ROOT_METADATA_STEMS = (".zattrs", ".zgroup", "zarr", MANIFEST)


def zarr_partial_of(name: str) -> str | None:
    """The stem of one of zarr's temporary names (`.zattrs` of `.zattrs.<hex>.partial`), or None."""
    match = _ZARR_PARTIAL.match(name)
    return match.group("stem") if match else None


def written_by_layout(relative: str, is_dir: bool, layouts: dict[str, ChunkObjects | None]) -> bool:
    """Whether `relative` (a path inside a split's directory) is one the layout writes there:
    the group's metadata, the arrays' directories and metadata, and the data objects their
    metadata implies. When an array's metadata is gone (a deletion killed midway), any
    chunk-shaped name in it counts as its own."""
    head, _, rest = relative.partition("/")
    stem = None if is_dir else zarr_partial_of(posixpath.basename(relative))
    if stem is not None:  # zarr writing (or killed writing) the object it will be renamed to
        real = "zarr.json" if stem == "zarr" else stem
        return written_by_layout(posixpath.join(posixpath.dirname(relative), real), False, layouts)
    if not rest:
        return (head in ARRAYS) if is_dir else (head in ROOT_METADATA)
    if head not in ARRAYS:
        return False
    layout = layouts.get(head)
    if is_dir:
        return rest in layout.directories if layout else rest == "c"
    if rest in ARRAY_METADATA:
        return True
    return layout.index(rest) is not None if layout else _chunk_shaped(rest)


def foreign_in_split(fs, split_path: str) -> list[str]:
    """What inside one split's directory the layout did not write, relative to it
    (directories with a trailing "/", and nothing listed below a foreign directory)."""
    layouts = _array_layouts(fs, split_path)
    foreign, foreign_dirs = [], set()
    for entries in _tree(fs, split_path):
        for relative, is_dir in entries:
            parts = relative.split("/")
            if any("/".join(parts[:depth]) in foreign_dirs for depth in range(1, len(parts))):
                continue
            if not written_by_layout(relative, is_dir, layouts):
                foreign.append(relative + "/" if is_dir else relative)
                if is_dir:
                    foreign_dirs.add(relative)
    return sorted(foreign)


def inspect_output(url: str, storage_options: dict | None = None, own_run_id: str = "",
                   also_ours: tuple = ()) -> OutputState:
    """What is at the output path, and whether this tool may replace it. Entries that name
    `own_run_id` (this run's own temporary files) are left out. `also_ours`: top-level file
    names this run writes there itself (its --summary_json), ours beside a dataset of ours."""
    fs, path = split_url(url, storage_options)
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return OutputState("absent")
    if not fs.isdir(path):
        return OutputState("file", names=(posixpath.basename(path),))
    listed = [(n, d) for n, d in top_level_names(fs, path) if not (own_run_id and is_own_name(n) and own_run_id in n)]
    names = tuple(n + "/" if d else n for n, d in listed)
    if not listed:
        return OutputState("empty")
    claims = claim_generations(listed)
    owner = (0, "")
    if claims:
        claim = read_json(fs, f"{path}/{CLAIM_PREFIX}{claims[-1]}") or {}
        owner = (claims[-1], str(claim.get("run_id", "")))
    plain = {n for n, _ in listed}
    if not claims and plain & DATASET_ENTRIES:
        legacy = _legacy_run_id(fs, path)
        if legacy:
            owner = (0, legacy)
    dataset_is_ours = bool(claims) or bool(owner[1])
    foreign = [label for (n, d), label in zip(listed, names)
               if not (is_own_name(n) or (dataset_is_ours and (_dataset_entry(n, d)
                                                                          or not d and n in also_ours)))]
    if dataset_is_ours:  # the whole tree, not one level: a user's train/NOTES.txt is not ours
        foreign += [f"{split}/{f}" for split, is_dir in listed if is_dir and split in SPLITS
                    for f in foreign_in_split(fs, f"{path}/{split}")]
    foreign = tuple(foreign)
    committed = bool(plain & set(ROOT_METADATA))
    return OutputState("foreign" if foreign else "dataset", names, foreign, owner, committed)


def holds_no_work(state: OutputState) -> bool:
    """Whether an unfinished output of this tool holds nothing but claims and leases: no data, no
    staged work, no conflict record. Replacing it loses nothing, so the same command (whose
    record went with the rest: a store that lost objects) starts over without --overwrite."""
    return (state.kind == "dataset" and not state.committed and bool(state.names)
            and all(claim_generation(n) is not None or n.startswith(LEASE_PREFIX) for n in state.names))


def _dataset_entry(name: str, is_dir: bool) -> bool:
    """A top-level entry the layout writes: a split's directory, or a root metadata file
    (or zarr's temporary name for one, while it is written)."""
    if is_dir:
        return name in SPLITS or name == DEDUP_INDEX
    return name in ROOT_METADATA or name == MANIFEST or zarr_partial_of(name) in _ROOT_METADATA_STEMS


def listing(names, limit: int = LISTED_NAMES) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def refusal(url: str, state: OutputState) -> str:
    if state.kind == "file":
        return f"--output {url}: is a file, not a flat-tokens dataset; refusing to replace it. Choose another path"
    return (f"--output {url}: holds {listing(state.foreign)}: not a flat-tokens dataset written by this tool; "
            f"refusing to delete it. --overwrite replaces only an empty directory or this tool's own output; "
            f"choose another path")


def describe_owner(state: OutputState) -> str:
    what = "a committed flat-tokens dataset" if state.committed else "an unfinished output"
    return f"{what} of run {state.owner[1]}" if state.owner[1] else what


def refuse_for_run(url: str, overwrite: bool, storage_options: dict | None = None,
                   resumable: bool = False, also_ours: tuple = (), other_command: list | None = None) -> OutputState:
    """The launcher's check: the state found, or OutputError when this run may not use the path.
    `resumable`: this command made what is there, so an unfinished output is resumed, not
    replaced, and needs no --overwrite (a committed dataset always does). `also_ours`: see
    inspect_output. `other_command`: an unfinished output's staging area names another
    command, which differs from this one so (its options, in words; [] when it cannot tell)."""
    refuse_root(url, storage_options)
    state = inspect_output(url, storage_options, also_ours=also_ours)
    if not state.replaceable:
        raise OutputError(refusal(url, state))
    if state.kind == "dataset" and not overwrite and holds_no_work(state):
        _log().warning("flat-tokens: --output %s: starting over: it holds nothing of run %s but its claim (%s), no "
                       "data and no staged work (the store lost them?)", url, state.owner[1] or "?",
                       listing(state.names))
        return state
    if state.kind == "dataset" and not overwrite and (state.committed or not resumable):
        if not state.committed and other_command is not None:
            differs = f" ({'; '.join(other_command)})" if other_command else ""
            raise OutputError(f"--output {url}: exists and is not empty: it holds {describe_owner(state)}, made by "
                              f"another command{differs}; rerun that command to resume it, or pass --overwrite to "
                              f"replace it (the work staged there that this command still matches is reused), or "
                              f"choose another path")
        if not state.committed:
            raise OutputError(f"--output {url}: exists and is not empty: it holds {describe_owner(state)}, and "
                              f"nothing there says which command made it (a run of an earlier version); pass "
                              f"--overwrite to replace it, or choose another path")
        built = f", built by another command ({'; '.join(other_command)})" if other_command else ""
        raise OutputError(f"--output {url}: exists and is not empty; pass --overwrite to replace it, "
                          f"or choose another path ({describe_owner(state)} is there{built})")
    return state


# ---------------------------------------------------------------------------------------------
# Claims and fences


def current_owner(fs, path: str) -> tuple[int, str]:
    """(generation, run id) of the highest claim, or (0, "")."""
    for _ in range(3):  # a claim listed, then removed by a takeover before it is read: look again
        claims = claim_generations(top_level_names(fs, path))
        if not claims:
            return 0, ""
        claim = read_json(fs, f"{path}/{CLAIM_PREFIX}{claims[-1]}")
        if claim is not None:
            return claims[-1], str(claim.get("run_id", ""))
    return claims[-1], ""


def _version() -> str:
    try:
        return importlib.metadata.version(PACKAGE_NAME)
    except importlib.metadata.PackageNotFoundError:
        return ""


def claim(url: str, run_id: str, generation: int, storage_options: dict | None = None) -> None:
    """Creates claim `generation` for `run_id`, exclusively; OutputTaken when another run has it.
    A claim that already holds `run_id` is this run's own (a retried step): accepted."""
    fs, path = split_url(url, storage_options)
    body = json.dumps({"run_id": run_id, "generation": generation, "tool": PACKAGE_NAME, "version": _version(),
                       "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode()
    claim_path = f"{path}/{CLAIM_PREFIX}{generation}"
    if is_local(fs):
        fs.makedirs(path, exist_ok=True)
    try:
        fs.pipe_file(claim_path, body, mode="create")
    except FileExistsError:
        pass  # another run's, or this run's own from an earlier attempt of this step: read it
    fs.invalidate_cache(path)
    holder = (read_json(fs, claim_path) or {}).get("run_id")
    if holder is None and current_owner(fs, path)[0] == 0:
        raise objects_vanished(url, run_id, f"its claim {CLAIM_PREFIX}{generation}, just created, is gone, and no "
                                            f"other run claimed the output", "claiming the output")
    if holder != run_id:
        raise OutputTaken(f"--output {url}: run {holder} claimed it first (both runs found the same output); "
                          f"this run stops without touching it")


def check_owner(url: str, run_id: str, storage_options: dict | None = None, doing: str = "writing") -> None:
    """OutputTaken unless `run_id` holds the highest claim at the output."""
    fs, path = split_url(url, storage_options)
    generation, holder = current_owner(fs, path)
    if generation == 0 and run_id:
        # No claim at all, not even this run's: nobody took the output over, the store lost it.
        # (A target without a run id writes without claims: tools and benchmarks, as before.)
        raise objects_vanished(url, run_id, "its claim is gone and no other run claimed the output", doing)
    if holder != run_id:
        who = f"run {holder}" if holder else "another run"
        raise OutputTaken(f"--output {url}: {who} took it over (claim {generation}) while this run ({run_id}) was "
                          f"{doing}; this run lost the output and stops, leaving that run's data alone")


def objects_vanished(url: str, run_id: str, what: str, doing: str) -> ObjectsVanished:
    """The error of a run whose objects the store lost (`what`: which, in words) while it was
    `doing` something: no other run is involved, and the same command builds the output again."""
    return ObjectsVanished(f"--output {url}: objects of this run disappeared from the store ({what}) while this run "
                           f"({run_id or 'without a claim'}) was {doing}; the store lost data (an emulator or bucket "
                           f"emptied, a lifecycle rule, an rm?). Run the same command again: it resumes what the "
                           f"store still holds and says so, or builds the output from the start")


def record_conflict(url: str, run_id: str, message: str, storage_options: dict | None = None) -> None:
    fs, path = split_url(url, storage_options)
    fs.pipe_file(f"{path}/{CONFLICT_PREFIX}{run_id}", message.encode())


def _log():
    return logging.getLogger("flat_tokens")


def _remove_if_present(fs, path: str) -> bool:
    """Deletes one object; whether it was there. Of two deleters, exactly one gets True."""
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        return False
    return True


def is_lease_of(name: str, run_id: str) -> bool:
    return name.startswith(f"{LEASE_PREFIX}{run_id}.")


@dataclass
class Lease:
    """One write in flight: its lease object, and what it did to storage (create_only.Ledger)."""

    path: str
    ledger: create_only.Ledger


def begin_write(url: str, run_id: str, what: str, storage_options: dict | None = None) -> Lease:
    """The first half of `fenced`: takes a lease for one write, then checks the claim.
    Returns the Lease, for the write's puts and `confirm_written`. The lease is created
    first, so a run that claims the output after this check passed is bound to see it and wait."""
    fs, path = split_url(url, storage_options)
    lease = f"{path}/{LEASE_PREFIX}{run_id}.{uuid.uuid4().hex}"
    fs.pipe_file(lease, json.dumps({"run_id": run_id, "what": what, "process": processes.this_process(),
                                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
    try:
        check_owner(url, run_id, storage_options, doing=f"about to write {what}")
    except BaseException:
        _remove_if_present(fs, lease)
        raise
    return Lease(lease, create_only.Ledger())


@contextmanager
def fenced(url: str, run_id: str, what: str, storage_options: dict | None = None):
    """Holds a lease and checks the claim before and after a write (see the module's doc);
    yields the Lease, whose ledger the write's create-only puts fill."""
    lease = begin_write(url, run_id, what, storage_options)
    try:
        yield lease
    finally:  # a failed write may have landed in part: it is confirmed like any other
        confirm_written(url, run_id, what, storage_options, lease)


def confirm_written(url: str, run_id: str, what: str, storage_options: dict | None = None,
                    lease: Lease | None = None):
    """The second half of `fenced`, for writes that finish later than they start: once they
    have landed, checks the claim and gives the lease back.

    Still the owner: objects the write found with its own bytes are made its own
    (create_only.adopt); other bytes where it wrote are a conflict (recorded at the output;
    OutputError). Another run took the output over: if it was still waiting for this lease,
    the write landed first and harms nothing (OutputTaken with `landed_first`); if not, the
    write takes back what it created (`_lost`) and raises OutputTaken."""
    fs, _ = split_url(url, storage_options)
    ledger = lease.ledger if lease is not None else None
    try:
        check_owner(url, run_id, storage_options, doing=f"writing {what}")
    except OutputTaken as e:
        if lease is not None and _remove_if_present(fs, lease.path):
            raise OutputTaken(str(e), landed_first=True) from None
        _lost(url, run_id, what, storage_options, ledger, e)
    except BaseException:
        if lease is not None:
            _remove_if_present(fs, lease.path)
        raise
    if ledger is not None:
        try:
            for path, (found, data) in list(ledger.found.items()):
                create_only.adopt(fs, path, data, found, ledger)
        except create_only.ObjectConflict as e:
            ledger.conflict(e.path)
        if ledger.conflicts:
            _remove_if_present(fs, lease.path)
            names = listing(sorted(set(ledger.conflicts)))
            message = (f"--output {url}: {names}: another object (other bytes) was already where this run "
                       f"({run_id}) wrote {what}; another run wrote into this output. Nothing was replaced; a "
                       f"conflict record was left so that this output is never resumed or read: rerun with "
                       f"--overwrite")
            record_conflict(url, run_id, message, storage_options)
            raise OutputError(message)
    if lease is not None and not _remove_if_present(fs, lease.path):
        # Broken since the check above (the newcomer stopped waiting): lost after all.
        try:
            check_owner(url, run_id, storage_options, doing=f"writing {what}")
        except OutputTaken as e:
            _lost(url, run_id, what, storage_options, ledger, e)
        # Still this run's claim, the newest: no run took the output over (a takeover claims
        # first), yet the lease is gone. The store lost it; what this write created is this
        # run's, and stays for the rerun to resume or replace.
        raise objects_vanished(url, run_id, f"the lease of its write of {what}", f"writing {what}")


def _lost(url: str, run_id: str, what: str, storage_options: dict | None, ledger, taken: OutputTaken):
    """This run lost the output, and the newcomer went on without waiting for this write: it
    takes back the objects the write created (they may lie in the newcomer's output), unless
    the arrays it wrote into are still those it opened (then the newcomer kept them: the
    same job, the same bytes). Raises OutputTaken; leaves a conflict record only when an
    object could not be taken back."""
    fs, _ = split_url(url, storage_options)
    if ledger is None or not ledger.created:
        raise OutputTaken(f"{taken}; its write of {what} had created nothing there") from None
    if ledger.arrays_unchanged(fs):
        raise OutputTaken(f"{taken}; {what} landed in the arrays that run kept (the same job: the same "
                          f"bytes)") from None
    left, taken_back = [], 0
    for path, created in sorted(ledger.created.items()):
        try:
            taken_back += create_only.take_back(fs, path, created)
        except Exception:  # noqa: BLE001 - whatever failed, the object may still be there
            left.append(path)
    if left:
        record_conflict(url, run_id, f"{what} of run {run_id} may have been written after the takeover, and "
                        f"{listing(left)} could not be taken back: {taken}", storage_options)
        raise OutputTaken(f"{taken}; {what} may have landed in that run's output and {listing(left)} could not be "
                          f"taken back, so a conflict record was left there and it will not be read: rerun with "
                          f"--overwrite") from None
    raise OutputTaken(f"{taken}; of the {len(ledger.created)} object(s) its write of {what} created, the "
                      f"{taken_back} still there were taken back") from None


def lease_patience() -> float:
    """LEASE_PATIENCE_S, or $FLAT_TOKENS_LEASE_PATIENCE_S when it is set."""
    value = os.environ.get(LEASE_PATIENCE_VARIABLE, "").strip()
    if not value:
        return LEASE_PATIENCE_S
    try:
        patience = float(value)
    except ValueError:
        raise OutputError(f"${LEASE_PATIENCE_VARIABLE}={value}: not a number of seconds") from None
    if not patience >= 0:
        raise OutputError(f"${LEASE_PATIENCE_VARIABLE}={value}: must be >= 0 seconds")
    return patience


def wait_for_writers(url: str, run_id: str, storage_options: dict | None = None,
                     patience: float | None = None) -> None:
    """Called by a run that has just claimed the output, before it deletes anything: waits
    until no other run holds a lease there. Such a write passed its check before this run's
    claim existed, and will land; any write started later fails its check. A lease of a
    process seen dead on this machine is broken at once, any other after `patience`
    seconds (lease_patience(): that run, if alive, then takes back what it writes later)."""
    patience = lease_patience() if patience is None else patience
    fs, path = split_url(url, storage_options)
    first_seen: dict[str, float] = {}
    pause = 0.05
    while True:
        check_owner(url, run_id, storage_options, doing="waiting for the replaced run's writes to land")
        leases = [n for n, _ in top_level_names(fs, path) if n.startswith(LEASE_PREFIX) and not is_lease_of(n, run_id)]
        if not leases:
            return
        now = time.monotonic()
        for name in leases:
            lease = read_json(fs, f"{path}/{name}")
            if lease is None:
                # Not a whole lease: its writer was killed while creating it, or is creating it
                # now. Its check comes after the lease is whole, so it either never ran or will
                # find this run's claim: nothing of that write can land. (A kill at the wrong
                # moment used to hold every later run here for `patience`.)
                _remove_if_present(fs, f"{path}/{name}")
                continue
            holder = f"run {lease.get('run_id', '?')}'s write ({lease.get('what', '?')})"
            dead = processes.certainly_dead(lease.get("process"))
            if dead:
                # The routine case: a rerun after a kill finds the killed run's lease. Its process has
                # ended, so nothing of that write can land any more: nothing to wait for, nothing wrong.
                if _remove_if_present(fs, f"{path}/{name}"):
                    _log().info("flat-tokens: --output %s: run %s was stopped while writing %s; its process has "
                                "ended, so that write cannot land any more: going on (nothing is wrong)", url,
                                lease.get("run_id", "?"), lease.get("what", "?"))
                continue
            if name not in first_seen:
                first_seen[name] = now
                _log().warning("flat-tokens: --output %s: waiting for %s to land: that run was still writing when "
                               "this one took the output over (at most %.0f s, less if its process is seen to end)",
                               url, holder, patience)
            if now - first_seen[name] >= patience and _remove_if_present(fs, f"{path}/{name}"):
                _log().warning("flat-tokens: --output %s: %s has not landed after %.0f s; going on without it "
                               "(should it land later, it cannot replace this run's objects, and that run takes "
                               "back what it created)", url, holder, patience)
        time.sleep(pause)
        pause = min(1.0, pause * 2)


def release_claim(url: str, run_id: str, generation: int, storage_options: dict | None = None) -> None:
    """Gives back a claim this run made but will not use: the output stays as it was."""
    fs, path = split_url(url, storage_options)
    name = f"{path}/{CLAIM_PREFIX}{generation}"
    if (read_json(fs, name) or {}).get("run_id") == run_id:
        _remove_if_present(fs, name)


def _delete_fenced(url: str, run_id: str, split: str, fs, listed: list[tuple[str, tuple]],
                   storage_options: dict | None) -> None:
    """Deletes objects as listed (path, identity), in a lease: each only while it is still the
    object listed, so a deletion stalled past a takeover cannot delete the newcomer's objects."""
    with fenced(url, run_id, f"the deletion of the replaced {split}/", storage_options):
        create_only.delete_listed(fs, listed)


def _listed(fs, paths) -> list[tuple[str, tuple]]:
    """(path, identity) of each of `paths` that is there now."""
    return [(p, ident) for p in paths for ident in [create_only.identity(fs, p)] if ident is not None]


def _delete_split(url: str, run_id: str, split: str, storage_options: dict | None) -> None:
    """Deletes what the layout wrote in one split's directory, in fenced batches (each
    checks the claim before and after), each object only while it is the one listed. The
    metadata goes first: a run that lost the output and whose write lands after this
    deletion listed its objects then finds its arrays replaced, and takes that write back
    (see the module's doc); without metadata the layout's names are still recognised as ours
    (written_by_layout). Anything else is left there and refused."""
    fs, path = split_url(url, storage_options)
    base = f"{path}/{split}"
    layouts = _array_layouts(fs, base)
    # Identities are read before each batch's lease checks the claim: so they are of objects
    # that were there while this run owned the output, never of objects a newcomer wrote since.
    _delete_fenced(url, run_id, split, fs, _listed(fs, [f"{base}/{name}" for name in ROOT_METADATA]
                                                   + [f"{base}/{array}/{name}" for array in ARRAYS
                                                      for name in ARRAY_METADATA]), storage_options)
    metadata, directories = [], []  # any written again since: deleted last
    fs.invalidate_cache(base)
    for entries in walk_tree(fs, base, identities=True):
        data = []
        for relative, is_dir, ident in entries:
            if not written_by_layout(relative, is_dir, layouts):
                continue
            if is_dir:
                directories.append(relative)
            elif posixpath.basename(relative) in ARRAY_METADATA + ROOT_METADATA:
                metadata.append((f"{base}/{relative}", ident))
            else:
                data.append((f"{base}/{relative}", ident))
        for i in range(0, len(data), DELETE_BATCH):
            _delete_fenced(url, run_id, split, fs, data[i:i + DELETE_BATCH], storage_options)
    if metadata:
        _delete_fenced(url, run_id, split, fs, metadata, storage_options)
    if is_local(fs):  # object stores have no directories to remove
        for relative in sorted(directories, key=lambda r: -r.count("/")) + [""]:
            try:
                os.rmdir(os.path.join(base, relative))
            except OSError:
                pass  # not empty: what is left is refused below
    foreign = foreign_in_split(fs, base)
    if foreign:
        raise OutputError(f"--output {url}: {listing([f'{split}/{f}' for f in foreign])} appeared while this run "
                          f"replaced the output; this tool did not write it, so it was left there. Move it away "
                          f"and rerun with --overwrite")


def remove_replaced(url: str, run_id: str, storage_options: dict | None = None,
                    keep: frozenset = frozenset()) -> list[str]:
    """Deletes what this run replaces: root metadata first (the old dataset is uncommitted
    before anything else goes), then the splits, older claims and other runs' `.flat-tokens-*`
    objects, each deletion fenced, but not the staging area (its own rules delete it:
    transforms/staging.py), nor the names in `keep` (a resumed run's splits). Only recognised
    names are deleted; anything else stays. Returns the run ids whose claims were removed
    (their rejected-line reports go too)."""
    fs, path = split_url(url, storage_options)
    check_owner(url, run_id, storage_options, doing="replacing the old output")
    names = top_level_names(fs, path)
    own = current_owner(fs, path)[0]
    replaced = []
    order = sorted(names, key=lambda e: (e[0] not in ROOT_METADATA, e[0]))
    for name, is_dir in order:
        generation = claim_generation(name)
        if generation is not None:
            if generation >= own:
                continue
            holder = (read_json(fs, f"{path}/{name}") or {}).get("run_id")
            if holder:
                replaced.append(holder)
        elif name in keep or name == STAGING:
            continue
        elif is_own_name(name):  # exactly a name this tool writes: a user's .flat-tokens-notes.txt is not
            if run_id in name:
                continue
        elif not _dataset_entry(name, is_dir):
            continue
        if is_dir and name in SPLITS:
            _delete_split(url, run_id, name, storage_options)
            continue
        # Its identity is read before the lease's check: it is then of an object that was there
        # while this run owned the output, never of one a newcomer wrote since.
        listed = [] if is_dir else _listed(fs, [f"{path}/{name}"])
        with fenced(url, run_id, "the deletion of the replaced output", storage_options):
            try:
                if is_dir:  # names no other run writes (its run id is in them): page by page
                    remove_tree(fs, f"{path}/{name}")
                else:  # root metadata (a newcomer writes its own there), claims, leases, records
                    create_only.delete_listed(fs, listed)
            except FileNotFoundError:  # another attempt of this step removed it already
                pass
    fs.invalidate_cache(path)
    check_owner(url, run_id, storage_options, doing="replacing the old output")
    return replaced
