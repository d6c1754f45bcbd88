"""Writes that never replace an object: the storage half of fencing.

A run that lost the output (another run took it over while one of its writes was stalled:
a stopped process, a Dataflow "zombie" worker) must not change what the new owner wrote.
Its claim check cannot stop a write already past it, so every chunk, metadata and staged
record is written *create-only*: locally under a temporary name, then hard-linked into place
(`link` fails when the name exists, and a reader never sees half an object); on GCS with
`ifGenerationMatch=0` (gcsfs's `pipe_file(mode="create")`). So a stalled write can only
create an object that is absent, never replace one.

What a put finds decides what it did:

* nothing there: it *created* the object (recorded, with its identity, in the write's
  `Ledger`);
* the same bytes: *found* (a Beam retry of this write, or an earlier attempt of the same
  job, or another run of the same job): nothing to write. The write's owner makes found
  objects its own once it has confirmed its claim (`adopt`), so that no other writer can
  take them back (below);
* other bytes: a *conflict*. Nothing is changed; the put raises ObjectConflict.

A run that finds, after its write, that it lost the output while the newcomer went on
without waiting for it (transforms/write/ownership.py) *takes back* what that write created,
and only that: an object is deleted only while it is still the one this write created (its
identity: the GCS generation, or the local inode and modification time; GCS checks the
generation itself, `ifGenerationMatch`). An object that another writer made its own since
has another identity and stays.

The identity of an object is what tells two writes of the same bytes apart: GCS's
generation, or, locally, the inode number with the modification time and size (an inode
number is reused once its file is deleted; the time tells the two apart).
"""
import asyncio
import errno
import json
import os
import posixpath
import re
import threading
import uuid

import fsspec.asyn

from flat_tokens.format.object_trees import identity  # what tells two writes of one path apart
from flat_tokens.format import storage_faults

# The suffix of a local object being written: `<name>.<32 hex>.partial`, the names zarr's own
# local store uses, which the ownership rules recognise as this tool's
# (transforms/write/ownership.py, zarr_partial_of).
PARTIAL = ".partial"
_PARTIAL_NAME = re.compile(r"^.+\.[0-9a-f]{32}\.partial$")
DELETES_AT_ONCE = 100  # concurrent conditional deletes on GCS (its batch API takes 100 too)


class ObjectConflict(RuntimeError):
    """Another object (other bytes) is already where this write puts its own."""

    def __init__(self, path: str):
        super().__init__(f"{path}: another object (other bytes) is already there; this write did not replace it")
        self.path = path


def is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


class Ledger:
    """What one fenced write did to storage: the objects it created (and their identities),
    those it found in place with its bytes, the objects it found taken by other bytes, and
    the array metadata it wrote into (whose identity tells, afterwards, whether those arrays
    are still the ones it wrote into). Writes on a thread pool add to it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.created: dict[str, tuple] = {}  # path -> identity
        self.found: dict[str, tuple] = {}  # path -> (identity when found, the bytes): to adopt
        self.conflicts: list[str] = []
        self.arrays: dict[str, tuple | None] = {}  # metadata path -> identity when the writer opened it

    def created_object(self, path: str, ident: tuple) -> None:
        with self._lock:
            self.created[path] = ident
            self.found.pop(path, None)

    def found_object(self, path: str, ident: tuple, data: bytes) -> None:
        with self._lock:
            if path not in self.created:  # else a retry within this write found its own object
                self.found[path] = (ident, data)

    def conflict(self, path: str) -> None:
        with self._lock:
            self.conflicts.append(path)

    def wrote_into(self, metadata_path: str, ident: tuple | None) -> None:
        with self._lock:
            self.arrays.setdefault(metadata_path, ident)

    def arrays_unchanged(self, fs) -> bool:
        """Whether every array this write wrote into is still the one it opened (kept by whoever
        owns the output now: the same job, so the same bytes), rather than replaced."""
        return bool(self.arrays) and all(ident is not None and identity(fs, path) == ident
                                         for path, ident in self.arrays.items())


def _read(fs, path: str, expected: bytes | None = None) -> bytes | None:
    """The object's bytes, or None when there is none. Given the `expected` bytes, a read that
    differs is made again (storage_faults: a body cut short in transit is no conflict); only
    other bytes on a fresh read are."""
    if is_local(fs):
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    fs.invalidate_cache(path)
    judge = None if expected is None else (lambda there: None if there == expected else "other bytes")
    try:
        return storage_faults.cat_file(fs, path, path, judge)
    except FileNotFoundError:
        return None


def put_new(fs, path: str, data, ledger: Ledger | None = None) -> str:
    """Creates the object at `path` holding `data`, never replacing one. Returns "created",
    or "found" when the same bytes are there already; raises ObjectConflict when other bytes
    are (and records it in `ledger`)."""
    data = bytes(data) if not isinstance(data, bytes) else data
    for _ in range(5):  # an object taken back between the failed create and the read: create again
        created = _create_local(path, data) if is_local(fs) else _create_remote(fs, path, data)
        if created is not None:
            if ledger is not None:
                ledger.created_object(path, created)
            return "created"
        ident = identity(fs, path)
        there = _read(fs, path, data)
        if there is None:
            continue
        if there != data:
            if ledger is not None:
                ledger.conflict(path)
            raise ObjectConflict(path)
        if ident is not None and identity(fs, path) == ident:
            if ledger is not None:
                ledger.found_object(path, ident, data)
            return "found"
    raise ObjectConflict(path)


def remove_partials(fs, directory: str) -> int:
    """Deletes the temporary files of local writes under `directory` that never landed (their
    process was killed between writing and linking): the commit calls it once every write
    of its run has landed. The names are unique to each write, so no other write can have
    made them since. Object stores have none (an upload is whole). Returns the count."""
    if not is_local(fs):
        return 0
    removed = 0
    for root, _, files in os.walk(directory):
        for name in files:
            if _PARTIAL_NAME.match(name):
                try:
                    os.unlink(os.path.join(root, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed


def _temporary(path: str) -> str:
    return f"{path}.{uuid.uuid4().hex}{PARTIAL}"


def _write_temporary(path: str, data: bytes) -> str:
    temporary = _temporary(path)
    for attempt in range(3):
        # Inside the loop: a writer taking back its object removes folders it left empty.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(temporary, "wb") as f:
                f.write(data)
            return temporary
        except FileNotFoundError:
            if attempt == 2:
                raise
        except OSError as e:  # a full disk: say which object (a write's error names none), and leave no part of it
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise OSError(e.errno, e.strerror, path) from None
    return temporary


def _create_local(path: str, data: bytes) -> tuple | None:
    """The created object's identity, or None when the name is taken."""
    temporary = _write_temporary(path, data)
    try:
        st = os.stat(temporary)
        os.link(temporary, path)  # atomic, and never replaces: EEXIST when the name is taken
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except FileExistsError:
        return None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        return _create_exclusively(path, data)  # a filesystem without hard links
    finally:
        os.unlink(temporary)


def _create_exclusively(path: str, data: bytes) -> tuple | None:
    """O_EXCL: never replaces either, but a reader may see the object before it is whole."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        st = os.fstat(f.fileno())
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _create_remote(fs, path: str, data: bytes) -> tuple | None:
    try:
        response = fs.pipe_file(path, data, mode="create")  # GCS: ifGenerationMatch=0
    except FileExistsError:
        return None
    generation = response.get("generation") if isinstance(response, dict) else None
    return ("generation", str(generation)) if generation else identity(fs, path)


def adopt(fs, path: str, data: bytes, found: tuple, ledger: Ledger) -> None:
    """Makes an object found with this write's bytes (`data`) this write's own: rewritten as a
    new object with the same bytes while it is still the one found (`found`, its identity
    then), so that the writer that created it can no longer take it back. Called by a writer
    that has just confirmed it owns the output. An object taken back meanwhile is created
    again; other bytes there since are a conflict (ObjectConflict)."""
    for _ in range(5):
        rewritten = replace_if(fs, path, data, found)
        if rewritten is not None:
            ledger.created_object(path, rewritten)
            return
        if put_new(fs, path, data, ledger) == "created":
            return
        found = ledger.found[path][0]
    raise ObjectConflict(path)


def replace_if(fs, path: str, data: bytes, found: tuple) -> tuple | None:
    """Replaces the object at `path` with `data` if it is still `found` (its identity when it was
    read); the new identity, or None when it is not (another write came in between). The one
    replacing write: adopt's, and `flat-tokens index`'s of the manifest and root attributes."""
    if is_local(fs):
        temporary = _write_temporary(path, data)
        try:
            st = os.stat(temporary)
            if identity(fs, path) != found:
                return None
            # Not atomic with the check above; what could come in between is only the same bytes
            # (every other write is create-only) or nothing (taken back), never another run's data.
            os.replace(temporary, path)
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    if found[0] != "generation":
        return found  # a store without generations: nothing can take it back by identity either
    bucket, key, _ = fs.split_path(path)
    document = json.dumps({"name": key}).encode()
    body = (b"--==0==\nContent-Type: application/json; charset=UTF-8\n\n" + document
            + b"\n--==0==\nContent-Type: application/octet-stream\n\n" + data + b"\n--==0==--")
    try:  # one multipart upload, valid only while the object is the generation found
        response = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o", uploadType="multipart",
                           headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body,
                           json_out=True, ifGenerationMatch=found[1])
    except (FileExistsError, FileNotFoundError):  # 412: no longer that generation (or gone)
        return None
    fs.invalidate_cache(path)
    return ("generation", str(response["generation"]))


def take_back(fs, path: str, created: tuple) -> bool:
    """Deletes the object at `path` only while it is the one this write created (`created`,
    its identity then); whether it was deleted."""
    if is_local(fs):
        # Moved aside first (atomic), checked there, then deleted or put back: a check then a
        # delete by name could delete an object that replaced it in between.
        aside = _temporary(path)
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if identity(fs, aside) == created:
            os.unlink(aside)
            _remove_empty_parents(path)
            return True
        try:
            os.link(aside, path)  # put back; a newer object at the name wins
        except FileExistsError:
            pass
        os.unlink(aside)
        return False
    if identity(fs, path) != created:
        return False
    bucket, key, _ = fs.split_path(path)
    try:
        # GCS deletes only that generation. (fake-gcs-server ignores the precondition on a
        # DELETE, measured: the identity check above is what the emulator tests exercise.)
        fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=created[1])
    except (FileNotFoundError, FileExistsError):
        return False
    fs.invalidate_cache(path)
    return True


def _remove_empty_parents(path: str, levels: int = 2) -> None:
    """Removes the (now empty) folders a taken-back staged record made, a level or two up."""
    directory = os.path.dirname(path)
    for _ in range(levels):
        try:
            os.rmdir(directory)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                raise
            return
        directory = posixpath.dirname(directory)


def delete_listed(fs, listed: list[tuple[str, tuple | None]]) -> None:
    """Deletes each object only while it is the one listed (`(path, identity then)`): a run
    stalled in the middle of a deletion cannot delete what a run that took the output over
    has written at those names since. Objects gone already are skipped."""
    if is_local(fs) or not listed or not all(ident and ident[0] == "generation" for _, ident in listed):
        for path, ident in listed:
            if ident is not None:
                take_back(fs, path, ident)
            else:
                try:
                    fs.rm_file(path)
                except FileNotFoundError:
                    pass
        return
    fsspec.asyn.sync(fs.loop, _delete_generations, fs, listed)


async def _delete_generations(fs, listed) -> None:
    async def delete(path, ident):
        bucket, key, _ = fs.split_path(path)
        try:  # only that generation: a newer object at the name is not this deletion's
            await fs._call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=ident[1])
        except (FileNotFoundError, FileExistsError):
            pass
    for i in range(0, len(listed), DELETES_AT_ONCE):
        await asyncio.gather(*(delete(path, ident) for path, ident in listed[i:i + DELETES_AT_ONCE]))
    fs.invalidate_cache()
