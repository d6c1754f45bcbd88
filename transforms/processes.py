"""Which process left a file behind, and whether it is certainly gone.

A run leaves marks of work in progress: a lease at the output while one of its writes is in
flight (transforms/write/ownership.py), an owner record in each of its local temporary
directories (pipeline/local/scratch.py). Another run may clear such a mark only when the process
that made it can no longer act on it. This module describes a process so that a later one
can tell: `this_process()` is written into the mark, `certainly_dead(record)` reads it.

"Certainly" is the point: only a process of the same machine and the same process namespace
can be checked (its pid no longer exists, is a zombie, or belongs to a process started at
another time). A process on another machine (a Dataflow worker) is never declared dead here;
callers wait for it instead, for a bounded time.
"""
import os
import socket


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _namespace() -> str:
    """The machine and pid namespace: two records with the same one name pids of one table."""
    try:
        pid_namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pid_namespace = ""
    return f"{socket.gethostname()}/{_read('/proc/sys/kernel/random/boot_id')}/{pid_namespace}"


def _started(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a live pid, from /proc; None without /proc."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name in parentheses may hold spaces
    return fields[0], fields[19]


def this_process() -> dict:
    """A record of the calling process, for `certainly_dead` to check later."""
    started = _started(os.getpid())
    return {"namespace": _namespace(), "pid": os.getpid(), "started": started[1] if started else ""}


def certainly_dead(record: dict) -> bool:
    """True only when the process `record` describes has ended: same machine and pid
    namespace, and its pid is gone, a zombie, or reused by a process started later."""
    if not isinstance(record, dict) or record.get("namespace") != _namespace() or not isinstance(record.get("pid"), int):
        return False
    pid = record["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    started = _started(pid)
    if started is None:
        return False
    state, ticks = started
    return state == "Z" or bool(record.get("started")) and ticks != record["started"]
