"""Progress of a local run, for the person watching it: documents, tokens and bytes so far.

On local runners the launcher cannot query metrics while the pipeline runs (FnApiRunner
blocks in run(), and multi_processing workers are other processes), so each DoFn instance
writes its running totals to a small file in a local directory, and the launcher sums the
files every few seconds. Only for display: nothing depends on it, retried bundles may
count twice, and it is off on remote runners (Dataflow shows its own metrics).
"""
import json
import os
import threading
import time
import uuid

_WRITE_EVERY_SECONDS = 1.0


class ProgressFile:
    """Running totals of one DoFn instance, flushed to `directory` at most every second
    (and whenever the DoFn asks, e.g. at the end of an input range)."""

    def __init__(self, directory: str | None):
        self._directory = directory
        self._path = None
        self._totals = {}
        self._last = 0.0

    def add(self, **counts) -> None:
        if not self._directory:
            return
        for k, v in counts.items():
            self._totals[k] = self._totals.get(k, 0) + v
        now = time.monotonic()
        if now - self._last >= _WRITE_EVERY_SECONDS:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if not self._directory or not self._totals:
            return
        if self._path is None:
            self._path = os.path.join(self._directory, f"{os.getpid()}-{uuid.uuid4().hex}.json")
        tmp = self._path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self._totals, f)
            os.replace(tmp, self._path)
        except OSError:  # the launcher removed the directory: the run is over
            pass


def read_totals(directory: str) -> dict:
    totals = {}
    for name in os.listdir(directory):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                for k, v in json.load(f).items():
                    totals[k] = totals.get(k, 0) + v
        except (OSError, ValueError):  # being replaced right now
            continue
    return totals


def progress_line(totals: dict, elapsed: float, input_bytes: int) -> str:
    read = totals.get("bytes", 0)
    percent = min(99.9, 100.0 * read / input_bytes) if input_bytes else 0.0
    rate = read / elapsed / 2**20 if elapsed > 0 else 0.0
    tokens = totals.get("tokens", 0)
    return (f"progress: {read / 2**20:,.1f} of {input_bytes / 2**20:,.1f} MB input read ({percent:.1f}%), "
            f"{totals.get('documents', 0):,} documents, {tokens:,} tokens; {rate:,.1f} MB/s, "
            f"{tokens / elapsed if elapsed > 0 else 0:,.0f} tokens/s; {elapsed:,.0f} s")


class ProgressLogger(threading.Thread):
    """Logs a progress line every `interval` seconds until stopped."""

    def __init__(self, directory: str, input_bytes: int, log, interval: float = 10.0):
        super().__init__(daemon=True)
        self._directory = directory
        self._input_bytes = input_bytes
        self._log = log
        self._interval = interval
        self._halt = threading.Event()
        self._began = time.monotonic()

    def run(self):
        while not self._halt.wait(self._interval):
            self._log(progress_line(read_totals(self._directory), time.monotonic() - self._began, self._input_bytes))

    def stop(self):
        self._halt.set()
