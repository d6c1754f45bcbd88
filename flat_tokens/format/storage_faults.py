"""Storage faults: a transient fault is not corruption, and every wait has a bound
(docs/failures.md, "Storage faults").

An object store answers 503 and 429, resets connections, cuts bodies short, goes away for a
minute or stalls. None of that says anything about the bytes it stores. So:

* Bytes are judged only after a fresh read. A read whose bytes fail their check (a chunk's
  checksum, a metadata document that is not JSON) is read again, up to REREADS times, before
  the caller calls them damaged; a read that fails at the transport is retried with backoff.
  Both are counted (`counts()`): verify prints them, the reader's `storage_retries()` returns
  them. Each re-read is a new request (`_cat_file` on an async filesystem caches nothing).
* Every wait has a bound: each attempt gets at most the request timeout, and one object gets
  at most the store's patience in all, after which StorageUnavailable says so in one line
  (retry later: nothing was found damaged). While an object keeps the caller waiting, a line
  says so every WAITING_EVERY_S seconds ("waiting for gs://... for 40 s").

Defaults are below; FLAT_TOKENS_STORAGE_PATIENCE and FLAT_TOKENS_REQUEST_TIMEOUT (seconds)
change them for the reader, verify and inspect; `flat-tokens run` sets them from
--storage_patience and --storage_request_timeout. Its workers elsewhere (Dataflow's, a
cluster's) do not inherit the launcher's environment, but every Beam SDK harness is handed the
job's options (PIPELINE_OPTIONS, JSON): where those name the option, it wins. The standard
library and fsspec only: the reader-only install uses this module.
"""
from __future__ import annotations

import asyncio
import errno
import functools
import os
import random
import sys
import threading
import time

import fsspec

PATIENCE_ENV = "FLAT_TOKENS_STORAGE_PATIENCE"
REQUEST_TIMEOUT_ENV = "FLAT_TOKENS_REQUEST_TIMEOUT"
PATIENCE_OPTION, REQUEST_TIMEOUT_OPTION = "storage_patience", "storage_request_timeout"
JOB_OPTIONS_ENV = "PIPELINE_OPTIONS"  # the job's options, as Beam's SDK harness (a worker) is handed them
DEFAULT_PATIENCE_S = 300.0  # a store that answers nothing for 5 minutes: the job fails, to be retried later
DEFAULT_REQUEST_TIMEOUT_S = 120.0  # one request (gcsfs's own retries included); a stalled one is cut
REREADS = 3  # fresh reads of bytes that failed their check before they are called damaged (object stores)
REREAD_PAUSE_S = 0.05  # times the re-read's number: a cut body is a fault of one response, not of a minute
WAITING_EVERY_S = 20.0  # a "waiting for ..." line when nothing completed for this long
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 4.0)  # between attempts (plus jitter); the last repeats

# Transport failures that say nothing about the stored bytes (HTTP status codes).
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TRANSIENT_ERRNO = frozenset({errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
                             errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN})


class StorageUnavailable(Exception):
    """The store did not answer (or kept failing) for longer than the patience allows. Nothing
    was found damaged: retry later (the command resumes). Exit status 1."""


def job_option(name: str):
    """The value of the job's pipeline option `name` in a Beam worker (PIPELINE_OPTIONS, in
    either of Beam's forms), or None: not a worker, or the job did not name it."""
    found = _job_options(os.environ.get(JOB_OPTIONS_ENV, ""))
    for key in (name, f"beam:option:{name}:v1"):
        if found.get(key) is not None:
            return found[key]
    return None


@functools.lru_cache(maxsize=4)
def _job_options(text: str) -> dict:
    """PIPELINE_OPTIONS parsed (once per text: every read asks for the patience)."""
    import json
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    found = found.get("options", found) if isinstance(found, dict) else {}
    return found if isinstance(found, dict) else {}


def _seconds(env: str, default: float, option: str | None = None) -> float:
    given = job_option(option) if option else None
    if given is not None:  # a worker of `flat-tokens run`: the job's option, as the launcher had it
        env = f"--{option}"
        text = str(given).strip()
    else:
        text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{env}={text!r}: expected a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{env}={text!r}: must be > 0 seconds")
    return value


def patience() -> float:
    """Seconds one object may keep failing or stalling before StorageUnavailable."""
    return _seconds(PATIENCE_ENV, DEFAULT_PATIENCE_S, PATIENCE_OPTION)


def request_timeout() -> float:
    """Seconds one attempt at an object may take."""
    return _seconds(REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_OPTION)


def use_request_timeout() -> None:
    """Makes every gcsfs filesystem opened from now on cut an HTTP request after the request
    timeout (gcsfs's `requests_timeout`; it waits forever by default). A value given in
    storage_options wins."""
    try:
        seconds = request_timeout()
    except ValueError:
        return  # a bad FLAT_TOKENS_REQUEST_TIMEOUT is named by the first read that uses it
    fsspec.config.conf.setdefault("gs", {})["requests_timeout"] = seconds


def configure(patience_s: float, request_timeout_s: float) -> None:
    """`flat-tokens run`'s --storage_patience and --storage_request_timeout, for this process
    and the worker processes it starts (they inherit the environment). ValueError names a
    value that is not a positive number of seconds."""
    for option, env, value in (("--storage_patience", PATIENCE_ENV, patience_s),
                               ("--storage_request_timeout", REQUEST_TIMEOUT_ENV, request_timeout_s)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{option} {value}: must be a positive number of seconds")
        os.environ[env] = repr(float(value))
    use_request_timeout()


# ---------------------------------------------------------------------------------------------
# What is transient


def is_transient(error: BaseException) -> bool:
    """Whether `error` is a failure of the transport or of the store's service (a reset, a
    timeout, 429/5xx), which a later attempt may not meet; never a missing object, a refusal
    or bad bytes."""
    if isinstance(error, StorageUnavailable):
        return True
    if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                          NotADirectoryError)):
        return False
    if isinstance(error, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNO:
        return True
    module = type(error).__module__ or ""
    if module.startswith("aiohttp"):  # ClientOSError, ServerDisconnectedError, ClientPayloadError, ...
        return True
    status = getattr(error, "code", None) or getattr(error, "status", None)
    if module.startswith(("gcsfs", "google")) or type(error).__name__ in ("HttpError", "ProxyError"):
        try:
            return int(status) in TRANSIENT_STATUS if status is not None else type(error).__name__ == "ProxyError"
        except (TypeError, ValueError):
            return False
    if module.startswith("requests") and type(error).__name__ in (
            "ConnectionError", "ReadTimeout", "Timeout", "ProxyError", "ChunkedEncodingError", "SSLError"):
        return True
    if type(error).__name__ == "FSTimeoutError":
        return True
    return False


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def one_line(error: BaseException, where: str) -> str | None:
    """The one line a command prints for a storage failure (StorageUnavailable, or a transient
    error that escaped every retry), or None when `error` is no storage failure."""
    if isinstance(error, StorageUnavailable):
        return str(error)
    if is_transient(error):
        return (f"storage unavailable: {where}: {describe(error)}; the store is unreachable or failing, nothing was "
                f"found damaged: retry later (the command resumes)")
    return None


# ---------------------------------------------------------------------------------------------
# Counts


_lock = threading.Lock()
_counts = {"rereads": 0, "retries": 0}


def _count(kind: str) -> None:
    with _lock:
        _counts[kind] += 1


def count_reread() -> None:
    """Counts a read made again because its bytes failed a check the caller made itself."""
    _count("rereads")


def counts() -> dict[str, int]:
    """{"rereads": reads whose bytes failed their check and were read again, "retries":
    attempts that failed at the transport and were made again}, in this process so far."""
    with _lock:
        return dict(_counts)


def summary(since: dict[str, int] | None = None) -> str | None:
    """One line saying how many reads were made again (since `since`), or None when none were."""
    now = counts()
    rereads = now["rereads"] - (since or {}).get("rereads", 0)
    retries = now["retries"] - (since or {}).get("retries", 0)
    if not rereads and not retries:
        return None
    return (f"storage: {rereads} read{'s' if rereads != 1 else ''} of bytes that failed their check were read "
            f"again and {retries} failed request{'s' if retries != 1 else ''} retried (transient storage "
            f"faults; only bytes wrong on a fresh read count as damaged)")


# ---------------------------------------------------------------------------------------------
# Reading with patience


def waiting_line(what: str, seconds: float, last: BaseException | None) -> str:
    why = f" (last: {describe(last)})" if last is not None else " (no answer yet)"
    return f"waiting for {what} for {seconds:.0f} s{why}; giving up after {patience():.0f} s ({PATIENCE_ENV})"


def _gave_up(what: str, waited: float, last: BaseException | None) -> StorageUnavailable:
    why = describe(last) if last is not None else "no answer"
    return StorageUnavailable(f"storage unavailable: {what}: no good answer for {waited:.0f} s ({why}); the store is "
                              f"unreachable or failing, nothing was found damaged: retry later (the command "
                              f"resumes; {PATIENCE_ENV} or --storage_patience waits longer)")


def _backoff(attempt: int) -> float:
    base = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
    return base * (0.5 + random.random())


async def read_async(fetch, what: str, judge=None, rereads: int = REREADS):
    """await fetch() (a new coroutine each call), made again while it fails at the transport
    (up to the patience in all, each attempt cut at the request timeout) or while
    judge(value) names a problem (up to `rereads` fresh reads). Returns the last value read:
    the caller judges it once more and calls it damaged if it still fails. Raises
    StorageUnavailable when the patience runs out; any other error at once."""
    start = time.monotonic()
    deadline = start + patience()
    noted = start + WAITING_EVERY_S
    attempt = reread = 0
    last = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _gave_up(what, time.monotonic() - start, last)
        task = asyncio.ensure_future(fetch())
        cut = time.monotonic() + min(request_timeout(), remaining)
        try:
            while True:
                left = cut - time.monotonic()
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(left, noted - time.monotonic())))
                if done:
                    break
                if time.monotonic() >= noted and noted < deadline:  # not in the moment it gives up
                    print(waiting_line(what, time.monotonic() - start, last), file=sys.stderr, flush=True)
                    noted += WAITING_EVERY_S
                if time.monotonic() >= cut:
                    task.cancel()
                    raise TimeoutError(f"no answer in {min(request_timeout(), remaining):.0f} s")
            value = task.result()
        except BaseException as e:  # noqa: BLE001 - sorted below
            if not task.done():
                task.cancel()
            if not isinstance(e, Exception) or not is_transient(e):
                raise
            last = e
            _count("retries")
            await asyncio.sleep(max(0.0, min(_backoff(attempt), deadline - time.monotonic())))
            attempt += 1
            continue
        problem = judge(value) if judge is not None else None
        if problem and reread < rereads:
            reread += 1
            _count("rereads")
            await asyncio.sleep(REREAD_PAUSE_S * reread)
            continue
        return value


def call(fs, fetch, what: str, judge=None):
    """read_async for a synchronous caller: `fetch` is a coroutine function for an async
    filesystem `fs` (run on its loop), else a plain function whose transient failures are
    retried the same way (without the per-attempt cut: a synchronous call cannot be)."""
    if getattr(fs, "async_impl", False):
        from fsspec.asyn import sync
        return sync(fs.loop, read_async, fetch, what, judge)
    start = time.monotonic()
    deadline = start + patience()
    attempt = rereads = 0
    last = None
    while True:
        if time.monotonic() >= deadline:
            raise _gave_up(what, time.monotonic() - start, last)
        try:
            value = fetch()
        except Exception as e:  # noqa: BLE001 - sorted below
            if not is_transient(e):
                raise
            last = e
            _count("retries")
            time.sleep(max(0.0, min(_backoff(attempt), deadline - time.monotonic())))
            attempt += 1
            continue
        problem = judge(value) if judge is not None else None
        if problem and rereads < REREADS:
            rereads += 1
            _count("rereads")
            continue
        return value


def cat_file(fs, path: str, what: str | None = None, judge=None) -> bytes:
    """The bytes of `path` on `fs`, read with `call`'s patience and re-reads."""
    if getattr(fs, "async_impl", False):
        return call(fs, lambda: fs._cat_file(path), what or path, judge)
    return call(fs, lambda: fs.cat_file(path), what or path, judge)


def judged_by(check):
    """A judge (for `cat_file`, `call`, `read_async`) from `check(data)`, which raises
    ValueError (checksums.Damaged is one), KeyError, TypeError or OSError on bytes it cannot
    take: the error's text is the problem. The caller checks the last read itself, once more."""
    def judge(data) -> str | None:
        try:
            check(data)
        except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
            return describe(e)
        return None
    return judge


def read_json(fs, path: str, what: str | None = None):
    """The JSON document at `path`, read with `cat_file`'s patience and re-read while it is not
    JSON (a body cut short); FileNotFoundError when there is none, ValueError when it is no
    JSON on every fresh read."""
    import json
    return json.loads(cat_file(fs, path, what, not_json))


def not_json(data) -> str | None:
    """A judge: why `data` is not a JSON document (a body cut short is not), or None."""
    import json
    try:
        json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError) as e:
        return f"is not valid JSON ({e})"
    return None
