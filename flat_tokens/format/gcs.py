"""How this process talks to Cloud Storage: a local emulator plainly, and gcsfs's HTTP
sessions closed at exit on the event loops that own them.

Every module that imports zarr or fsspec and may open gs:// files imports this one (which
applies the emulator settings on import, before gcsfs is imported) and calls
close_gcs_sessions_at_exit() after its imports. fsspec and the standard library only, so
that a trainer importing flat_tokens.reader needs nothing of the pipeline's input stack
(zstandard, Beam).
"""
import asyncio
import atexit
import os
import sys
import weakref

import fsspec

from flat_tokens.format import storage_faults

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
storage_faults.use_request_timeout()  # no request waits forever (flat_tokens/format/storage_faults.py)


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
