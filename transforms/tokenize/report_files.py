"""The dedup report's files (--dedup_report): their names and format, and reading them back
(`flat-tokens inspect --duplicates N`), without Beam: transforms/tokenize/dedup_report.py
writes them."""
import io
import json
import posixpath
import re

import fsspec
from fsspec.core import url_to_fs

from transforms.read.inputs import PARQUET, format_of

PARQUET_SUFFIX, JSONL_SUFFIX = ".parquet", ".jsonl"
EARLIER = "earlier"  # the match of a row --dedup_against removed: an exact copy of a text an earlier dataset holds
COLUMNS = ("removed_file", "removed_offset", "removed_digest", "kept_file", "kept_offset", "kept_digest", "match",
           "estimated_similarity", "similarity")


def report_format(url: str) -> str:
    """Parquet files when PATH ends in .parquet, else JSONL."""
    return PARQUET_SUFFIX if url.rstrip("/").lower().endswith(PARQUET_SUFFIX) else JSONL_SUFFIX


def report_file_name(run_id: str, shard: int, shards: int, suffix: str) -> str:
    return f"dedup-{run_id}-{shard:05d}-of-{shards:05d}{suffix}"


def report_files_pattern(run_id: str) -> re.Pattern:
    return re.compile(f"dedup-{re.escape(run_id)}-[0-9]{{5}}-of-[0-9]{{5}}\\.(jsonl|parquet)")


class ReportPathError(ValueError):
    """--dedup_report names a place the report cannot be written to."""


def check_report_writable(url: str, run_id: str, storage_options: dict | None = None) -> None:
    """Refuses, at launch, a --dedup_report that is a file, or where a probe object cannot be
    written (and deleted): the report is written after the whole corpus was deduplicated."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    path = path.rstrip("/")
    try:
        if fs.isfile(path):
            raise ReportPathError(f"--dedup_report {url}: is a file, not a directory; name a directory (it is made "
                                  f"when missing)")
        fs.makedirs(path, exist_ok=True)
        probe = posixpath.join(path, f".flat-tokens-write-check-{run_id}")
        fs.pipe(probe, b"")
        fs.rm(probe)
    except OSError as e:
        raise ReportPathError(f"--dedup_report {url}: cannot write there ({type(e).__name__}: {e}); choose a "
                              f"writable directory") from None


def read_report(url: str, run_id: str, storage_options: dict | None = None) -> list[dict]:
    """Every row of a run's report, in file order."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    pattern = report_files_pattern(run_id)
    names = sorted(p for p in fs.ls(path, detail=False) if pattern.fullmatch(posixpath.basename(p)))
    rows = []
    for name in names:
        data = fs.cat_file(name)
        if name.endswith(PARQUET_SUFFIX):
            import pyarrow.parquet as pq
            rows += pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            rows += [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    return rows


def document_at(url: str, offset: int, text_key: str = "text", storage_options: dict | None = None) -> str:
    """The text of the document a report row names: the JSON line at a byte offset (of an
    uncompressed JSONL file), or a Parquet file's row."""
    if format_of(url) == PARQUET:
        import pyarrow.parquet as pq
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            return str(pq.read_table(f, columns=[text_key]).column(0)[offset].as_py())
    with fsspec.open(url, "rb", compression="infer", **(storage_options or {})) as f:
        f.seek(offset)  # in a compressed file: of its text (read up to there)
        return json.loads(f.readline())[text_key]
