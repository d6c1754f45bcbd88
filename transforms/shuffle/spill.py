"""Shard parts' token ids, and the pieces of shared chunks, on local disk instead of in the
runner's memory (local runners).

The in-process runner holds every element that crosses a GroupByKey in memory until the
group is read, and copies it on the way several times: measured on the 250 MB benchmark,
three copies of the whole compressed shuffle at the peak, five and a half at 1.25 GB
(3.1 GB of a 3.3 GB peak; docs/performance.md). So on local runners each batch writes its
ids to one file, as they are, and its shard parts carry only their documents' metadata and
where each document starts in that file; a shard's sort copies each part's documents out
of its (mapped) file. The ids are written uncompressed: LZ4 would save disk but cost more
CPU than the page cache does. Writing the batch whole, instead of each part's ids
gathered together, saves a copy of every id on the stage that tokenizes.

Retries: a file's name is a pure function of its batch (input file key and first byte
offset), its content a pure function of the batch's documents, and it is written under a
temporary name and renamed into place, so a retried or duplicated bundle puts the same
bytes at the same name and a reader never sees half a file.

The directory is created by the launcher, named after the run, and removed by it when the
run ends, however it ends (SIGTERM and SIGINT included), or by a later run when its process
was killed outright (pipeline/local/scratch.py: an owner record in it says which process made it);
nothing else is ever deleted. Only when every worker sees the launcher's disk
(pipeline/local/environment.py): workers of Dataflow, Flink or any command that starts them
elsewhere share no disk with it, so there the ids travel in the shuffle (`spill_dir` is None).
"""
import hashlib
import mmap
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass

import numpy as np

from transforms.segments import take_documents

PREFIX = "flat-tokens-shuffle-"


@dataclass(frozen=True, eq=False)
class SpilledDocuments:
    """Where a part's documents are: document i at element `starts[i]` of the ids file
    `path` (its length is the part's `lengths[i]`)."""

    path: str
    starts: np.ndarray  # uint32 (int64 for a batch of 2**32 ids or more)

    def __eq__(self, other):
        return (isinstance(other, SpilledDocuments) and self.path == other.path
                and np.array_equal(self.starts, other.starts))

    def mapped(self, dtype: str, lengths: np.ndarray) -> np.ndarray:
        """The whole file's ids, mapped read-only; checked to hold every document."""
        needed = int((self.starts + lengths).max()) if lengths.size else 0
        size = os.path.getsize(self.path)  # FileNotFoundError names the path
        itemsize = np.dtype(dtype).itemsize
        if size < needed * itemsize:
            raise RuntimeError(f"shuffle spill file {self.path}: expected at least {needed * itemsize} bytes, "
                               f"found {size}; was the run's temporary directory changed while it ran?")
        if size == 0:
            return np.empty(0, dtype=dtype)
        with open(self.path, "rb") as f:
            # A plain array over the mapping (np.memmap's slices are slower to make); the
            # mapping lives as long as any view of it.
            return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=dtype)

    def read(self, dtype: str, lengths: np.ndarray) -> np.ndarray:
        """The part's ids, documents concatenated in the part's order (a copy)."""
        return take_documents(self.mapped(dtype, lengths), self.starts, lengths)


def batch_file_name(file_key: str, first_offset: int) -> str:
    """The spill file of the batch that starts at byte `first_offset` of input `file_key`."""
    digest = hashlib.blake2b(file_key.encode("utf-8"), digest_size=8).hexdigest()
    return f"{digest}-{first_offset:016x}.ids"


def batch_file_path(directory: str, file_key: str, first_offset: int) -> str:
    """Where spill_ids puts the ids of the batch that starts at `first_offset` of `file_key`."""
    return os.path.join(directory, batch_file_name(file_key, first_offset))


def spill_ids(directory: str, file_key: str, first_offset: int, ids: np.ndarray) -> None:
    """Writes one batch's ids, as they are, to batch_file_path's file."""
    _write_whole(batch_file_path(directory, file_key, first_offset), np.ascontiguousarray(ids))


def _write_whole(path: str, values: np.ndarray) -> None:
    """Under a temporary name, then renamed into place: a reader never sees half a file."""
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as f:
        f.write(values.data)
    os.replace(temporary, path)


@dataclass(frozen=True)
class SpilledFragment:
    """A piece of a shared chunk (transforms/write/chunk_writers.py) waiting on local disk
    for the merge step, instead of in the runner's memory: every shard end leaves up to a
    chunk of values (1 MiB of encoded tokens) that waits until the last shard is written,
    and the in-process runner held them several times over (issue 21: 85 MB, four times, at
    the peak of a 5 GB run)."""

    path: str
    dtype: str
    size: int

    def values(self) -> np.ndarray:
        values = np.fromfile(self.path, dtype=self.dtype)  # FileNotFoundError names the path
        if values.size != self.size:
            raise RuntimeError(f"shared-chunk fragment {self.path}: {values.size} values, expected {self.size}; "
                               f"was the run's temporary directory changed while it ran?")
        return values


def spill_fragment(fragment, directory: str):
    """(chunk key, (start, values)) -> the same with the values in a file of `directory`. The
    file's name is the fragment's place (split, array, chunk, first element), which one
    writer owns: a retried bundle writes the same bytes under the same name."""
    key, (start, values) = fragment
    split, name, index = key
    values = np.ascontiguousarray(values)
    path = os.path.join(directory, f"fragment-{split}-{name}-{index}-{start}.values")
    _write_whole(path, values)
    return key, (start, SpilledFragment(path, values.dtype.str, int(values.size)))


def fragment_values(values) -> np.ndarray:
    """A fragment's values, whether they travelled as they are or were spilled."""
    return values.values() if isinstance(values, SpilledFragment) else values


def make_directory(run_id: str, root: str | None = None) -> str:
    """A new directory for one run's spill files, under `root` (default: the system's temporary directory)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-", dir=root)


def remove_directory(path: str) -> None:
    """Removes a directory made by make_directory (and only such a directory)."""
    if not os.path.basename(path.rstrip(os.sep)).startswith(PREFIX):
        raise ValueError(f"{path} is not a shuffle spill directory; not removing it")
    shutil.rmtree(path, ignore_errors=True)
