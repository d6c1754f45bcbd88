"""Beam's portable-runner services for tests: the Python job service (the Job API that Beam's Flink
and Spark job servers also speak) and an EXTERNAL SDK worker pool, as real subprocesses.

    with portable_services(tmp_path) as svc:
        run_pipeline(..., *svc.pipeline_args, env=svc.env)

Both services bind port 0 and report the port they got (the job service through its
--port_file, the pool in its start-up log line), so there is no free-port race. Each runs in
its own session, so stopping it stops the SDK workers it started; they are stopped on leaving
the block whatever happened inside it. Every wait is bounded.
"""
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB_SERVICE = "apache_beam.runners.portability.local_job_service_main"
WORKER_POOL = "apache_beam.runners.worker.worker_pool_main"
POOL_STARTED = re.compile(r"Started worker pool servicer at port: [^:\s]+:(\d+)")


def service_env(python: str = sys.executable, pythonpath: Path | None = REPO) -> dict:
    """The pool starts every SDK worker with the `python` on PATH: put `python`'s directory first
    (or the job hangs on a worker that cannot import Beam). Workers import `pipeline` and
    `transforms` through PYTHONPATH (None: from the installed package)."""
    env = {**os.environ, "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH")) if p)
    return env


def _log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _wait_for(what: str, proc: subprocess.Popen, log: Path, found, timeout: float):
    """Polls found() until it returns a value; fails fast when proc exits, and after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} before it was ready:\n{_log_tail(log)}")
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s:\n{_log_tail(log)}")


def _wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")
            time.sleep(0.1)


def stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM to the process group (the service and the workers it started), SIGKILL after grace."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):  # workers left behind by a service that exited
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)


@contextlib.contextmanager
def portable_services(workdir: Path, python: str = sys.executable, env: dict | None = None,
                      cwd: Path | None = REPO, start_timeout: float = 60):
    """Starts Beam's Python job service and an EXTERNAL worker pool; yields
    .job_endpoint, .worker_pool, .pipeline_args (for `pipeline.run`), .env, .logs."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = env if env is not None else service_env(python)
    procs: list[subprocess.Popen] = []
    logs = types.SimpleNamespace(pool=workdir / "worker-pool.log", job=workdir / "job-service.log")
    try:
        with open(logs.pool, "wb") as out:
            pool = subprocess.Popen([python, "-m", WORKER_POOL, "--service_port=0"], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                    start_new_session=True)
        procs.append(pool)
        port_file = workdir / "job-service.port"
        with open(logs.job, "wb") as out:
            job = subprocess.Popen([python, "-m", JOB_SERVICE, "--port=0", f"--port_file={port_file}",
                                    f"--staging_dir={workdir / 'staging'}"], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                   start_new_session=True)
        procs.append(job)

        def pool_port():
            m = POOL_STARTED.search(_log_tail(logs.pool, 100_000))
            return int(m.group(1)) if m else None

        def job_port():
            return int(port_file.read_text()) if port_file.exists() else None

        pool_port = _wait_for("the worker pool", pool, logs.pool, pool_port, start_timeout)
        job_port = _wait_for("the job service", job, logs.job, job_port, start_timeout)
        for port in (pool_port, job_port):
            _wait_listening(port, start_timeout)
        job_endpoint, worker_pool = f"localhost:{job_port}", f"localhost:{pool_port}"
        yield types.SimpleNamespace(
            job_endpoint=job_endpoint, worker_pool=worker_pool, env=env, logs=logs, pool=pool, job=job,
            pipeline_args=["--runner=PortableRunner", f"--job_endpoint={job_endpoint}",
                           "--environment_type=EXTERNAL", f"--environment_config={worker_pool}"])
    finally:
        for proc in reversed(procs):
            stop(proc)


def started_workers(pool_log: Path) -> int:
    """How many SDK worker processes the pool started (one log line each)."""
    return len(re.findall(r"Starting worker with command", _log_tail(pool_log, 10_000_000)))
