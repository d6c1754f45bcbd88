"""Finding the input files and cutting them into byte ranges that workers read in parallel.

Everything here runs when the pipeline is built (so a glob that matches nothing fails
before any worker starts) and is a pure function of the file listing.
"""
import posixpath
from dataclasses import dataclass

import fsspec
from fsspec.core import url_to_fs

GLOB_CHARS = "*?["
COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class InputError(ValueError):
    """A user error in the input options: the message names the option and the culprit."""


@dataclass(frozen=True)
class InputFile:
    url: str  # what workers open
    key: str  # stable identity for the shuffle: "<input index>:<path relative to the input root>"
    size: int  # bytes on storage (compressed size for compressed files)
    compression: str | None
    split: str  # "train", "validation", or "auto" (decided per document by --validation_fraction)


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
            ))
    return files


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
    """Cuts uncompressed files into ranges of about `range_bytes`; compressed files stay whole."""
    ranges = []
    for f in files:
        if f.compression or f.size <= range_bytes:
            ranges.append(ReadRange(f, 0, None))
            continue
        for start in range(0, f.size, range_bytes):
            stop = start + range_bytes
            ranges.append(ReadRange(f, start, None if stop >= f.size else stop))
    return ranges


def open_input(f: InputFile, storage_options: dict | None = None):
    """A binary file object over the (decompressed) content of an input file."""
    return fsspec.open(f.url, "rb", compression=f.compression, **(storage_options or {})).open()
