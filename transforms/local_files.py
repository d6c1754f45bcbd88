"""Files a local run writes for itself and reads back later in the same run: the shuffle's
spill files, near dedup's signature files, node tables and band hashes, and (mapped in
place) a local staging area's ids and signatures.

Each is named by a LocalFile, which carries the Sum (size, CRC-32C) of what was written
to it, and is only ever read through `mapped`, which checks the file against that Sum: a
file cut short, a flipped bit, or another run's file put in its place is Damaged, naming
the file, never read as it is. A disk, a full /tmp or a user's cleaning job can do each.

The check reads the whole file. A batch's file is read by every shard its documents fall
into (20 at the 1.25 GB benchmark), and near dedup's node reads touch the same signature
files from every pair bucket, so a process checks a file once and remembers it by what
`os.stat` says of it (device, inode, size, modification and change times): a file replaced
or written to since is checked again (a file written in the last 2 s is not remembered:
its times may not show a write in the same clock tick). The memory is a cache, never a
source of truth: a process without it (another worker, a retried bundle) checks the file
itself.

Writes go under a temporary name and are renamed into place: a reader never sees half a
file, and a retried bundle puts the same bytes at the same name.
"""
from __future__ import annotations

import mmap
import os
import threading
import time
import uuid
from typing import NamedTuple

import numpy as np

from flat_tokens.format.checksums import Damaged, Sum, crc32c


class LocalFile(NamedTuple):
    """A local file this run wrote, and the Sum of what it wrote there."""

    path: str
    sum: Sum

    @classmethod
    def of(cls, path: str, values) -> "LocalFile":
        """The file at `path` once `values` (a contiguous array or buffer) are written there."""
        return cls(path, Sum.of(values))


def write_whole(path: str, values) -> LocalFile:
    """Writes `values` (a contiguous array or buffer) to `path`, under a temporary name first."""
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "wb") as f:
            f.write(values.data if isinstance(values, np.ndarray) else values)
    except OSError as e:  # a full disk: say which file (a write's error names none), and leave no part of it
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise OSError(e.errno, e.strerror, path) from None
    os.replace(temporary, path)
    return LocalFile.of(path, values)


def mapped(file: LocalFile, dtype, n: int | None = None, kind: str = "local file") -> np.ndarray:
    """The file's values (`n` of them, or as many as its Sum holds), mapped read-only, once
    the file is checked to be what was written: Damaged (naming it as `kind` and path) when
    it is not; RuntimeError when `n` values are not what was written there."""
    dtype = np.dtype(dtype)
    path, want = file
    if n is not None and n * dtype.itemsize != want.size:
        raise RuntimeError(f"{kind} {path}: asked for {n} values of {dtype.itemsize} bytes, "
                           f"{want.size} bytes were written")
    if want.size % dtype.itemsize:
        raise RuntimeError(f"{kind} {path}: {want.size} bytes were written, not whole values of {dtype.itemsize}")
    with open(path, "rb") as f:  # FileNotFoundError names the path
        stat = os.fstat(f.fileno())
        if stat.st_size != want.size:
            raise Damaged(f"{kind} {path}: damaged: {stat.st_size} bytes, {want.size} were written ({_CHANGED})")
        if want.size == 0:
            return np.empty(0, dtype=dtype)
        # A plain array over the mapping; the mapping lives as long as any view of it.
        values = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=dtype)
    _check(path, stat, values, want, kind)
    return values


_CHANGED = "changed on disk since this run wrote it"
_checked: dict[tuple, Sum] = {}
_checked_lock = threading.Lock()
_REMEMBERED = 1 << 16  # files a process remembers as checked; past that it forgets them all
# A file's times have the file system's granularity (a few milliseconds here, 2 s on some):
# one changed within that of its last write keeps its times, so a file is remembered only
# once they are older than this (git's "racily clean" entries, the same problem).
_SETTLED_NS = 2_000_000_000


def _check(path: str, stat: os.stat_result, values: np.ndarray, want: Sum, kind: str) -> None:
    key = (path, stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if _checked.get(key) == want:
        return
    got = Sum(values.nbytes, crc32c(values))
    if got != want:
        raise Damaged(f"{kind} {path}: damaged: its CRC-32C is {got.crc32c:08x}, {want.crc32c:08x} was written "
                      f"({_CHANGED})")
    if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) < _SETTLED_NS:
        return  # a write in the same clock tick would leave these times as they are: not remembered
    with _checked_lock:
        if len(_checked) >= _REMEMBERED:
            _checked.clear()
        _checked[key] = want


def forget_checked() -> None:
    """Forgets which files this process checked (tests: the next read checks again)."""
    with _checked_lock:
        _checked.clear()
