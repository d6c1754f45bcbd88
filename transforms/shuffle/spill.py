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
bytes at the same name and a reader never sees half a file. The parts carry the Sum of
what was written, and every read checks the file against it (transforms/local_files.py).

The directory is created by the launcher, named after the run, and removed by it when the
run ends, however it ends (SIGTERM and SIGINT included), or by a later run when its process
was killed outright (pipeline/local/scratch.py: an owner record in it says which process made it);
nothing else is ever deleted. Only when every worker sees the launcher's disk
(pipeline/local/environment.py): workers of Dataflow, Flink or any command that starts them
elsewhere share no disk with it, so there the ids travel in the shuffle (`spill_dir` is None).
"""
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from transforms.local_files import LocalFile, mapped, write_whole
from transforms.segments import take_documents

PREFIX = "flat-tokens-shuffle-"


@dataclass(frozen=True, eq=False)
class SpilledDocuments:
    """Where a part's documents are: document i at element `starts[i]` of the ids file
    `file` (its length is the part's `lengths[i]`)."""

    file: LocalFile
    starts: np.ndarray  # uint32 (int64 for a batch of 2**32 ids or more)

    def __eq__(self, other):
        return (isinstance(other, SpilledDocuments) and self.file == other.file
                and np.array_equal(self.starts, other.starts))

    def mapped(self, dtype: str, lengths: np.ndarray) -> np.ndarray:
        """The whole file's ids, mapped read-only, checked against the Sum written with them
        (transforms/local_files.py) and to hold every document."""
        ids = mapped(self.file, dtype, kind="shuffle spill file")
        needed = int((self.starts + lengths).max()) if lengths.size else 0
        if ids.size < needed:
            raise RuntimeError(f"shuffle spill file {self.file.path}: holds {ids.size} ids, its documents need "
                               f"{needed}")
        return ids

    def read(self, dtype: str, lengths: np.ndarray) -> np.ndarray:
        """The part's ids, documents concatenated in the part's order (a copy)."""
        return take_documents(self.mapped(dtype, lengths), self.starts, lengths)


def batch_file_name(file_key: str, first_offset: int) -> str:
    """The spill file of the batch that starts at byte `first_offset` of input `file_key`."""
    digest = hashlib.blake2b(file_key.encode("utf-8"), digest_size=8).hexdigest()
    return f"{digest}-{first_offset:016x}.ids"


def batch_file(directory: str, file_key: str, first_offset: int, ids: np.ndarray) -> LocalFile:
    """The file spill_ids writes the ids of the batch that starts at `first_offset` of `file_key` to."""
    return LocalFile.of(os.path.join(directory, batch_file_name(file_key, first_offset)), np.ascontiguousarray(ids))


def spill_ids(file: LocalFile, ids: np.ndarray) -> None:
    """Writes one batch's ids, as they are, to its batch_file."""
    write_whole(file.path, np.ascontiguousarray(ids))


@dataclass(frozen=True)
class SpilledFragment:
    """A piece of a shared chunk (transforms/write/chunk_writers.py) waiting on local disk
    for the merge step, instead of in the runner's memory: every shard end leaves up to a
    chunk of values (1 MiB of encoded tokens) that waits until the last shard is written,
    and the in-process runner held them several times over (issue 21: 85 MB, four times, at
    the peak of a 5 GB run)."""

    file: LocalFile
    dtype: str

    def values(self) -> np.ndarray:
        """The fragment's values (a copy), checked against the Sum written with them."""
        return np.array(mapped(self.file, self.dtype, kind="shared-chunk fragment"))


def spill_fragment(fragment, directory: str):
    """(chunk key, (start, values)) -> the same with the values in a file of `directory`. The
    file's name is the fragment's place (split, array, chunk, first element), which one
    writer owns: a retried bundle writes the same bytes under the same name."""
    key, (start, values) = fragment
    split, name, index = key
    values = np.ascontiguousarray(values)
    file = write_whole(os.path.join(directory, f"fragment-{split}-{name}-{index}-{start}.values"), values)
    return key, (start, SpilledFragment(file, values.dtype.str))


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
