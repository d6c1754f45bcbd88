"""Progress, for the person watching a run: Beam counters on every runner, and on local
runners small files that the launcher sums into its progress line.

Counters, namespace `flat_tokens`, are what a cluster shows while the job runs (Dataflow's
job page, Flink's web UI) and what `PipelineResult.metrics()` returns. They are updated once
per batch, range, shard or chunk, never per document. Nothing depends on them: the numbers
that are checked and committed travel through the data (transforms/counts.py), because a
retried bundle's counter updates count twice in a runner's *attempted* values (only the
*committed* ones leave failed bundles out).

On local runners the launcher cannot query metrics while the pipeline runs (FnApiRunner
blocks in run(), and multi_processing workers are other processes), so each DoFn instance
also writes its running totals to a small file in a directory of the launcher's, which the
launcher sums every few seconds; only when every worker sees the launcher's disk
(pipeline/local/environment.py). Retried bundles may count twice there too.
"""
import json
import os
import threading
import time
import uuid

import numpy as np
from apache_beam.metrics import Metrics, monitoring_infos
from apache_beam.metrics.cells import DistributionData, MetricCell
from apache_beam.metrics.execution import MetricUpdater
from apache_beam.metrics.metricbase import MetricName

NAMESPACE = "flat_tokens"
# The counter each progress total feeds.
PROGRESS_COUNTERS = {"documents": "documents", "bytes": "input_bytes", "tokens": "tokens"}
# The counter each key of a count dict feeds (transforms/counts.py); rejected lines also by
# reason, as `rejected_<reason>`. `documents` is counted as batches are read, not here.
COUNT_COUNTERS = {"lines": "lines", "blank": "blank_lines", "rejected": "rejected_lines",
                  "empty": "empty_documents", "duplicates": "duplicates_removed",
                  "near_duplicates": "near_duplicates_removed"}
_WRITE_EVERY_SECONDS = 1.0


def counter(name: str):
    return Metrics.counter(NAMESPACE, name)


class ProgressFile:
    """Running totals of one DoFn instance: added to the Beam counters at once and, with a
    `directory`, flushed there at most every second (and whenever the DoFn asks, e.g. at the
    end of an input range). The DoFn's teardown() may flush it while a bundle of the same
    instance still adds to it on another thread (docs/design.md, "DoFn lifecycle")."""

    def __init__(self, directory: str | None):
        self._directory = directory
        self._path = None
        self._totals = {}
        self._last = 0.0
        self._counters = {}
        self._lock = threading.Lock()

    def add(self, **counts) -> None:
        for k, v in counts.items():
            if v:
                if k not in self._counters:
                    self._counters[k] = counter(PROGRESS_COUNTERS.get(k, k))
                self._counters[k].inc(v)
        if not self._directory:
            return
        with self._lock:
            for k, v in counts.items():
                self._totals[k] = self._totals.get(k, 0) + v
        now = time.monotonic()
        if now - self._last >= _WRITE_EVERY_SECONDS:
            self.flush()
            self._last = now

    def flush(self) -> None:
        if not self._directory:
            return
        with self._lock:
            if not self._totals:
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
    return (f"progress: {read / 2**20:,.1f} of {input_bytes / 2**20:,.1f} MiB input read ({percent:.1f}%), "
            f"{totals.get('documents', 0):,} documents, {tokens:,} tokens; {rate:,.1f} MiB/s, "
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


def show_counts(counts: dict) -> dict:
    """Adds a count dict (of an input range, a batch, a dedup group) to the counters; returns
    it unchanged, on its way to the job's SumCounts."""
    for key, value in counts.items():
        name = COUNT_COUNTERS.get(key) or (f"rejected_{key[len('rejected:'):]}" if key.startswith("rejected:") else None)
        if name and value:
            counter(name).inc(value)
    return counts


def show_written(split: str, sequences: int, tokens: int) -> None:
    """A shard's sequences and tokens, as the writer receives them (the copies of a mixture included)."""
    counter(f"{split}_sequences").inc(sequences)
    counter(f"{split}_tokens").inc(tokens)


class _BatchDistributionCell(MetricCell):
    """A Beam distribution cell that takes a whole batch's (sum, count, min, max) in one update.

    Beam's own Distribution takes one value per update, which would be one call per document.
    The cell is reported like Beam's distribution cells (a user int64 distribution monitoring
    info), so runners and PipelineResult.metrics() see an ordinary distribution."""

    def __init__(self):
        super().__init__()
        self._data = DistributionData(0, 0, 0, 0)
        self._guard = threading.Lock()

    def update(self, summary):
        total, count, low, high = summary
        if count:
            with self._guard:
                self._data = self._data.combine(DistributionData(total, count, low, high))
        return False

    def reset(self):
        with self._guard:
            self._data = DistributionData(0, 0, 0, 0)

    def get_cumulative(self):
        with self._guard:
            return self._data.get_cumulative()

    def to_runner_api_monitoring_info_impl(self, name, transform_id):
        return monitoring_infos.int64_user_distribution(name.namespace, name.name, self.get_cumulative(),
                                                        ptransform=transform_id)


def show_document_lengths(lengths: np.ndarray, empty: int, updater=MetricUpdater(
        _BatchDistributionCell, MetricName(NAMESPACE, "document_tokens"))) -> None:
    """Adds a tokenized batch's document lengths to the distribution `document_tokens`: its
    kept documents' `lengths` and `empty` documents of 0 tokens."""
    count = int(lengths.size) + empty
    if count:
        low = 0 if empty else int(lengths.min())
        updater((int(lengths.sum()), count, low, int(lengths.max()) if lengths.size else 0))
