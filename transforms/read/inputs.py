"""Finding the input files and cutting them into byte ranges that workers read in parallel.

Everything here runs when the pipeline is built (so a glob that matches nothing fails
before any worker starts) and is a pure function of the file listing.
"""
import contextlib
import gzip
import os
import posixpath
import zlib
from dataclasses import dataclass

import fsspec
import zstandard
from fsspec.core import url_to_fs

from transforms.gcs import close_gcs_sessions, close_gcs_sessions_at_exit, use_gcs_emulator_plainly  # noqa: F401

GLOB_CHARS = "*?["
COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL = "jsonl"
PARQUET = "parquet"


class InputError(ValueError):
    """A user error in the input options: the message names the option and the culprit."""


@dataclass(frozen=True)
class InputFile:
    url: str  # what workers open
    key: str  # stable identity for the shuffle: "<input index>:<path relative to the input root>"
    size: int  # bytes on storage (compressed size for compressed files)
    compression: str | None
    split: str  # "train", "validation", or "auto" (decided per document by --validation_fraction)
    format: str = JSONL  # JSONL, or PARQUET (read by row group, never by byte range)
    text_key: str | None = None  # a mixture source's own text key; None: --text_key


def input_index(file_key: str) -> int:
    """The index of the input (pattern) that listed a file, from its key."""
    return int(file_key.split(":", 1)[0])


@dataclass(frozen=True)
class ReadRange:
    """Lines whose first byte lies in [start, stop) of one file; stop None means to the end."""

    file: InputFile
    start: int
    stop: int | None


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


def format_of(path: str, option: str = "--input") -> str:
    """PARQUET for *.parquet and *.pq (any case), else JSONL."""
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return PARQUET
    if compression_of(name) and name[:name.rfind(".")].endswith(PARQUET_SUFFIXES):
        raise InputError(f"{option} {path}: a compressed Parquet file; Parquet compresses its pages "
                         f"itself, so decompress the file (or rewrite it with a Parquet codec)")
    return JSONL


def list_input_files(patterns: list[str], split: str, first_index: int = 0,
                     option: str = "--input", storage_options: dict | None = None) -> list[InputFile]:
    """Expands each pattern (a path, a glob, or a directory) into files, in a stable order."""
    files = []
    for i, pattern in enumerate(patterns):
        try:
            fs, path = url_to_fs(pattern, **(storage_options or {}))
        except (ImportError, ValueError) as e:
            raise InputError(f"{option} {pattern}: cannot open this kind of path ({e})") from None
        try:
            if any(c in path for c in GLOB_CHARS):
                root = glob_root(path)
                matches = sorted(p for p in fs.glob(path) if not fs.isdir(p))
            elif fs.isdir(path):
                root = path.rstrip("/")
                matches = sorted(p for p in fs.find(path) if not p.endswith("/"))
            elif fs.exists(path):
                root = posixpath.dirname(path)
                matches = [path]
            else:
                raise InputError(f"{option} {pattern}: no such file; check the path")
        except PermissionError as e:
            raise InputError(f"{option} {pattern}: permission denied ({e})") from None
        if not matches:
            raise InputError(f"{option} {pattern}: the pattern matches no file; check the path and the glob")
        for path in matches:
            rel = posixpath.relpath(path, root) if root else path
            info = fs.info(path)
            files.append(InputFile(
                url=fs.unstrip_protocol(path) if "://" in pattern else path,
                key=f"{first_index + i}:{rel}",
                size=int(info.get("size") or 0),
                compression=compression_of(path),
                split=split,
                format=format_of(path, option),
            ))
    return files


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
    """Opens and reads a byte of the first `limit` files: an unreadable input (permissions,
    a broken link, a bad compressed file) fails before the job starts."""
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


def open_input(f: InputFile, storage_options: dict | None = None):
    """The (decompressed) content of an input file, to use as `with open_input(f) as fh:`
    (fh is a binary file object). Leaving the `with` closes the decompressor *and* the
    storage file under it: closing a GzipFile alone would leave a gcsfs file, and its
    background prefetch task, open. Data that ends inside a compressed stream raises
    EOFError (gzip does; zstd is read by CheckedZstdReader, because zstandard's stream
    reader returns the truncated data as if it were whole)."""
    if f.compression:
        return _open_compressed(f, storage_options)
    return fsspec.open(f.url, "rb", **(storage_options or {}))


@contextlib.contextmanager
def _open_compressed(f: InputFile, storage_options: dict | None):
    if f.compression == "zstd":
        with fsspec.open(f.url, "rb", **(storage_options or {})) as raw:
            yield UpToTheBreak(CheckedZstdReader(raw))
    else:
        with fsspec.open(f.url, "rb", compression=f.compression, **(storage_options or {})) as fh:
            yield UpToTheBreak(fh)


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


class CheckedZstdReader:
    """Zstandard frames (one or more, as `zstd` and `pzstd` write them), decompressed; raises
    EOFError when the input ends inside a frame."""

    RAW_BLOCK = 1 << 18

    def __init__(self, raw):
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = None  # the decompressor of the current frame
        self._out = b""
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (fewer at the end of a decompressed block); b"" at the end."""
        while self._pos >= len(self._out):
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
                self._frame = self._dctx.decompressobj()
            pieces.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(pieces)


# Errors of a compressed input that is truncated or corrupt.
COMPRESSED_DATA_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)


def corrupt_input_message(f: InputFile, reached: int, lines: int, error: Exception) -> str:
    """Names the file and how far it was read: the uncompressed offset and the last whole line."""
    return (f"input {f.url}: the compressed data is truncated or corrupt after uncompressed byte {reached} "
            f"(line {lines} was the last whole line): {type(error).__name__}: {error}")


# After `import fsspec`: gcsfs sessions opened while reading inputs close cleanly at exit.
close_gcs_sessions_at_exit()
