"""Parquet inputs: their row groups (the units read in parallel) and the rules that turn a
row's text column into a document or a rejected row.

A Parquet file is never cut by bytes: its footer lists the row groups, and each row group
is read by one worker. A document's place in the file (what JSONL's byte offset is for the
shuffle hash and the guard sample) is its row index in the file, counting the rows of the
earlier row groups. Row indices are 0-based, as in pyarrow and pandas.
"""
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.read.inputs import PARQUET, InputError, InputFile, open_input
from transforms.read.jsonl import INVALID_UTF8, TEXT_NOT_A_STRING

# Reasons a row is rejected: jsonl's TEXT_NOT_A_STRING and INVALID_UTF8 (which mean the same
# for a row as for a line), and NULL_TEXT. JSONL's `{"text": null}` stays text_not_a_string.
NULL_TEXT = "null_text"

EXCERPT_CHARS = 200
# Rows decoded at a time from a row group: bounds memory when row groups are large.
RECORD_BATCH_ROWS = 1024
# Footers read at once when the job is planned (each is one or two small reads).
FOOTER_READERS = 16


@dataclass(frozen=True)
class RowGroup:
    """One row group of one Parquet file: the unit a worker reads."""

    file: InputFile
    index: int
    first_row: int  # index in the file of the group's first row
    num_rows: int
    column: str  # the text column (--text_key)
    text_bytes: int  # uncompressed size of the text column in this group (for sizing and progress)


def open_parquet(f: InputFile, storage_options: dict | None = None, stored=None):
    """`with open_parquet(f) as pf:` a pyarrow ParquetFile read through fsspec, so gs:// (and
    the emulator, and storage_options) work as for JSONL. `stored`: inputs.StoredBytes."""
    return _ParquetFileOf(f, storage_options, stored)


class _ParquetFileOf:
    def __init__(self, f: InputFile, storage_options: dict | None, stored=None):
        self._open = open_input(f, storage_options, stored)
        self._fh = None

    def __enter__(self) -> pq.ParquetFile:
        self._fh = self._open.__enter__()
        try:
            return pq.ParquetFile(self._fh)
        except BaseException:
            self._open.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        return self._open.__exit__(*exc)


def row_groups_of(f: InputFile, column: str, storage_options: dict | None = None) -> list[RowGroup]:
    """The non-empty row groups of one file, from its footer. A file without the text column
    is a configuration error (raised here, before any data is read), not N rejected rows."""
    try:
        with open_parquet(f, storage_options) as pf:
            meta = pf.metadata
            names = pf.schema_arrow.names
    except Exception as e:  # pyarrow, OS and cloud errors all mean: not a readable Parquet file
        raise InputError(f"input {f.url}: cannot be read as Parquet ({type(e).__name__}: {e})") from None
    if column not in names:
        raise InputError(f"input {f.url}: has no column {column!r} (--text_key); its columns are: "
                         f"{', '.join(names) or '(none)'}")
    groups, first = [], 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        if rg.num_rows:
            text_bytes = sum(rg.column(c).total_uncompressed_size for c in range(rg.num_columns)
                             if rg.column(c).path_in_schema.split(".")[0] == column)
            groups.append(RowGroup(f, i, first, rg.num_rows, column, text_bytes))
        first += rg.num_rows
    # A file without rows is still one unit, of no rows: every input reports its counts, so
    # an input of such files sums to zero documents (and commits an empty dataset, as JSONL
    # without lines does) instead of to nothing at all.
    return groups or [RowGroup(f, 0, 0, 0, column, 0)]


def list_row_groups(files: list[InputFile], text_key: str, storage_options: dict | None = None) -> list[RowGroup]:
    """The row groups of every Parquet file among `files`, in file order. Footers are read in
    parallel: on object stores each is a round trip."""
    parquet_files = [f for f in files if f.format == PARQUET]
    if not parquet_files:
        return []
    workers = min(FOOTER_READERS, len(parquet_files), (os.cpu_count() or 1) * 4)
    with ThreadPoolExecutor(workers) as pool:
        per_file = list(pool.map(lambda f: row_groups_of(f, f.text_key or text_key, storage_options),
                                       parquet_files))
    return [g for groups in per_file for g in groups]


# ---------------------------------------------------------------------------------------------
# Rows -> documents


# The view types came with pyarrow 16; Beam allows pyarrow 14.
_is_string_view = getattr(pa.types, "is_string_view", lambda t: False)
_is_binary_view = getattr(pa.types, "is_binary_view", lambda t: False)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or _is_binary_view(t)
            or pa.types.is_fixed_size_binary(t))


def column_values(column: pa.Array) -> list:
    """The column's values as Python objects: str for strings, bytes for binary and for
    strings that are not valid UTF-8 (a writer may store any bytes under the string type;
    Python's strict decoder, used later, rejects them and UTF-8-encoded surrogates),
    None for nulls, and other objects for other types."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if _is_string(column.type):
        try:
            return column.to_pylist()
        except UnicodeDecodeError:
            return column.cast(pa.large_binary()).to_pylist()
    if _is_binary(column.type):
        return column.to_pylist()
    try:
        return column.to_pylist()
    except Exception:  # an exotic type Python cannot hold (e.g. a timestamp out of range)
        return [None if not s.is_valid else s for s in column]


def text_of(value) -> tuple[str | None, str | None]:
    """(text, None) for a document, (None, reason) for a rejected row. Every string is a
    document, the empty string included (it tokenizes to nothing and is counted as empty):
    a row has no 'blank line'. Binary values are documents when they are UTF-8."""
    if isinstance(value, str):
        return value, None
    if value is None:
        return None, NULL_TEXT
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, INVALID_UTF8
    return None, TEXT_NOT_A_STRING


def excerpt(value) -> str:
    """A bounded, printable excerpt of a rejected row's text value."""
    if value is None:
        return "null"
    if isinstance(value, bytes):
        cut = value[:EXCERPT_CHARS].decode("utf-8", errors="backslashreplace")
        return cut + ("..." if len(value) > EXCERPT_CHARS else "")
    text = repr(value) if not isinstance(value, str) else value
    return text[:EXCERPT_CHARS] + ("..." if len(text) > EXCERPT_CHARS else "")


def iter_rows(pf: pq.ParquetFile, group: RowGroup, batch_rows: int = RECORD_BATCH_ROWS):
    """Yields (row index in the file, value of the text column) for every row of the group,
    decoding `batch_rows` rows at a time."""
    row = group.first_row
    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[group.index], columns=[group.column],
                                 use_threads=False):
        for value in column_values(batch.column(0)):
            yield row, value
            row += 1
    if row != group.first_row + group.num_rows:
        raise IOError(f"input {group.file.url}: row group {group.index} holds {row - group.first_row} rows, "
                      f"but its footer says {group.num_rows}")


def iter_texts(f: InputFile, column: str, storage_options: dict | None = None):
    """Yields the documents of one Parquet file in row order (for checks before the run)."""
    with open_parquet(f, storage_options) as pf:
        for batch in pf.iter_batches(batch_size=RECORD_BATCH_ROWS, columns=[column], use_threads=False):
            for value in column_values(batch.column(0)):
                text, _ = text_of(value)
                if text is not None:
                    yield text
