"""Watching the SDK workers that a command of the user's starts (`--environment_type
beam:env:harness_subprocess_python:v1 --environment_config COMMAND`), so that a worker that
cannot start, or dies, fails the run instead of hanging it.

Beam's default runner starts each worker with the command and sends it work; when the
command fails (`exec: ... not found`, exit 127) or the worker dies, the runner only logs
`Worker subprocess exited with return code 127` on a thread of its own and waits forever for
the worker's answers. So the launcher wraps the command (`wrap`): each worker is started by
`python -m pipeline.local.worker_guard REPORT_DIR COMMAND`, which runs COMMAND, passes its stderr
through while keeping the last lines, and, should it end with an error, leaves a report (its
return code and those lines) in REPORT_DIR, on the launcher's disk: the wrapper runs beside
the launcher, outside whatever namespace or container COMMAND enters. The launcher's
`WorkerWatch` fails the run with that report. Nothing here imports Beam: it starts at once.
"""
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
import threading

# The worker's last stderr lines kept for the report.
TAIL_LINES = 20


def wrap(command: str, report_dir: str) -> str:
    """The shell command that starts `command` under this guard."""
    return f"{shlex.quote(sys.executable)} -m pipeline.local.worker_guard {shlex.quote(report_dir)} {shlex.quote(command)}"


def reports(report_dir: str) -> list[dict]:
    """The reports of the workers that ended with an error, oldest first."""
    found = []
    try:
        names = sorted(n for n in os.listdir(report_dir) if n.endswith(".json"))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(report_dir, name)) as f:
                found.append(json.load(f))
        except (OSError, ValueError):  # being written: read at the next look
            continue
    return found


def describe(report: dict) -> str:
    """A report in one line: how the worker ended, and what it said last."""
    code = report.get("code")
    how = f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exited with return code {code}"
    said = [line for line in report.get("stderr", []) if line.strip()]
    return f"an SDK worker {how}" + (f": {said[-1].strip()}" if said else " (it wrote nothing to stderr)")


class WorkerWatch(threading.Thread):
    """In the launcher: calls `ended(message)` once a worker has left a report (it ended
    with an error while the run went on), then stops looking."""

    def __init__(self, report_dir: str, ended, interval: float = 0.2):
        super().__init__(name="flat-tokens-worker-watch", daemon=True)
        self._report_dir = report_dir
        self._ended = ended
        self._interval = interval
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self._interval):
            found = reports(self._report_dir)
            if found:
                more = f" (and {len(found) - 1} more worker{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
                self._ended(describe(found[0]) + more)
                return

    def stop(self) -> None:
        self._stopped.set()


def _write_report(report_dir: str, report: dict) -> None:
    """Leaves the report for WorkerWatch. A launcher that already ended the run (another
    worker's report was enough) has removed `report_dir`: the report has no reader left then,
    and is dropped quietly (the worker's stderr was passed through) instead of ending in a
    traceback under the launcher's one error line."""
    path = os.path.join(report_dir, f"worker-{os.getpid()}.json")
    try:
        os.makedirs(report_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)  # whole, or not there
    except FileNotFoundError:
        try:
            os.unlink(path + ".tmp")
        except OSError:
            pass


def main(argv: list[str]) -> int:
    report_dir, command = argv
    worker = subprocess.Popen(command, shell=True, stderr=subprocess.PIPE)
    # The runner stops its workers with SIGTERM; so does the launcher when it stops.
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launcher stops the workers itself
    tail = collections.deque(maxlen=TAIL_LINES)

    def pass_through():
        for line in worker.stderr:
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            tail.append(line.decode("utf-8", "replace").rstrip("\n"))

    reader = threading.Thread(target=pass_through, daemon=True)
    reader.start()
    code = worker.wait()
    reader.join(timeout=5)
    if code:
        _write_report(report_dir, {"code": code, "command": command, "stderr": list(tail)})
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
