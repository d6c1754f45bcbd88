"""Finding the input files and cutting them into byte ranges that workers read in parallel.

Everything here runs when the pipeline is built (so a glob that matches nothing fails
before any worker starts) and is a pure function of the file listing.
"""
import asyncio
import atexit
import os
import posixpath
import sys
import weakref
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


def open_input(f: InputFile, storage_options: dict | None = None) -> fsspec.core.OpenFile:
    """The (decompressed) content of an input file, to use as `with open_input(f) as fh:`
    (fh is a binary file object). Leaving the `with` closes the decompressor *and* the
    storage file under it: closing a GzipFile alone would leave a gcsfs file, and its
    background prefetch task, open."""
    return fsspec.open(f.url, "rb", compression=f.compression, **(storage_options or {}))


# ---------------------------------------------------------------------------------------------
# A local GCS emulator


def use_gcs_emulator_plainly() -> bool:
    """When STORAGE_EMULATOR_HOST names a GCS emulator (fake-gcs-server, say), talks to it as
    what it is, quietly: anonymously (it checks no credentials, and looking for some costs
    time), through gcsfs's core filesystem. gcsfs's experimental zonal/HNS filesystem, its
    default, first asks each bucket's layout over gRPC, which an emulator does not serve:
    that printed "Could not determine bucket type ... default credentials were not found"
    for every file opened (or, with credentials, stalled a minute per bucket).

    Settings made explicitly win: GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT in the environment, a
    token in fsspec's configuration or in storage_options. Runs when this module is imported,
    before gcsfs is (gcsfs picks its filesystem class at import); worker processes inherit
    the environment variable, and import this module too."""
    if os.environ.get("STORAGE_EMULATOR_HOST", "") in ("", "default"):
        return False
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    fsspec.config.conf.setdefault("gs", {}).setdefault("token", "anon")
    return True


use_gcs_emulator_plainly()


# ---------------------------------------------------------------------------------------------
# gcsfs sessions at interpreter exit


def close_gcs_sessions() -> None:
    """Closes the HTTP session of every gcsfs filesystem this process created, on the event
    loop that owns it: fsspec's I/O loop for the synchronous instances, zarr's loop for the
    `asynchronous=True` ones zarr's FsspecStore uses. Left to gcsfs's garbage-collection
    finalizer, these sessions are closed on the wrong loop at exit, which prints tracebacks
    ("attached to a different loop", "Unclosed client session")."""
    gcsfs_core = sys.modules.get("gcsfs.core")
    if gcsfs_core is None:
        return
    classes, seen = [gcsfs_core.GCSFileSystem], []
    while classes:  # the class and its subclasses (gcsfs's ExtendedGcsFileSystem): one cache each
        cls = classes.pop()
        seen.append(cls)
        classes += cls.__subclasses__()
    for cls in seen:
        for fs in list(vars(cls).get("_cache", {}).values()):
            _close_session(getattr(fs, "_session", None))


def _close_session(session) -> None:
    if session is None or session.closed:
        return
    loop = getattr(session, "_loop", None)
    try:
        if loop is not None and loop.is_running() and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=5)
        else:  # the loop is gone: drop the connections without it (what gcsfs falls back to)
            connector = getattr(session, "_connector", None)
            if connector is not None:
                connector._close()
    except Exception:  # noqa: BLE001 - best effort at exit; never mask the exit status
        pass


_exit_hook_registered = False


def close_gcs_sessions_at_exit() -> None:
    """Makes close_gcs_sessions run at exit before the hooks registered so far, including
    zarr's (which stops zarr's loop) and weakref's (which runs gcsfs's finalizers): atexit
    runs hooks last in, first out. Modules that import zarr call this after importing it."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        # weakref registers its atexit hook on first use, which may come after ours (when
        # the first session is opened): use it now, so that its hook runs after ours.
        weakref.finalize(close_gcs_sessions, int)
        _exit_hook_registered = True
    atexit.unregister(close_gcs_sessions)
    atexit.register(close_gcs_sessions)


close_gcs_sessions_at_exit()
