"""Shard parts' token ids on local disk instead of in the runner's memory (local runners).

The in-process runner holds every element that crosses a GroupByKey in memory until the
group is read, and copies it on the way several times: measured on the 250 MB benchmark,
three copies of the whole compressed shuffle at the peak, five and a half at 1.25 GB
(3.1 GB of a 3.3 GB peak; docs/performance.md). So on local runners each batch writes the
packed ids of all its shard parts to one file, and only the parts' metadata and a small
reference to their bytes cross the GroupByKey; the shard's sort reads them back. The ids
are written uncompressed: LZ4 would save disk but cost more CPU than the page cache does.

Retries: a file's name is a pure function of its batch (input file key and first byte
offset), its content a pure function of the batch's documents, and it is written under a
temporary name and renamed into place, so a retried or duplicated bundle puts the same
bytes at the same name and a reader never sees half a file.

The directory is created by the launcher, named after the run, and removed by it when the
run ends; nothing else is ever deleted. Workers of remote runners (Dataflow, Flink) share
no disk, so there the ids travel in the shuffle as before (`spill_dir` is None).
"""
import hashlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, replace

PREFIX = "flat-tokens-shuffle-"


@dataclass(frozen=True)
class SpilledBytes:
    """Where a part's packed ids are: `size` bytes at `start` of the file `path`."""

    path: str
    start: int
    size: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            data = f.read(self.size)
        if len(data) != self.size:
            raise RuntimeError(f"shuffle spill file {self.path}: expected {self.size} bytes at {self.start}, "
                               f"found {len(data)}; was the run's temporary directory removed while it ran?")
        return data


def batch_file_name(file_key: str, first_offset: int) -> str:
    """The spill file of the batch that starts at byte `first_offset` of input `file_key`."""
    digest = hashlib.blake2b(file_key.encode("utf-8"), digest_size=8).hexdigest()
    return f"{digest}-{first_offset:016x}.ids"


def spill_parts(directory: str, file_key: str, first_offset: int, keyed_parts: list) -> list:
    """Writes the ids of one batch's parts to one file, uncompressed; returns the parts
    with references in place of their ids."""
    path = os.path.join(directory, batch_file_name(file_key, first_offset))
    spilled, position = [], 0
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as f:
        for key, part in keyed_parts:
            ids = part.ids()
            f.write(ids.data)
            spilled.append((key, replace(part, raw_ids=None, spilled=SpilledBytes(path, position, ids.nbytes))))
            position += ids.nbytes
    os.replace(temporary, path)
    return spilled


def make_directory(run_id: str, root: str | None = None) -> str:
    """A new directory for one run's spill files, under `root` (default: the system's temporary directory)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-", dir=root)


def remove_directory(path: str) -> None:
    """Removes a directory made by make_directory (and only such a directory)."""
    if not os.path.basename(path.rstrip(os.sep)).startswith(PREFIX):
        raise ValueError(f"{path} is not a shuffle spill directory; not removing it")
    shutil.rmtree(path, ignore_errors=True)
