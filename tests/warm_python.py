"""`python -m pipeline.run ...` for the tests, forked from a warm interpreter.

A run of the command line costs ~2.3 s of CPU on a tiny input, ~1.6 s of which is importing
Apache Beam, numpy, zarr and tokenizers; the suite runs the command several hundred times.
So each test process keeps two "zygotes": Python processes that have imported those
third-party libraries, and nothing of this project, and fork a child per run. The child sets
the caller's working directory, environment, argv and standard streams, then runs the module
or script as `python -m`/`python script` would (runpy, as `__main__`): the project's own
modules are imported fresh in it, on the caller's environment; it exits through the normal
interpreter shutdown (atexit handlers, non-daemon threads joined) with the command's code.

What a fresh interpreter has that a fork would not, and how it is kept:
- variables read when the interpreter or a C library starts (PYTHON*, LD_*, MALLOC_*, BLAS,
  gRPC): a run whose environment differs from the zygote's in any of them runs as a real
  subprocess, as does any run given an `env` of its own (run_pipeline's `env=`).
- hash randomisation: the two zygotes have different hash seeds and take turns, so two runs
  a test compares never share one; `random` and numpy's global generator are reseeded.
- `tempfile`'s cached directory is forgotten, so TMPDIR is read again.
FLAT_TOKENS_TEST_FRESH=1 runs every command as a real subprocess instead.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Read when an interpreter or a C library starts: a run that needs other values than the
# zygote started with must start fresh.
STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "OPENBLAS", "OMP_", "MKL_", "GRPC_", "RAYON_", "TOKENIZERS_",
                    "FASTOKENS_")
ZYGOTE_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}  # what the command line sets first

ZYGOTE = r'''
import json, os, select, sys
import apache_beam, apache_beam.runners.portability.fn_api_runner, fsspec, numpy, tokenizers, zarr  # noqa: F401


def child(request):
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
            f = os.open(path, flags)
            os.dup2(f, fd)
            os.close(f)
        import random, tempfile, runpy
        random.seed()
        numpy.random.seed()
        tempfile.tempdir = None
        sys.argv = list(request["argv"])
        sys.path[0] = request["cwd"] if request["module"] else os.path.dirname(os.path.abspath(request["argv"][0]))
        if request["module"]:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(request["argv"][0], run_name="__main__")
        code = 0
    except SystemExit:
        raise  # the interpreter's own shutdown, with the command's code
    except BaseException:
        import traceback
        traceback.print_exc()
    sys.exit(code)


# One loop: read requests (a JSON line each), fork a child per request, and reap the children,
# writing each one's exit code (as subprocess gives it) to the file its request named.
pending, buffered = {}, b""
while True:
    readable, _, _ = select.select([0], [], [], 0.01 if pending else None)
    if readable:
        data = os.read(0, 1 << 16)
        if not data:
            break
        buffered += data
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            pending[pid] = request["code"]
            os.write(1, (json.dumps({"pid": pid}) + "\n").encode())
    while pending:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        path = pending.pop(pid, None)
        if path:
            with open(path + ".tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(path + ".tmp", path)
'''


class _Zygote:
    def __init__(self):
        self.env = {**os.environ, **ZYGOTE_DEFAULTS}
        self.env.pop("PYTHONHASHSEED", None)  # each zygote draws its own
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=REPO, env=self.env, text=True)
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        """Ends the zygote once its children ended (its loop ends with its input), and reaps it."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, request: dict) -> int:
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the test zygote ended")
        return json.loads(answer)["pid"]


_zygotes: dict[int, list[_Zygote]] = {}
_turns = itertools.count()


def _zygote() -> _Zygote:
    pool = _zygotes.get(os.getpid())
    if pool is None or not all(z.alive() for z in pool):
        pool = _zygotes[os.getpid()] = [_Zygote(), _Zygote()]
    return pool[next(_turns) % 2]


def _startup_values(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def run(argv: list[str], module: str | None, cwd, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Like subprocess.run([sys.executable, "-m", module, *argv] or [sys.executable, *argv],
    cwd=cwd, capture_output=True, text=True, timeout=timeout, env=...)."""
    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, *(["-m", module] if module else []), *argv]
    if os.environ.get("FLAT_TOKENS_TEST_FRESH") or env:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    zygote = _zygote()
    if _startup_values({**ZYGOTE_DEFAULTS, **full_env}) != _startup_values(zygote.env):
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    with tempfile.TemporaryDirectory(prefix="flat-tokens-test-run-") as scratch:
        paths = {name: os.path.join(scratch, name) for name in ("stdout", "stderr", "code")}
        for name in ("stdout", "stderr"):
            open(paths[name], "w").close()
        argv0 = module.replace(".", "/") + ".py" if module else str(argv[0])
        pid = zygote.fork({"argv": [str(REPO / argv0) if module else argv0, *(argv if module else argv[1:])],
                           "module": module, "cwd": str(cwd), "env": {**ZYGOTE_DEFAULTS, **full_env}, **paths})
        deadline = time.monotonic() + timeout
        while not os.path.exists(paths["code"]):  # written by the zygote once it reaped the child
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(command, timeout)
            if not zygote.alive():
                raise RuntimeError(f"the test zygote ended while {command} ran")
            time.sleep(0.01)
        code = int(open(paths["code"]).read())
        out, err = (open(paths[name], encoding="utf-8", errors="replace").read() for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess(command, code, out, err)
