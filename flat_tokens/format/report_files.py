"""The dedup report's files (--dedup_report): their names and format, and reading them back
(`flat-tokens inspect --duplicates N`), without Beam: transforms/tokenize/dedup_report.py
writes them."""
import io
import json
import posixpath
import re

import fsspec
from fsspec.core import url_to_fs


PARQUET_SUFFIX, JSONL_SUFFIX = ".parquet", ".jsonl"
EARLIER = "earlier"  # the match of a row --dedup_against removed: an exact copy of a text an earlier dataset holds
# The names the pipeline reads as Parquet input (transforms/read/inputs.py: PARQUET_SUFFIXES).
INPUT_PARQUET_SUFFIXES = (".parquet", ".pq")
EARLIER_NEAR = "earlier_near"  # ... with --dedup near: a near-copy of a text an earlier dataset holds
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


def run_report_files(url: str, run_id: str, storage_options: dict | None = None) -> tuple[object, list[str]]:
    """(filesystem, the run's report files in PATH, sorted: the order of its rows). A report
    directory may hold other runs' files (a rerun writes under its own run id): only the
    run's own are listed."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    pattern = report_files_pattern(run_id)
    return fs, sorted(p for p in fs.ls(path, detail=False) if pattern.fullmatch(posixpath.basename(p)))


def read_report_file(fs, name: str) -> list[dict]:
    """The rows of one report file (JSONL or Parquet, by its suffix)."""
    data = fs.cat_file(name)
    if name.endswith(PARQUET_SUFFIX):
        import pyarrow.parquet as pq
        return pq.read_table(io.BytesIO(data)).to_pylist()
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line]


def read_report(url: str, run_id: str, storage_options: dict | None = None) -> list[dict]:
    """Every row of a run's report, in file order."""
    fs, names = run_report_files(url, run_id, storage_options)
    return [row for name in names for row in read_report_file(fs, name)]


def document_at(url: str, offset: int, text_key: str = "text", storage_options: dict | None = None) -> str:
    """The text of the document a report row names: the JSON line at a byte offset (of an
    uncompressed JSONL file), or a Parquet file's row."""
    if url.lower().endswith(INPUT_PARQUET_SUFFIXES):
        import pyarrow.parquet as pq
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            return str(pq.read_table(f, columns=[text_key]).column(0)[offset].as_py())
    with fsspec.open(url, "rb", compression="infer", **(storage_options or {})) as f:
        f.seek(offset)  # in a compressed file: of its text (read up to there)
        return json.loads(f.readline())[text_key]


def row_texts(row: dict, text_key: str = "text", max_chars: int | None = None,
              storage_options: dict | None = None) -> dict:
    """{"removed_text", "kept_text"}: the two documents a report row names (document_at), cut
    to max_chars (with "…"); a side that cannot be read says why instead of failing the rest
    (an input may have been moved since the run). `inspect --duplicates` and `flat-tokens
    report` show these."""
    out = {}
    for side in ("removed", "kept"):
        if side == "kept" and row.get("match") == EARLIER:  # an exact copy of a text the earlier dataset holds
            out["kept_text"] = out["removed_text"]
            continue
        if side == "kept" and row.get("match") == EARLIER_NEAR:  # the index holds no text, only its digest
            out["kept_text"] = (f"(a text the earlier dataset holds, digest {row['kept_digest']}; its index keeps "
                                f"no text)")
            continue
        try:
            text = document_at(row[f"{side}_file"], int(row[f"{side}_offset"]), text_key, storage_options)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            text = f"(cannot read it: {type(e).__name__}: {e})"
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + "…"
        out[f"{side}_text"] = text
    return out
