"""Rejected input lines (and Parquet rows): reported where a user can read them, and a limit
that fails the job.

Each input range that had rejected lines gets one JSONL report file in the rejected-lines
directory (outside the zarr group), named by the run id and a hash of (file, range start)
(`rejected-<run id>-<hash>.jsonl`), so a retried bundle rewrites the same file with the
same bytes. Only report files of the runs whose output this run replaced, recognised by
that exact name, are ever deleted there: anything else in the directory stays. A line's
1-based number is its index in its range plus the line counts of the ranges before it in
the same file (a side input), because ranges of one file are read by different workers.
A Parquet row group is a range whose start is its index; its rows' indices are known
without the side input.
"""
import hashlib
import json
import posixpath
import re
from collections import defaultdict

import apache_beam as beam
from fsspec.core import url_to_fs

from transforms.read import jsonl
from flat_tokens.format.gcs import close_gcs_sessions_at_exit
from transforms.write.ownership import OutputError

close_gcs_sessions_at_exit()

REPORT_GLOB = "rejected-*.jsonl"


class TooManyRejectedLines(RuntimeError):
    pass


def report_name(run_id: str, file_key: str, range_start: int) -> str:
    return f"rejected-{run_id}-{hashlib.sha1(f'{file_key}@{range_start}'.encode()).hexdigest()[:16]}.jsonl"


def is_report_of(name: str, run_id: str) -> bool:
    """Whether `name` is exactly a report file name this tool gives run `run_id`'s reports."""
    return bool(run_id) and re.fullmatch(f"rejected-{re.escape(run_id)}-[0-9a-f]{{16}}\\.jsonl", name) is not None


def lines_before(line_counts: list[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
    """(file key, range start) -> how many lines the file has before that range."""
    by_file = defaultdict(list)
    for key, start, lines in line_counts:
        by_file[key].append((start, lines))
    before = {}
    for key, ranges in by_file.items():
        total = 0
        for start, lines in sorted(ranges):
            before[key, start] = total
            total += lines
    return before


def report_row(record: dict, lines_before: int) -> dict:
    """One row of a report: a JSONL line by its 1-based line number and byte offset, a
    Parquet row by its row group and its 0-based row index (in the file, and in the group)."""
    if "row_group" in record:
        return {"file": record["file"], "row_group": record["row_group"], "row": record["row"],
                "row_in_group": record["row_in_group"], "reason": record["reason"], "excerpt": record["excerpt"]}
    return {"file": record["file"], "line": lines_before + record["line_in_range"], "byte_offset": record["offset"],
            "reason": record["reason"], "excerpt": record["excerpt"]}


def clear_reports(url: str, run_ids: list[str], storage_options: dict | None = None) -> None:
    """Deletes the report files of the given (replaced) runs, and nothing else, from the directory."""
    if not run_ids:
        return
    fs, path = url_to_fs(url, **(storage_options or {}))
    fs.invalidate_cache(path)
    for old in fs.glob(posixpath.join(path, REPORT_GLOB)):
        if any(is_report_of(posixpath.basename(old), r) for r in run_ids):
            fs.rm(old)


def check_writable(url: str, run_id: str, storage_options: dict | None = None) -> None:
    """Refuses, at launch, a rejected-lines directory the report could not be written to: a
    file, or a place where a probe object cannot be written (and deleted): inside the
    directory when it exists, else beside it, where it will be made. The report is written
    only after every line was read, when finding this would cost the whole run."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    path = path.rstrip("/")
    try:
        if fs.isfile(path):
            raise OutputError(f"--rejected_output {url}: is a file, not a directory; name a directory (it is made "
                              f"when missing)")
        if fs.isdir(path):
            probe = posixpath.join(path, f".flat-tokens-write-check-{run_id}")
        else:
            parent = posixpath.dirname(path)
            if parent:
                fs.makedirs(parent, exist_ok=True)
            probe = f"{path}.write-check-{run_id}"
        fs.pipe(probe, b"")
        fs.rm(probe)
    except (OSError, ValueError) as e:
        if isinstance(e, OutputError):
            raise
        raise OutputError(f"--rejected_output {url}: cannot write there ({type(e).__name__}: {e}); choose a "
                          f"writable directory") from None


class WriteReportFile(beam.DoFn):
    """((file key, range start), rejected lines) -> writes one report file; yields a summary."""

    def __init__(self, url: str, storage_options: dict | None, run_id: str = ""):
        self._url = url
        self._storage_options = storage_options
        self._run_id = run_id
        self._before = None

    def process(self, keyed, line_counts, created):
        (file_key, range_start), records = keyed
        if self._before is None:  # the side input is the same for every element: index it once
            self._before = lines_before(line_counts)
        offset = self._before.get((file_key, range_start), 0)
        rows = [json.dumps(report_row(r, offset), ensure_ascii=False)
                for r in sorted(records, key=lambda r: r["offset"])]
        fs, path = url_to_fs(self._url, **(self._storage_options or {}))
        fs.makedirs(path, exist_ok=True)
        with fs.open(posixpath.join(path, report_name(self._run_id, file_key, range_start)), "wb") as f:
            f.write(("\n".join(rows) + "\n").encode("utf-8"))
        yield records[0]["file"], len(rows)


class WriteRejectedLines(beam.PTransform):
    """Rejected-line records -> report files; yields (input file, rejected lines) per report file."""

    def __init__(self, url: str, line_counts, created, storage_options: dict | None = None, run_id: str = ""):
        super().__init__()
        self._url = url
        self._line_counts = line_counts
        self._created = created
        self._storage_options = storage_options
        self._run_id = run_id

    def expand(self, rejected):
        return (
            rejected
            | "KeyByRange" >> beam.Map(lambda r: ((r["file_key"], r["range_start"]), r))
            | "GroupByRange" >> beam.GroupByKey()
            | "WriteReportFiles" >> beam.ParDo(WriteReportFile(self._url, self._storage_options, self._run_id),
                                               self._line_counts, self._created)
        )


# How many of the input files with the most rejected lines the error names.
NAMED_FILES = 3


def worst_files(reports: list[tuple[str, int]]) -> str:
    """The input files with the most rejected lines, from the reports' (file, lines) pairs."""
    by_file = defaultdict(int)
    for file, lines in reports:
        by_file[file] += lines
    worst = sorted(by_file.items(), key=lambda fl: (-fl[1], fl[0]))
    named = ", ".join(f"{file} ({lines:,})" for file, lines in worst[:NAMED_FILES])
    more = len(worst) - NAMED_FILES
    return named + (f" and {more:,} more file{'s' if more > 1 else ''}" if more > 0 else "")


def check_rejected_fraction(counts: dict, max_fraction: float, report_url: str,
                            reports: list[tuple[str, int]] = ()) -> None:
    """Raises TooManyRejectedLines when rejected / non-blank lines exceeds `max_fraction`,
    naming the input files with the most rejected lines (`reports`: (file, lines) pairs)."""
    rejected = counts.get("rejected", 0)
    considered = rejected + counts.get("documents", 0)
    if not rejected or rejected <= max_fraction * considered:
        return
    reasons = sorted(((v, k.split(":", 1)[1]) for k, v in counts.items() if k.startswith("rejected:")), reverse=True)
    top = ", ".join(f"{reason} {n}" for n, reason in reasons[:3])
    hint = ""
    if reasons[0][1] == jsonl.MISSING_TEXT_KEY:  # most likely a wrong --text_key: say which keys there are
        census = jsonl.KeyCensus.from_counts(counts)
        hint = (f" Is --text_key right? {census.objects} sampled lines without it have the keys: "
                f"{census.describe()}.")
    raise TooManyRejectedLines(
        f"{rejected} of {considered} non-blank input lines were rejected ({rejected / considered:.2%}), above "
        f"--max_rejected_fraction {max_fraction}; top reasons: {top}"
        + (f"; most in {worst_files(reports)}" if reports else "")
        + f"; every one with its file and line in {report_url}/. Fix the input (or leave the file out), or raise "
        f"--max_rejected_fraction to accept the loss.{hint}")


class CheckRejectedFraction(beam.DoFn):
    """The gate before any token is written: passes one element when the input is clean enough."""

    def __init__(self, max_fraction: float, report_url: str):
        self._max_fraction = max_fraction
        self._report_url = report_url

    def process(self, counts, reports_written, created):
        check_rejected_fraction(counts, self._max_fraction, self._report_url, reports_written)
        yield True
