"""The records of who wrote a dataset, as a reader reads them: the names this tool gives its
own objects at an output, the claims (`.flat-tokens-run.<generation>`, holding the run id)
and conflict records (`.flat-tokens-conflict.<run id>`), and `refusals`: why a committed
dataset must not be read. How runs create and fence these records is the writer's side
(transforms/write/ownership.py, whose docstring tells the whole rule)."""
import os
import posixpath

from fsspec.core import url_to_fs

from flat_tokens.format import storage_faults
from flat_tokens.format.manifest import MANIFEST

OWN_PREFIX = ".flat-tokens-"  # every top-level name this tool writes for itself starts so (own_names: which)
CLAIM_PREFIX = ".flat-tokens-run."
CONFLICT_PREFIX = ".flat-tokens-conflict."
STAGING = ".flat-tokens-staging"  # work kept for a rerun (transforms/staging.py): never replaced here
LEASE_PREFIX = ".flat-tokens-writing."
SPLITS = ("train", "validation")
# The arrays a split may hold: the format's two, and the optional per-sequence sources
# extension (`seq_sources`, written with --record_sources).
ARRAYS = ("encoded_tokens", "seq_starts", "seq_sources")
ROOT_METADATA = (".zgroup", ".zattrs", "zarr.json")
ARRAY_METADATA = (".zarray", ".zattrs", "zarr.json")
DEDUP_INDEX = "dedup_index"  # the dataset's dedup index (transforms/tokenize/dedup_index.py), beside its splits
# The commit's manifest (flat_tokens/format/manifest.py), beside the root metadata.
DATASET_ENTRIES = frozenset(SPLITS + ROOT_METADATA + (DEDUP_INDEX, MANIFEST))
PACKAGE_NAME = "flat-tokens-beam"
SPLIT_RUN_ATTRIBUTE = "flat_tokens_run"


def split_url(url: str, storage_options: dict | None = None):
    """(filesystem, path) with local paths made absolute, `~` expanded and symlinks resolved."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    if is_local(fs):
        path = os.path.realpath(path)
    return fs, path.rstrip("/") or "/"


def is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def top_level_names(fs, path: str) -> list[tuple[str, bool]]:
    """(name, is directory) of each top-level entry, read fresh (gcsfs caches listings)."""
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True, refresh=True) if not is_local(fs) else fs.ls(path, detail=True)
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


def read_json(fs, path: str) -> dict | None:
    """The JSON object at `path`, or None when there is none (or it is no JSON object on every
    fresh read: a lease being created). A read cut short is read again (storage_faults): a
    claim read half would otherwise say "run None claimed it" and stop the run."""
    try:
        value = storage_faults.read_json(fs, path)
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def claim_generations(names) -> list[int]:
    return sorted(g for g in (claim_generation(n) for n, _ in names) if g is not None)


def conflicts(url: str, storage_options: dict | None = None) -> list[str]:
    """The conflict records at the output: each means another run may have written into it."""
    fs, path = split_url(url, storage_options)
    return [n for n, _ in top_level_names(fs, path) if n.startswith(CONFLICT_PREFIX)]


def refusals(url: str, committed_by: str, storage_options: dict | None = None) -> list[str]:
    """Why a committed dataset (committed by run `committed_by`) must not be read: conflict
    records (another run may have written into it), or a newer claim than its run's (a run
    that lost the output committed in another's; or a run replacing it has begun). Empty
    when it may be read. One listing of the output's top level."""
    fs, path = split_url(url, storage_options)
    names = top_level_names(fs, path)
    fs.invalidate_cache(path)  # a reader keeps its filesystem: no listing of ours may answer its later looks
    found = [f"conflict record {n}: another run may have written into this output while it was being written; "
             f"rerun with --overwrite" for n, _ in names if n.startswith(CONFLICT_PREFIX)]
    generations = claim_generations(names)
    if generations and committed_by:
        holder = (read_json(fs, f"{path}/{CLAIM_PREFIX}{generations[-1]}") or {}).get("run_id")
        if holder and holder != committed_by:
            found.append(f"run {holder} holds the output's newest claim ({CLAIM_PREFIX}{generations[-1]}), not run "
                         f"{committed_by}, which committed this dataset: it is being replaced, or run {committed_by} "
                         f"lost the output before it committed; rerun with --overwrite")
    return found
