"""Finding the input files, cutting them into byte ranges that workers read in parallel, and
opening them (decompressed, and checked against the listing).

Listing runs when the pipeline is built, so a glob that matches nothing, or an entry that
cannot be read, fails before any worker starts; the ranges are a pure function of the
listing. Each file's size and version are recorded then, and every open checks them.
"""
import bz2
import contextlib
import errno
import gzip
import hashlib
import lzma
import os
import posixpath
import re
import stat
import zlib
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import glob_translate

from flat_tokens.format.gcs import close_gcs_sessions, close_gcs_sessions_at_exit, use_gcs_emulator_plainly  # noqa: F401
from flat_tokens.format.own_names import is_own_name
from flat_tokens.format.report_files import INPUT_PARQUET_SUFFIXES

try:
    import zstandard
    ZSTD_ERRORS = (zstandard.ZstdError,)
except ImportError:  # the reader-only install (reader/setup.py) reads no input, only datasets
    zstandard, ZSTD_ERRORS = None, ()

GLOB_CHARS = "*?["
COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
PARQUET_SUFFIXES = INPUT_PARQUET_SUFFIXES  # one list: a report row names its documents' files by it too
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
# In a directory, an uncompressed *.json file is far more often one JSON document (a corpus's
# MANIFEST.json, a HuggingFace save_to_disk folder's dataset_info.json and state.json) than
# JSON Lines: it is read only when named or matched by a glob. Compressed ones (C4's and
# Dolma's *.json.gz shards) are JSON Lines, and read.
DIRECTORY_JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL = "jsonl"
PARQUET = "parquet"
# Names of the files listed after a directory input's "skipped" warning.
SKIPPED_NAMED = 5
# What this tool writes, recognised by its exact names (flat_tokens/format/own_names.py): a directory
# holding one is one of its outputs (a dataset's claim, an unfinished output's staging area,
# leases), and a file named like a rejected-lines report is one. Listings leave both out: an
# output written inside its own input directory must not become input of the next run. A
# user's `.flat-tokens-notes.txt` is not such a name: it hides nothing beside it.
OWN_REPORT = re.compile(r"rejected-[0-9a-f]+-[0-9a-f]{16}\.jsonl")


class InputError(ValueError):
    """A user error in the input options: the message names the option and the culprit."""


class InputChanged(InputError):
    """An input file is no longer what the job listed: another size, another modification time
    or GCS generation, or fewer or more bytes than listed when read. The message names it."""


@dataclass(frozen=True)
class InputFile:
    url: str  # what workers open
    # "<input index>:<place name>": unique per listed file. The place name (place_name) is what
    # the shuffle hashes: the file's path relative to the common root of all the job's input
    # files (name_places), the same however the files were named. The input index (which
    # pattern listed it: a mixture's source, a recorded source) is not hashed.
    key: str
    size: int  # bytes on storage (compressed size for compressed files)
    compression: str | None
    split: str  # "train", "validation", or "auto" (decided per document by --validation_fraction)
    format: str = JSONL  # JSONL, or PARQUET (read by row group, never by byte range)
    text_key: str | None = None  # a mixture source's own text key; None: --text_key
    # What tells this content from another of the same size, as listed: "mtime <ns>" for a
    # local file, "generation <n>" for a GCS object (whose reads are then pinned to it).
    version: str | None = None


def input_index(file_key: str) -> int:
    """The index of the input (pattern) that listed a file, from its key."""
    return int(file_key.split(":", 1)[0])


def place_name(file_key: str) -> str:
    """The part of a file's key that a document's place is hashed with (its order, split and
    sample hashes): the file's path relative to the common root of the job's input files."""
    return file_key.split(":", 1)[1]


def _path_parts(url: str) -> tuple[str, list[str]]:
    """(scheme, path components) of a listed file: local paths made absolute."""
    if "://" in url and not url.startswith("file://"):
        scheme, path = url.split("://", 1)
        return scheme, [p for p in path.split("/") if p]
    path = os.path.abspath(url.removeprefix("file://"))
    return "file", [p for p in path.split("/") if p]


def name_places(files: list[InputFile]) -> list[InputFile]:
    """The files, each keyed by its input index and its path relative to the deepest directory
    that holds every one of them (gs://b/corpus/web/a.jsonl -> "web/a.jsonl" beside
    gs://b/corpus/code/). So the same set of files gives the same keys however it was named
    (a quoted glob, the shell's expansion of it, a directory, a list in any order), and moved
    together to another directory or bucket, keeps them. Files on different filesystems have
    no common root: each is named by its whole URL (a local path absolute)."""
    if not files:
        return files
    parts = [_path_parts(f.url) for f in files]
    if len({scheme for scheme, _ in parts}) > 1:
        names = [f"{scheme}://{'/'.join(p)}" if scheme != "file" else "/" + "/".join(p) for scheme, p in parts]
    else:
        directories = [p[:-1] for _, p in parts]
        depth = 0
        while all(len(d) > depth and d[depth] == directories[0][depth] for d in directories):
            depth += 1
        names = ["/".join(p[depth:]) for _, p in parts]
    return [replace(f, key=f"{input_index(f.key)}:{name}") for f, name in zip(files, names)]


@dataclass(frozen=True)
class ReadRange:
    """Lines whose first byte lies in [start, stop) of one file; stop None means to the end."""

    file: InputFile
    start: int
    stop: int | None


def absolute(url: str) -> str:
    """A local path made absolute (`~` and `..` resolved, links kept); a URL as it is. What
    provenance records, so that it means the same from any working directory."""
    if "://" in url:
        return url
    return os.path.abspath(os.path.expanduser(url))


def glob_root(pattern: str) -> str:
    """The directory part of a pattern before its first glob character ("a/b/*/c" -> "a/b")."""
    cut = min((pattern.find(c) for c in GLOB_CHARS if c in pattern), default=-1)
    if cut < 0:
        return posixpath.dirname(pattern)
    return posixpath.dirname(pattern[:cut])


def compression_of(path: str) -> str | None:
    for suffix, name in COMPRESSED_SUFFIXES.items():
        if path.endswith(suffix):
            return name
    return None


def is_data_name(path: str) -> bool:
    """Whether a file's name says JSON Lines or Parquet: what a directory input reads
    (*.jsonl, *.ndjson, compressed or not; *.json compressed only; *.parquet, *.pq). A
    README, a YAML file, a _SUCCESS marker or a MANIFEST.json beside the data is not read."""
    name = path.lower()
    compression = compression_of(name)
    if compression:
        return name[:name.rfind(".")].endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES)
    return name.endswith(DIRECTORY_JSONL_SUFFIXES + PARQUET_SUFFIXES)


# What a directory input reads, in words (the skipped-files warning, the README).
DATA_NAMES = "*.jsonl, *.ndjson, *.parquet, *.pq; *.jsonl, *.ndjson and *.json compressed (.gz/.zst/.bz2/.xz)"


def format_of(path: str, option: str = "--input") -> str:
    """PARQUET for *.parquet and *.pq (any case), else JSONL."""
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return PARQUET
    if compression_of(name) and name[:name.rfind(".")].endswith(PARQUET_SUFFIXES):
        raise InputError(f"{option} {path}: a compressed Parquet file; Parquet compresses its pages "
                         f"itself, so decompress the file (or rewrite it with a Parquet codec)")
    return JSONL


@dataclass
class Listing:
    """The files some patterns name, and what their directories held that is not data."""

    files: list[InputFile] = field(default_factory=list)
    skipped: list[tuple[str, list[str]]] = field(default_factory=list)  # (option and pattern, paths)
    own: list[tuple[str, list[str]]] = field(default_factory=list)  # this tool's outputs and reports, left out

    def skipped_message(self) -> str | None:
        """One line per directory input that held files which are not data, or None."""
        if not self.skipped:
            return None
        lines = []
        for where, paths in self.skipped:
            names = ", ".join(paths[:SKIPPED_NAMED]) + (f" and {len(paths) - SKIPPED_NAMED} more"
                                                        if len(paths) > SKIPPED_NAMED else "")
            lines.append(f"flat-tokens: {where}: skipped {len(paths)} file(s) not named as JSONL or Parquet "
                         f"data ({DATA_NAMES}; name or glob a file to read it anyway): {names}")
        return "\n".join(lines)

    def own_message(self) -> str | None:
        """One line per pattern that reached this tool's own outputs or reports, or None."""
        if not self.own:
            return None
        return "\n".join(f"flat-tokens: {where}: left out this tool's own output (datasets, staging areas, "
                         f"rejected-lines reports): {', '.join(paths[:SKIPPED_NAMED])}"
                         + (f" and {len(paths) - SKIPPED_NAMED} more" if len(paths) > SKIPPED_NAMED else "")
                         for where, paths in self.own)


def is_own_report(path: str) -> bool:
    """Whether a file is named as this tool names a rejected-lines report."""
    return OWN_REPORT.fullmatch(posixpath.basename(path)) is not None


class _Entry(NamedTuple):
    path: str
    size: int
    version: str | None


def list_input_files(patterns: list[str], split: str, first_index: int = 0,
                     option: str = "--input", storage_options: dict | None = None) -> list[InputFile]:
    """Expands each pattern (a path, a glob, or a directory) into files, in a stable order."""
    return list_inputs(patterns, split, first_index, option, storage_options).files


def list_inputs(patterns: list[str], split: str, first_index: int = 0,
                option: str = "--input", storage_options: dict | None = None) -> Listing:
    """Expands each pattern (a path, a glob, or a directory) into files, in a stable order.

    Every file it returns is a regular file that could be opened, with the size and version
    (see InputFile.version) it has now. Anything that would leave data out silently is an
    InputError naming it: a directory that cannot be listed, a broken or looping link, a
    file that cannot be opened, a FIFO or device (refused without opening it: opening a
    FIFO waits for a writer). A directory input reads its data files only (is_data_name);
    the others are listed in Listing.skipped."""
    listing = Listing()
    for i, pattern in enumerate(patterns):
        where = f"{option} {pattern}"
        try:
            fs, path = url_to_fs(pattern, **(storage_options or {}))
        except (ImportError, ValueError) as e:
            raise InputError(f"{where}: cannot open this kind of path ({e})") from None
        try:
            if isinstance(fs, LocalFileSystem):
                root, entries, skipped, own = _list_local(path, where)
            else:
                root, entries, skipped, own = _list_objects(fs, path, where)
        except PermissionError as e:
            raise InputError(f"{where}: permission denied ({e})") from None
        if "://" in pattern:
            skipped, own = [fs.unstrip_protocol(p) for p in skipped], [fs.unstrip_protocol(p) for p in own]
        if skipped:
            listing.skipped.append((where, skipped))
        if own:
            listing.own.append((where, own))
        if not entries:
            if skipped:
                arrow = any(p.endswith(".arrow") for p in skipped)  # a HuggingFace save_to_disk folder
                raise InputError(f"{where}: the directory holds no file named as JSONL or Parquet data ({DATA_NAMES}), "
                                 f"only: {', '.join(skipped[:SKIPPED_NAMED])}"
                                 f"{' ...' if len(skipped) > SKIPPED_NAMED else ''}; name the files to read (a path or "
                                 f"a glob)" + ("; Arrow files are not read: write the dataset out with datasets' "
                                               "to_json or to_parquet" if arrow else ""))
            raise InputError(f"{where}: the pattern matches no file; check the path and the glob")
        for entry in entries:
            rel = posixpath.relpath(entry.path, root) if root else entry.path
            listing.files.append(InputFile(
                url=fs.unstrip_protocol(entry.path) if "://" in pattern else entry.path,
                key=f"{first_index + i}:{rel}",
                size=entry.size,
                compression=compression_of(entry.path),
                split=split,
                format=format_of(entry.path, option),
                version=entry.version,
            ))
    return listing


def _own_outputs(names: list[str], root: str) -> list[str]:
    """The directories below `root` that are this tool's outputs: those holding an entry
    named exactly as this tool names its own (is_own_name; a trailing "/" each)."""
    found = set()
    for name in names:
        parts = (posixpath.relpath(name, root) if root else name).split("/")
        depth = next((d for d, part in enumerate(parts) if is_own_name(part)), None)
        if depth:  # not 0: an input that is itself such an output is not left out of itself
            found.add(posixpath.join(root, *parts[:depth]) + "/")
    return sorted(found)


def is_glob(path: str, exists) -> bool:
    """Whether an input pattern is expanded as a glob: it holds a glob character and names no
    existing path (`exists(path)`). A file (or directory) that exists is read by its exact
    name, `data[1].jsonl` included: as a glob that would read `data1.jsonl` instead."""
    return any(c in path for c in GLOB_CHARS) and not exists(path)


def _list_objects(fs, path: str, where: str) -> tuple[str, list[_Entry], list[str], list[str]]:
    """(root, files, skipped, own) on an object store (or any fsspec filesystem but the local
    one), from the listing's own details: no request per file. `own`: this tool's outputs
    and rejected-lines reports, left out."""
    glob = is_glob(path, fs.exists)
    if glob:
        root, found, directory = glob_root(path), fs.glob(path, detail=True), False
    elif fs.isdir(path):
        root, found, directory = path.rstrip("/"), fs.find(path, detail=True), True
    elif fs.exists(path):
        root, found, directory = posixpath.dirname(path), {path: fs.info(path)}, False
    else:
        raise InputError(f"{where}: no such file; check the path")
    entries, skipped = [], []
    named = not directory and not glob
    outputs = [] if named else _own_outputs(list(found), root)
    own = list(outputs)
    for name, info in sorted(found.items()):
        if info.get("type") == "directory" or name.endswith("/"):
            continue
        if any(name.startswith(o) for o in outputs):
            continue
        if not named and (is_own_report(name) or is_own_name(posixpath.basename(name))):
            own.append(name)
            continue
        if directory and not is_data_name(name):
            skipped.append(name)
            continue
        if info.get("type") not in ("file", None):
            raise InputError(f"{where}: {name} is not a regular file ({info.get('type')}); refusing to read it")
        generation = info.get("generation")
        entries.append(_Entry(name, int(info.get("size") or 0), f"generation {generation}" if generation else None))
    return root, entries, skipped, own


def _list_local(path: str, where: str) -> tuple[str, list[_Entry], list[str], list[str]]:
    """(root, files, skipped, own) on the local filesystem, walked here rather than by fsspec:
    fsspec's walk leaves out a subdirectory it cannot list, without a word."""
    if is_glob(path, os.path.lexists):
        root = glob_root(path)
        entries, _, own = _walk_local(root, where, pattern=path)
        return root, entries, [], own
    try:
        st = os.stat(path)
    except OSError as e:
        if isinstance(e, FileNotFoundError) and not os.path.islink(path):
            raise InputError(f"{where}: no such file; check the path") from None
        raise InputError(f"{where}: {_unreadable(path, e)}") from None
    if stat.S_ISDIR(st.st_mode):
        root = path.rstrip("/")
        return root, *_walk_local(root, where)
    return posixpath.dirname(path), [_local_entry(path, where)], [], []


def _walk_local(top: str, where: str, pattern: str | None = None) -> tuple[list[_Entry], list[str], list[str]]:
    """The files under directory `top`, following links to directories, in path order: with
    a pattern (a glob, fsspec's syntax), those it matches, entering only the directories it
    can reach; without one (a directory input), the data files, and the paths of the others
    (not opened). A directory that cannot be listed, or a link back to a directory being
    walked, is an InputError: what it holds would be left out, or read twice. This tool's
    own outputs below `top` (directories holding an entry is_own_name names) and reports are
    left out, and returned third."""
    full = re.compile(glob_translate(pattern)) if pattern else None
    parts = pattern[len(top):].strip("/").split("/") if pattern else []
    deep = parts.index("**") if "**" in parts else len(parts)  # directories below this depth: all entered
    prefixes = [re.compile(glob_translate(posixpath.join(top, *parts[:d]))) for d in range(1, len(parts))]
    entries, skipped, own = [], [], []

    def worth_entering(path: str, depth: int) -> bool:
        if full is None or depth > deep:
            return True
        return depth <= len(prefixes) and prefixes[depth - 1].match(path) is not None

    def walk(directory: str, depth: int, ancestors: dict):
        try:
            with os.scandir(directory) as it:
                children = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            if depth == 0 and full is not None:  # a glob under a directory that does not exist
                return
            raise InputError(f"{where}: the directory {directory} disappeared while it was listed") from None
        except OSError as e:
            raise InputError(f"{where}: cannot list the directory {directory} ({e.strerror}): the files in it "
                             f"would be left out; make it readable, or name the files to read") from None
        if depth and any(is_own_name(child.name) for child in children):
            own.append(directory + "/")  # one of this tool's outputs: none of it is input
            return
        for child in children:
            path = posixpath.join(directory, child.name)
            if is_own_name(child.name) or is_own_report(path) and not _is_dir(child):
                own.append(path)
                continue
            if _is_dir(child):
                if not worth_entering(path, depth + 1):
                    continue
                st = child.stat()
                seen = ancestors.get((st.st_dev, st.st_ino))
                if seen is not None:
                    raise InputError(f"{where}: {path} leads back to {seen} (a link loop): its files would be "
                                     f"read again and again; remove the link, or name the files to read")
                walk(path, depth + 1, {**ancestors, (st.st_dev, st.st_ino): path})
            elif full is not None:
                if full.match(path):
                    entries.append(_local_entry(path, where))
            elif is_data_name(child.name):
                entries.append(_local_entry(path, where))
            else:
                skipped.append(path)

    try:
        st = os.stat(top)
    except FileNotFoundError:
        return [], [], []
    except OSError as e:
        raise InputError(f"{where}: {_unreadable(top, e)}") from None
    walk(top, 0, {(st.st_dev, st.st_ino): top})
    return entries, skipped, own


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link; False for a broken one (which is then read as a file)
    except OSError:
        return False


def _local_entry(path: str, where: str) -> _Entry:
    """A local file to read: it must be a regular file (a link to one is), that opens."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"{where}: {_unreadable(path, e)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise InputError(f"{where}: {path} is {kind}, not a regular file; refusing to open it (only regular "
                         f"files are read: a FIFO would wait for a writer, a device may never end)")
    try:  # O_NONBLOCK: were it swapped for a FIFO since the stat, opening must not wait
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)))
    except OSError as e:
        raise InputError(f"{where}: {_unreadable(path, e)}") from None
    return _Entry(path, st.st_size, local_version(st))


def _unreadable(path: str, e: OSError) -> str:
    """Why a local path cannot be read, in words."""
    if e.errno == errno.ELOOP:
        return f"{path} is a symbolic link loop; cannot be read"
    if e.errno == errno.ENOENT and os.path.islink(path):
        return f"{path} is a broken symbolic link (to {os.readlink(path)}); cannot be read"
    return f"{path} cannot be read ({e.strerror or e})"


def local_version(st: os.stat_result) -> str:
    return f"mtime {st.st_mtime_ns}"


def file_identity(f: InputFile) -> str:
    """One name per file, to find a file listed twice: a local path resolved (symlinks,
    "..", relative paths), a URL as listed."""
    if "://" in f.url and not f.url.startswith("file://"):
        return f.url
    return os.path.realpath(f.url.removeprefix("file://"))


def check_no_overlap(files: list[InputFile], origin_of) -> None:
    """Refuses a file that two patterns match (or a train and a validation pattern): its
    documents would be read twice, and could land in both splits. `origin_of(file)` names
    the option and pattern that listed it."""
    seen = {}
    for f in files:
        first = seen.setdefault(file_identity(f), f)
        if first is not f:
            raise InputError(f"input {f.url} is listed twice, by {origin_of(first)} and by {origin_of(f)}: its "
                             f"documents would be read twice (and could land in both splits). List each file "
                             f"once, or pass --dedup exact to keep each distinct text once")


def check_readable(files: list[InputFile], storage_options: dict | None = None, limit: int = 64) -> None:
    """Opens and reads a byte of the first `limit` files, through their decompressor: a bad
    compressed file, or an object store refusing access, fails before the job starts.
    (Every local file was opened when it was listed.)"""
    for f in files[:limit]:
        try:
            with open_input(f, storage_options) as fh:
                fh.read(1)
        except Exception as e:  # gzip, zstd, OS and cloud errors all mean: cannot read
            raise InputError(f"input {f.url}: cannot be read ({type(e).__name__}: {e})") from None


def read_ranges(files: list[InputFile], range_bytes: int) -> list[ReadRange]:
    """Cuts uncompressed JSONL files into ranges of about `range_bytes`; compressed files stay
    whole. Parquet files have no ranges: they are read by row group (transforms.read.parquet)."""
    ranges = []
    for f in files:
        if f.format != JSONL:
            continue
        if f.compression or f.size <= range_bytes:
            ranges.append(ReadRange(f, 0, None))
            continue
        for start in range(0, f.size, range_bytes):
            stop = start + range_bytes
            ranges.append(ReadRange(f, start, None if stop >= f.size else stop))
    return ranges


# The digest of a unit's stored bytes. Not a cryptographic hash: it detects an input edited
# in place, not an adversary (who could also edit the staging area). xxh3-128 runs at ~7 GB/s
# per core here, sha256 at 1.35 GB/s: on every byte of every run, and again on resume, that is
# ~0.7 s of CPU per 1.25 GB (issue 28; docs/performance.md). 128 bits: a changed unit passing
# unnoticed is a 2**-128 event, not CRC-32C's 2**-32. xxhash is a dependency; where it is
# missing (a machine given only some wheels), sha256 is used, and recorded as such.
try:
    import xxhash
    UNIT_DIGEST = "xxh3_128"
except ImportError:  # pragma: no cover - xxhash is installed with the package
    xxhash = None
    UNIT_DIGEST = "sha256"
UNIT_DIGESTS = ("xxh3_128", "sha256")  # what an account may hold, by name


def new_digest(name: str = UNIT_DIGEST):
    """A running digest by name (UNIT_DIGESTS); ValueError when this machine cannot make it."""
    if name == "xxh3_128" and xxhash is not None:
        return xxhash.xxh3_128()
    if name == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unit digest {name}: not available here")


class StoredBytes:
    """The stored bytes one input unit was read from: the spans read, in order (contiguous
    reads merged), and a digest of those bytes (UNIT_DIGEST), computed as they are read. The
    staging area keeps them with the unit (transforms/read/staged_reads.py), and a rerun reads
    the same spans again before it reuses the unit (`digest_of`): an input edited in place,
    even with its size and modification time restored, is then read and tokenized afresh."""

    def __init__(self):
        self.spans: list[list[int]] = []  # [offset, length], in the order they were read
        self._hash = new_digest()

    def add(self, offset: int, data: bytes) -> None:
        if not data:
            return
        self._hash.update(data)
        if self.spans and self.spans[-1][0] + self.spans[-1][1] == offset:
            self.spans[-1][1] += len(data)
        else:
            self.spans.append([offset, len(data)])

    def describe(self) -> dict:
        return {"spans": [list(s) for s in self.spans], UNIT_DIGEST: self._hash.hexdigest()}


def digest_of(f: InputFile, spans: list, storage_options: dict | None = None, name: str = UNIT_DIGEST) -> str:
    """The digest `name` (UNIT_DIGESTS) of a file's stored bytes at `spans`
    (StoredBytes.describe), read now, as listed: a file whose size or version changed since
    it was listed raises InputChanged."""
    digest = new_digest(name)
    with _open_as_listed(f, storage_options) as raw:
        for offset, length in spans:
            raw.seek(offset)
            while length > 0:
                piece = raw.read(min(length, 1 << 22))
                if not piece:
                    return ""  # shorter than when it was read: not the bytes staged
                digest.update(piece)
                length -= len(piece)
        raw.check_unchanged()
    return digest.hexdigest()


@contextlib.contextmanager
def open_input(f: InputFile, storage_options: dict | None = None, stored: StoredBytes | None = None):
    """The (decompressed) content of an input file, to use as `with open_input(f) as fh:`
    (fh is a binary file object). Leaving the `with` closes the decompressor *and* the
    storage file under it: closing a GzipFile alone would leave a gcsfs file, and its
    background prefetch task, open. Data that ends inside a compressed stream raises
    EOFError (gzip does; zstd, bz2 and xz are read by CheckedStreamReader, because
    zstandard's stream reader returns truncated data as if it were whole, and Python's bz2
    and lzma files ignore what follows the first stream when it is not another one).

    The file must still be the one listed (InputChanged otherwise): the same size and
    version when opened, reads that end where the listing says the file ends (so a file
    truncated or grown since is caught by the range that reaches its end), and, for a local
    file, the same modification time when the `with` ends. A GCS object is read at the
    generation listed, so a rewrite between two reads cannot mix two versions. `stored`:
    records the stored bytes read (StoredBytes)."""
    with _open_as_listed(f, storage_options, stored) as raw:
        if f.compression is None:
            yield raw
        elif f.compression == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                yield UpToTheBreak(fh)
        else:
            yield UpToTheBreak(CheckedStreamReader(raw, f.compression))
        raw.check_unchanged()


@contextlib.contextmanager
def _open_as_listed(f: InputFile, storage_options: dict | None, stored: StoredBytes | None = None):
    generation = f.version.split(" ", 1)[1] if f.version and f.version.startswith("generation ") else None
    url = f"{f.url}#{generation}" if generation else f.url  # gcsfs reads that generation, or fails
    try:
        opened = fsspec.open(url, "rb", **(storage_options or {}))
        raw = opened.__enter__()
    except FileNotFoundError:
        if generation is None:
            raise
        raise InputChanged(changed(f, f"generation {generation} is gone (the object was rewritten or "
                                      f"deleted)")) from None
    try:
        checked = AsListed(raw, f, stored)
        checked.check_unchanged()
        yield checked
    finally:
        opened.__exit__(None, None, None)


def changed(f: InputFile, how: str) -> str:
    return (f"input {f.url} changed while the job ran: it was listed with {f.size:,} bytes, and {how}; "
            f"nothing read from it can be trusted. Rerun once the input stops changing")


class AsListed:
    """An input file's stored bytes, checked against its listing as they are read: a read
    that reaches the end before the listed size (the file was truncated) or goes past it
    (it grew) raises InputChanged. Compressed files are checked on their compressed bytes."""

    def __init__(self, raw, f: InputFile, stored: StoredBytes | None = None):
        self._raw = raw
        self._f = f
        self._stored = stored

    def read(self, n: int = -1) -> bytes:
        return self._checked(self._raw.read, n)

    def readline(self, n: int = -1) -> bytes:
        return self._checked(self._raw.readline, n)

    def seek(self, *args) -> int:
        return self._raw.seek(*args)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return self._raw.seekable()

    def readable(self) -> bool:
        return True

    def __getattr__(self, name):  # what pyarrow or gzip may ask of a file besides (closed, ...)
        return getattr(self._raw, name)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _checked(self, read, n: int) -> bytes:
        start = self._raw.tell() if self._stored is not None else 0
        try:
            data = read(n)
        except FileNotFoundError:  # a GCS read of a generation that no longer exists
            raise InputChanged(changed(self._f, "the version listed is gone")) from None
        if self._stored is not None:
            self._stored.add(start, data)
        at = self._raw.tell()
        if at > self._f.size:
            raise InputChanged(changed(self._f, f"now holds more (read up to byte {at:,})"))
        if not data and n != 0 and at < self._f.size:
            raise InputChanged(changed(self._f, f"now ends at byte {at:,}"))
        return data

    def check_unchanged(self) -> None:
        """A local file's size and modification time, as they are now, against the listing.
        (A GCS object opened at its listed generation cannot have changed.)"""
        if not (self._f.version or "").startswith("mtime "):
            return
        st = os.fstat(self._raw.fileno())
        if st.st_size != self._f.size:
            raise InputChanged(changed(self._f, f"now holds {st.st_size:,} bytes"))
        if local_version(st) != self._f.version:
            raise InputChanged(changed(self._f, "its modification time changed since"))


class UpToTheBreak:
    """A decompressed stream that delivers the data before a break in the compressed input
    (truncation, corruption) first, and raises the error on the next read: so every whole
    line before the break is read, and the error can say where the break is."""

    STEP = 1 << 16

    def __init__(self, fh):
        self._fh = fh
        self._error = None

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        if self._error is not None:
            raise self._error
        pieces, size = [], 0
        while n < 0 or size < n:
            try:
                piece = self._fh.read(self.STEP if n < 0 else min(self.STEP, n - size))
            except COMPRESSED_DATA_ERRORS as e:
                if not pieces:
                    raise
                self._error = e
                break
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
        return b"".join(pieces)


class CorruptCompressedData(ValueError):
    """Bytes a decompressor refuses: not (or no longer) the compressed format named."""


# A new decompressor of each format, and the errors it raises on data it cannot decompress.
DECOMPRESSORS = {
    "zstd": (lambda: zstandard.ZstdDecompressor().decompressobj(), ZSTD_ERRORS),
    "bz2": (bz2.BZ2Decompressor, (OSError, ValueError)),
    "xz": (lzma.LZMADecompressor, (lzma.LZMAError,)),
}


class CheckedStreamReader:
    """A file of zstd frames, or bzip2 or xz streams (one or more, as `pzstd`, `pbzip2` and
    `xz -T` write them), decompressed. Raises EOFError when the input ends inside a frame,
    and CorruptCompressedData for bytes that do not decompress, after a stream included."""

    RAW_BLOCK = 1 << 18

    def __init__(self, raw, compression: str):
        self._raw = raw
        self._new, self._errors = DECOMPRESSORS[compression]
        self._name = compression
        self._frame = None  # the decompressor of the current frame
        self._out = b""
        self._pos = 0
        self._error = None  # met after the data now in _out: raised once that is read

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (fewer at the end of a decompressed block); b"" at the end."""
        while self._pos >= len(self._out):
            if self._error is not None:
                raise self._error
            data = self._raw.read(self.RAW_BLOCK)
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return b""
            self._out, self._pos = self._decompress(data), 0
        end = len(self._out) if n < 0 else min(len(self._out), self._pos + n)
        piece = self._out[self._pos:end] if (self._pos, end) != (0, len(self._out)) else self._out
        self._pos = end
        return piece

    def _decompress(self, data: bytes) -> bytes:
        pieces = []
        while data:
            if self._frame is None or self._frame.eof:
                self._frame = self._new()
            try:
                pieces.append(self._frame.decompress(data))
            except self._errors as e:
                self._error = CorruptCompressedData(f"not valid {self._name} data ({e})")
                break
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(pieces)


# Errors of a compressed input that is truncated or corrupt.
COMPRESSED_DATA_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, *ZSTD_ERRORS, CorruptCompressedData)


def corrupt_input_message(f: InputFile, reached: int, lines: int, error: Exception) -> str:
    """Names the file and how far it was read: the uncompressed offset and the last whole line."""
    return (f"input {f.url}: the compressed data is truncated or corrupt after uncompressed byte {reached} "
            f"(line {lines} was the last whole line): {type(error).__name__}: {error}")


# After `import fsspec`: gcsfs sessions opened while reading inputs close cleanly at exit.
close_gcs_sessions_at_exit()
