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
root group metadata, `train/`, `validation/`, and `.flat-tokens-*` objects such as conflict
records or a run's temporary files) and a claim says the dataset entries are this tool's.
A committed dataset of an earlier version (no claim) is recognised by the provenance those
versions wrote: root attributes `format: flat-tokens`, `package.name: flat-tokens-beam` and
a `run_id` that both split groups repeat in `flat_tokens_run`.

Writers check the claim before and after each write. A run that finds, after writing, that
another run took the output over leaves a conflict record `OUTPUT/.flat-tokens-conflict.<run
id>`: no commit publishes an output holding one, and `verify` rejects it.
"""
import importlib.metadata
import json
import os
import posixpath
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

from fsspec.core import url_to_fs

from transforms.write.object_trees import remove_tree

OWN_PREFIX = ".flat-tokens-"  # every top-level name this tool writes for itself starts so
CLAIM_PREFIX = ".flat-tokens-run."
CONFLICT_PREFIX = ".flat-tokens-conflict."
SPLITS = ("train", "validation")
ROOT_METADATA = (".zgroup", ".zattrs", "zarr.json")
DATASET_ENTRIES = frozenset(SPLITS + ROOT_METADATA)
PACKAGE_NAME = "flat-tokens-beam"
SPLIT_RUN_ATTRIBUTE = "flat_tokens_run"
LISTED_NAMES = 5


class OutputError(ValueError):
    """The output path cannot be used; the message names it and says what to do."""


class OutputTaken(OutputError):
    """Another run owns the output now: this run must not write or delete anything there."""


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


def split_url(url: str, storage_options: dict | None = None):
    """(filesystem, path) with local paths made absolute, `~` expanded and symlinks resolved."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    if _is_local(fs):
        path = os.path.realpath(path)
    return fs, path.rstrip("/") or "/"


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def location(url: str, storage_options: dict | None = None) -> tuple[str, str]:
    """A normalised (protocol, path) for comparing where two URLs point."""
    fs, path = split_url(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return ("file" if _is_local(fs) else protocol), (path if _is_local(fs) else posixpath.normpath(path))


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


def _names(fs, path: str) -> list[tuple[str, bool]]:
    """(name, is directory) of each top-level entry, read fresh (gcsfs caches listings)."""
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True, refresh=True) if not _is_local(fs) else fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        name = posixpath.basename(e["name"].rstrip("/"))
        if e["name"].rstrip("/") == path.rstrip("/") or not name:
            continue  # a bucket's directory placeholder object (`out/`) lists itself
        out.append((name, e.get("type") == "directory"))
    return sorted(set(out))


def claim_generation(name: str) -> int | None:
    if name.startswith(CLAIM_PREFIX) and name[len(CLAIM_PREFIX):].isdigit():
        return int(name[len(CLAIM_PREFIX):])
    return None


def _read_json(fs, path: str) -> dict | None:
    try:
        value = json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _claims(names) -> list[int]:
    return sorted(g for g in (claim_generation(n) for n, _ in names) if g is not None)


def _legacy_run_id(fs, path: str) -> str:
    """The run id of a committed dataset written by a version without claims, or ""."""
    root = _read_json(fs, f"{path}/.zattrs") or (_read_json(fs, f"{path}/zarr.json") or {}).get("attributes") or {}
    run_id = root.get("run_id")
    if not (root.get("format") == "flat-tokens" and isinstance(root.get("package"), dict)
            and root["package"].get("name") == PACKAGE_NAME and isinstance(run_id, str) and run_id):
        return ""
    for split in SPLITS:
        attrs = _read_json(fs, f"{path}/{split}/.zattrs") or \
            (_read_json(fs, f"{path}/{split}/zarr.json") or {}).get("attributes") or {}
        if attrs.get(SPLIT_RUN_ATTRIBUTE) != run_id:
            return ""
    return run_id


def inspect_output(url: str, storage_options: dict | None = None, own_run_id: str = "") -> OutputState:
    """What is at the output path, and whether this tool may replace it. Entries that name
    `own_run_id` (this run's own temporary files) are left out."""
    fs, path = split_url(url, storage_options)
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return OutputState("absent")
    if not fs.isdir(path):
        return OutputState("file", names=(posixpath.basename(path),))
    listed = [(n, d) for n, d in _names(fs, path) if not (own_run_id and n.startswith(OWN_PREFIX) and own_run_id in n)]
    names = tuple(n + "/" if d else n for n, d in listed)
    if not listed:
        return OutputState("empty")
    claims = _claims(listed)
    owner = (0, "")
    if claims:
        claim = _read_json(fs, f"{path}/{CLAIM_PREFIX}{claims[-1]}") or {}
        owner = (claims[-1], str(claim.get("run_id", "")))
    plain = {n for n, _ in listed}
    if not claims and plain & DATASET_ENTRIES:
        legacy = _legacy_run_id(fs, path)
        if legacy:
            owner = (0, legacy)
    dataset_is_ours = bool(claims) or bool(owner[1])
    foreign = tuple(label for (n, _), label in zip(listed, names)
                    if not (n.startswith(OWN_PREFIX) or (dataset_is_ours and n in DATASET_ENTRIES)))
    committed = bool(plain & set(ROOT_METADATA))
    return OutputState("foreign" if foreign else "dataset", names, foreign, owner, committed)


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


def refuse_for_run(url: str, overwrite: bool, storage_options: dict | None = None) -> OutputState:
    """The launcher's check: the state found, or OutputError when this run may not use the path."""
    refuse_root(url, storage_options)
    state = inspect_output(url, storage_options)
    if not state.replaceable:
        raise OutputError(refusal(url, state))
    if state.kind == "dataset" and not overwrite:
        raise OutputError(f"--output {url}: exists and is not empty; pass --overwrite to replace it, "
                          f"or choose another path ({describe_owner(state)} is there)")
    return state


# ---------------------------------------------------------------------------------------------
# Claims and fences


def current_owner(fs, path: str) -> tuple[int, str]:
    """(generation, run id) of the highest claim, or (0, "")."""
    for _ in range(3):  # a claim listed, then removed by a takeover before it is read: look again
        claims = _claims(_names(fs, path))
        if not claims:
            return 0, ""
        claim = _read_json(fs, f"{path}/{CLAIM_PREFIX}{claims[-1]}")
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
    if _is_local(fs):
        fs.makedirs(path, exist_ok=True)
    try:
        fs.pipe_file(claim_path, body, mode="create")
    except FileExistsError:
        pass  # another run's, or this run's own from an earlier attempt of this step: read it
    fs.invalidate_cache(path)
    holder = (_read_json(fs, claim_path) or {}).get("run_id")
    if holder != run_id:
        raise OutputTaken(f"--output {url}: run {holder} claimed it first (both runs found the same output); "
                          f"this run stops without touching it")


def check_owner(url: str, run_id: str, storage_options: dict | None = None, doing: str = "writing") -> None:
    """OutputTaken unless `run_id` holds the highest claim at the output."""
    fs, path = split_url(url, storage_options)
    generation, holder = current_owner(fs, path)
    if holder != run_id:
        who = f"run {holder}" if holder else "another run"
        raise OutputTaken(f"--output {url}: {who} took it over (claim {generation}) while this run ({run_id}) was "
                          f"{doing}; this run stops and leaves that run's data alone")


def record_conflict(url: str, run_id: str, message: str, storage_options: dict | None = None) -> None:
    fs, path = split_url(url, storage_options)
    fs.pipe_file(f"{path}/{CONFLICT_PREFIX}{run_id}", message.encode())


def conflicts(url: str, storage_options: dict | None = None) -> list[str]:
    """The conflict records at the output: each means another run may have written into it."""
    fs, path = split_url(url, storage_options)
    return [n for n, _ in _names(fs, path) if n.startswith(CONFLICT_PREFIX)]


@contextmanager
def fenced(url: str, run_id: str, what: str, storage_options: dict | None = None):
    """Checks the claim before and after a write. A write that may have landed after another
    run took the output over is recorded as a conflict, so that output is never published."""
    check_owner(url, run_id, storage_options, doing=f"about to write {what}")
    yield
    confirm_written(url, run_id, what, storage_options)


def confirm_written(url: str, run_id: str, what: str, storage_options: dict | None = None):
    """The second half of `fenced`, for writes that finish later than they start: checks the
    claim once they have landed, and records a conflict if another run took the output over."""
    try:
        check_owner(url, run_id, storage_options, doing=f"writing {what}")
    except OutputTaken as e:
        record_conflict(url, run_id, f"{what} of run {run_id} may have been written after the takeover: {e}",
                        storage_options)
        raise OutputTaken(f"{e}; {what} may have landed in that run's output, so a conflict record was left "
                          f"there and it will not verify: rerun with --overwrite") from None


def remove_replaced(url: str, run_id: str, storage_options: dict | None = None) -> list[str]:
    """Deletes what this run replaces: root metadata first (the old dataset is uncommitted
    before anything else goes), then the splits, older claims and other runs' `.flat-tokens-*`
    objects. Only recognised names are deleted; anything else stays where it is.
    Returns the run ids whose claims were removed (their rejected-line reports go too)."""
    fs, path = split_url(url, storage_options)
    check_owner(url, run_id, storage_options, doing="replacing the old output")
    names = _names(fs, path)
    own = current_owner(fs, path)[0]
    replaced = []
    order = sorted(names, key=lambda e: (e[0] not in ROOT_METADATA, e[0]))
    for name, is_dir in order:
        generation = claim_generation(name)
        if generation is not None:
            if generation >= own:
                continue
            holder = (_read_json(fs, f"{path}/{name}") or {}).get("run_id")
            if holder:
                replaced.append(holder)
        elif name.startswith(OWN_PREFIX):
            if run_id in name:
                continue
        elif name not in DATASET_ENTRIES:
            continue
        check_owner(url, run_id, storage_options, doing="replacing the old output")  # deletions can be long
        try:
            if is_dir:
                remove_tree(fs, f"{path}/{name}")  # page by page: a split holds one object per chunk
            else:
                fs.rm(f"{path}/{name}")
        except FileNotFoundError:  # another attempt of this step removed it already
            pass
    fs.invalidate_cache(path)
    check_owner(url, run_id, storage_options, doing="replacing the old output")
    return replaced
