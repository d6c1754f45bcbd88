"""A local run's temporary directories: removed when the run ends, however it ends, and,
when its process was killed outright (SIGKILL, a lost machine), by a later run.

A local run keeps its progress totals in `flat-tokens-progress-*` (with Beam's own
`beam-pipeline-temp*` directory inside it: the pipeline is built with the temporary
directory pointed there) under the system's temporary directory, and its shuffle spill in
`flat-tokens-shuffle-<run id>-*` (transforms/shuffle/spill.py) under `--temp_location` or
the same place. Each of them holds an owner record (`.flat-tokens-owner`, the process
that made it: transforms/processes.py). A later run removes a directory there only when its
name is one of these and its owner record says that process has ended on this machine:
never another user's or another tool's directory, never a live run's, never one without a
record (an older version's, or one being made right now).
"""
import contextlib
import json
import os
import shutil
import tempfile

from transforms import processes
from transforms.shuffle import spill

OWNER = ".flat-tokens-owner"  # not *.json: the progress directory's *.json files are progress totals
PROGRESS_PREFIX = "flat-tokens-progress-"
PREFIXES = (PROGRESS_PREFIX, spill.PREFIX)


def mark(path: str) -> str:
    """Writes the owner record of a directory this process made; returns the path."""
    with open(os.path.join(path, OWNER), "w") as f:
        json.dump(processes.this_process(), f)
    return path


def make_progress_directory() -> str:
    return mark(tempfile.mkdtemp(prefix=PROGRESS_PREFIX))


def make_spill_directory(run_id: str, root: str | None) -> str:
    return mark(spill.make_directory(run_id, root))


def remove(path: str) -> None:
    """Removes one of this run's directories. Worker threads or processes may still be
    writing into it as the run is stopped: a file created during the removal is removed by
    the next attempt."""
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return


@contextlib.contextmanager
def temporary_files_in(directory: str | None):
    """Python's (and so Beam's) temporary files go to `directory` while the block runs."""
    if directory is None:
        yield
        return
    saved = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        yield
    finally:
        tempfile.tempdir = saved


def remove_leftovers(roots) -> list[str]:
    """Removes the temporary directories that runs of this tool left under `roots` when their
    process ended without removing them; returns their paths."""
    removed = []
    for root in dict.fromkeys(r or tempfile.gettempdir() for r in roots):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if not name.startswith(PREFIXES) or os.path.islink(path) or not os.path.isdir(path):
                continue
            try:
                with open(os.path.join(path, OWNER)) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                continue
            if processes.certainly_dead(owner):
                remove(path)
                removed.append(path)
    return removed
