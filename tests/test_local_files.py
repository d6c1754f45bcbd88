"""Local files a run writes for itself and reads back (transforms/local_files.py): every read
is checked against the Sum written with the file, and a process remembers a check only
while `os.stat` says the file is as it was."""
import os
import re
import time

import numpy as np
import pytest

from flat_tokens.format.checksums import Damaged, Sum
from transforms import local_files
from transforms.local_files import LocalFile, mapped, write_whole


def flip(path, at: int) -> None:
    with open(path, "r+b") as f:  # in place: the same inode, as a disk or another process would
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x20]))


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_file_reads_back_as_written_and_names_itself_when_it_is_not(tmp_path):
    values = np.arange(10_000, dtype=np.uint32)
    file = write_whole(str(tmp_path / "a.ids"), values)
    assert file == LocalFile(str(tmp_path / "a.ids"), Sum.of(values)) and os.listdir(tmp_path) == ["a.ids"]
    assert np.array_equal(mapped(file, "uint32", 10_000), values)
    assert np.array_equal(mapped(file, "uint16"), values.view(np.uint16))  # as many as were written
    with pytest.raises(RuntimeError, match="asked for 9999 values of 4 bytes, 40000 bytes were written"):
        mapped(file, "uint32", 9_999)
    flip(file.path, 12_345)
    with pytest.raises(Damaged, match=f"spill file {re.escape(file.path)}: damaged: its CRC-32C"):
        mapped(file, "uint32", kind="spill file")
    with open(file.path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(Damaged, match=f"{re.escape(file.path)}: damaged: 40001 bytes, 40000 were written"):
        mapped(file, "uint32")
    os.remove(file.path)
    with pytest.raises(FileNotFoundError, match="a.ids"):
        mapped(file, "uint32")
    empty = write_whole(str(tmp_path / "empty"), np.empty(0, np.uint16))
    assert mapped(empty, "uint16", 0).size == 0


def later(path) -> None:
    """Moves the file's modification time a second on, as a write a tick later would."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def remembered(path) -> bool:
    return any(key[0] == path for key in local_files._checked)


def test_a_remembered_check_holds_only_while_the_file_is_as_it_was(tmp_path, monkeypatch):
    """A process checks a file once and remembers it by its stat: a file changed in place,
    or another put in its place, is checked again."""
    local_files.forget_checked()
    monkeypatch.setattr(local_files, "_SETTLED_NS", 0)  # remember files however new
    values = np.random.default_rng(0).integers(0, 2**16, 50_000).astype(np.uint16)
    settled = write_whole(str(tmp_path / "settled"), values)
    assert np.array_equal(mapped(settled, "uint16"), values) and remembered(settled.path)
    flip(settled.path, 777)
    later(settled.path)  # the write's time, past the file system's granularity (which _SETTLED_NS waits out)
    with pytest.raises(Damaged, match="settled: damaged"):
        mapped(settled, "uint16")
    flip(settled.path, 777)
    later(settled.path)
    assert np.array_equal(mapped(settled, "uint16"), values) and remembered(settled.path)
    other = write_whole(str(tmp_path / "other"), values[::-1].copy())
    os.replace(other.path, settled.path)  # another file, of the same size, in its place: another inode
    with pytest.raises(Damaged, match="settled: damaged"):
        mapped(settled, "uint16")


def test_a_file_written_just_now_is_checked_at_every_read(tmp_path):
    """Its times may not show a write within the same clock tick, so its check is not remembered."""
    local_files.forget_checked()
    values = np.arange(50_000, dtype=np.uint16)
    fresh = write_whole(str(tmp_path / "fresh"), values)
    assert np.array_equal(mapped(fresh, "uint16"), values) and not remembered(fresh.path)
    flip(fresh.path, 5)  # at once: perhaps within the tick of the write
    with pytest.raises(Damaged, match="fresh: damaged"):
        mapped(fresh, "uint16")
    flip(fresh.path, 5)
    age(fresh.path, 60)  # an old modification time is not enough: its change time is now
    assert np.array_equal(mapped(fresh, "uint16"), values) and not remembered(fresh.path)


def _staged(tmp_path, data):
    from transforms import staging
    staging.StagingArea(str(tmp_path / "out")).put("units/u/one", data)


def _created(tmp_path, data):
    import fsspec

    from transforms import create_only
    create_only.put_new(fsspec.filesystem("file"), str(tmp_path / "out" / "one"), data)


@pytest.mark.parametrize("write", [
    lambda tmp_path, data: write_whole(str(tmp_path / "out" / "one"), data), _staged, _created],
    ids=["spill file", "staged file", "create-only object"])
def test_a_write_the_disk_refuses_names_its_file_and_leaves_no_part_of_it(tmp_path, write):
    """A full disk (here a file size limit, EFBIG, which fails a write as ENOSPC does): the
    error names the file (a write's own names none: the run said only "No space left on
    device [while running 'Tokenize']"), and no temporary file is left to fill the disk."""
    import errno
    import resource
    import signal

    (tmp_path / "out").mkdir()
    data = np.zeros(1 << 16, dtype=np.uint8).tobytes()
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel stops the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
    try:
        with pytest.raises(OSError) as e:
            write(tmp_path, data)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert e.value.errno == errno.EFBIG and "one" in str(e.value) and str(tmp_path) in str(e.value)
    left = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "out") for f in files]
    assert left == []
