"""The dedup report (--dedup_report PATH): one row per removed document, exact copies and
near-copies alike, naming where it was read and the kept document it was matched to.

    in each dedup shard's group (dedup.drop_duplicates): the removed copies' rows; a copy of
    a kept text is complete there (its kept copy is in the same group); a copy of a text
    removed as a near-copy names the kept text's digest, and is keyed by that text's dedup
    shard, where the kept text's place is (its group emits the places of its kept texts
    that --dedup near decided about)
    -> join by dedup shard -> one report file per dedup shard, rows sorted, written
    create-only (the same bytes again, from a Beam retry or a rerun, are found in place)

So no step holds more than one shard's rows, and the rows are a function of the input: the
same on any runner, with any number of workers (the shard count only decides how rows are
split into files). Files are named `dedup-<run id>-<shard>-of-<shards>.jsonl` (or
`.parquet`) in the PATH directory; a rerun that replaced the dataset writes under its own run
id. Each file's row count is summed into the job's counts, and the commit checks that the
rows are exactly the removed documents (duplicates + near_duplicates).
"""
import io
import json
import posixpath
from dataclasses import dataclass, fields

import apache_beam as beam
import numpy as np
from fsspec.core import url_to_fs

from transforms import create_only, hashing
from transforms.read.inputs import place_name
from transforms.records import RecordCoder
from transforms.tokenize.minhash import jaccard
from flat_tokens.format.report_files import EARLIER, EARLIER_NEAR, PARQUET_SUFFIX, report_file_name, report_format

REPORT_ROWS = "dedup_report_rows"  # the count key: rows written


class ReportConflict(RuntimeError):
    """A report file's name holds other rows (not this run's): it is not replaced."""
EXACT, NEAR = "exact", "near"
EARLIER_KEY = "earlier:"  # kept file key of such a row: "earlier:<dataset number>" (the index has no places)


def earlier_key(dataset: int) -> str:
    return f"{EARLIER_KEY}{dataset}"


@dataclass
class ReportRows:
    """Rows of the report, in aligned arrays; a place is (file key, offset: the byte offset of
    a JSONL line, or the row of a Parquet file)."""

    removed_keys: np.ndarray  # object (str) file keys
    removed_offsets: np.ndarray  # uint64
    removed_digests: np.ndarray  # (n, 2) uint64
    kept_keys: np.ndarray  # object: None until the kept text's place is joined in
    kept_offsets: np.ndarray  # uint64
    kept_digests: np.ndarray  # (n, 2) uint64
    near: np.ndarray  # bool: matched as a near-copy (else an exact copy)
    estimated: np.ndarray  # float32 estimated Jaccard similarity (1 for exact copies)
    # Near-copies, with shingle_sets: the removed text's shingle set (object: array or None)
    # until its kept text's joins it, then their exact Jaccard similarity (NaN: not known).
    shingles: np.ndarray
    exact: np.ndarray  # float64

    def take(self, index) -> "ReportRows":
        return ReportRows(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concatenate(parts: list["ReportRows"]) -> "ReportRows":
        return ReportRows(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ReportRows)))


@dataclass
class KeptPlaces:
    """Where the kept texts that --dedup near decided about were read (their kept copy)."""

    digests: np.ndarray  # (n, 2) uint64
    keys: np.ndarray  # object (str) file keys
    offsets: np.ndarray  # uint64
    shingles: np.ndarray | None = None  # object: each one's shingle set (or None), with shingle_sets


for _record in (ReportRows, KeptPlaces):
    beam.coders.registry.register_coder(_record, RecordCoder)


def removal_rows(keys: np.ndarray, offsets: np.ndarray, digests: np.ndarray, order: np.ndarray,
                 starts: np.ndarray, near: np.ndarray, kept_digests: np.ndarray, similarity: np.ndarray,
                 seed: int, num_shards: int, held: np.ndarray | None = None, held_kept: np.ndarray | None = None,
                 held_similarity: np.ndarray | None = None, near_shingles: np.ndarray | None = None):
    """One dedup shard's rows, keyed by the dedup shard where each is completed.

    `keys`, `offsets`, `digests`: the shard's copies; `order` sorts them by text, then place,
    each text's copies starting at `starts` (the first is its kept copy); `near`: whether
    each text was removed as a near-copy, for the kept text of `kept_digests` at estimated
    `similarity`. `held` (--dedup_against): per text, the earlier dataset that holds it, or -1;
    every copy of a text held earlier, its kept copy too, names that dataset as kept, and the
    earlier text's digest (`held_kept`: its own for an exact copy, another for a near-copy)
    at `held_similarity`. `near_shingles` (with shingle_sets): per text, the shingle set of a
    text removed as a near-copy (object; None when not known), carried to where its kept
    text's is.
    Yields (shard, ReportRows) and (shard, KeptPlaces)."""
    sizes = np.diff(np.append(starts, order.size))
    text_of = np.repeat(np.arange(starts.size), sizes)  # per sorted copy
    first = np.zeros(order.size, dtype=bool)
    first[starts] = True
    kept_copy = order[np.repeat(starts, sizes)]
    earlier = held[text_of] >= 0 if held is not None else np.zeros(order.size, dtype=bool)
    exact = ~first & ~near[text_of] & ~earlier  # copies of a kept text
    if exact.any():
        copies, kept = order[exact], kept_copy[exact]
        n = copies.size
        rows = ReportRows(keys[copies], offsets[copies], digests[copies], keys[kept], offsets[kept], digests[kept],
                          np.zeros(n, dtype=bool), np.ones(n, dtype=np.float32), *_unknown(n))
        yield from _keyed(rows, digests[copies], seed, num_shards)
    if earlier.any():
        copies = order[earlier]
        n = copies.size
        kept_keys = np.array([earlier_key(int(d)) for d in held[text_of[earlier]]], dtype=object)
        texts = text_of[earlier]
        rows = ReportRows(keys[copies], offsets[copies], digests[copies], kept_keys, np.zeros(n, dtype=np.uint64),
                          digests[copies] if held_kept is None else held_kept[texts], np.zeros(n, dtype=bool),
                          np.ones(n, dtype=np.float32) if held_similarity is None else held_similarity[texts],
                          *_unknown(n))
        yield from _keyed(rows, digests[copies], seed, num_shards)
    removed = near[text_of]  # every copy of a text removed as a near-copy
    if removed.any():
        copies, texts = order[removed], text_of[removed]
        n = copies.size
        rows = ReportRows(keys[copies], offsets[copies], digests[copies], np.full(n, None, dtype=object),
                          np.zeros(n, dtype=np.uint64), kept_digests[texts], np.ones(n, dtype=bool),
                          similarity[texts].astype(np.float32), *_unknown(n))
        if near_shingles is not None:
            rows.shingles[:] = near_shingles[texts]
        yield from _keyed(rows, rows.kept_digests, seed, num_shards)


def _unknown(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(shingles, exact) of n rows without them."""
    return np.full(n, None, dtype=object), np.full(n, np.nan)


def kept_places(keys, offsets, digests, kept_copies: np.ndarray, seed: int, num_shards: int,
                shingles: np.ndarray | None = None):
    """(shard, KeptPlaces) for the kept copies of texts that near-copies may name (with
    `shingles`, their shingle sets, aligned with `kept_copies`)."""
    if kept_copies.size:
        places = KeptPlaces(digests[kept_copies], keys[kept_copies], offsets[kept_copies], shingles)
        yield int(hashing.content_shards(places.digests[:1], seed, num_shards)[0]), places


def _keyed(rows: ReportRows, by: np.ndarray, seed: int, num_shards: int):
    shards = hashing.content_shards(by, seed, num_shards)
    for shard in np.unique(shards).tolist():
        yield int(shard), rows.take(np.flatnonzero(shards == shard))


def complete_rows(keyed) -> list[tuple[int, ReportRows]]:
    """(shard, {rows, kept}) -> (shard, the rows with their kept places, sorted)."""
    shard, grouped = keyed
    parts = list(grouped["rows"])
    if not parts:
        return []
    rows = ReportRows.concatenate(parts)
    missing = np.flatnonzero(rows.near)
    if missing.size:
        places = list(grouped["kept"])
        if not places:
            raise RuntimeError("dedup report: near-copies name kept texts whose places never arrived")
        digests = np.concatenate([p.digests for p in places])
        keys = np.concatenate([p.keys for p in places])
        offsets = np.concatenate([p.offsets for p in places])
        table = {(int(a), int(b)): i for i, (a, b) in enumerate(digests.tolist())}
        try:
            at = np.array([table[(int(a), int(b))] for a, b in rows.kept_digests[missing].tolist()], dtype=np.int64)
        except KeyError:
            raise RuntimeError("dedup report: a near-copy names a kept text whose place never arrived") from None
        rows.kept_keys[missing] = keys[at]
        rows.kept_offsets[missing] = offsets[at]
        if any(p.shingles is not None for p in places):  # the exact similarity, where both sets are known
            kept_sets = np.concatenate([p.shingles if p.shingles is not None else np.full(p.offsets.size, None)
                                        for p in places])
            rows.exact[missing] = [jaccard(rows.shingles[i], kept_sets[j])
                                   for i, j in zip(missing.tolist(), at.tolist())]
        rows.shingles[:] = None  # not carried further
    # A total order of the rows: by removed place, which is unique to each removed copy.
    order = sorted(range(rows.near.size), key=lambda i: (rows.removed_keys[i], int(rows.removed_offsets[i])))
    return [(shard, rows.take(np.array(order, dtype=np.int64)))]


def row_dicts(rows: ReportRows, urls: dict[str, str]) -> list[dict]:
    """The report's rows: files by their URL (as listed), offsets as read."""
    out = []
    for i in range(rows.near.size):
        removed, kept = rows.removed_keys[i], rows.kept_keys[i]
        near = bool(rows.near[i])
        earlier = str(kept).startswith(EARLIER_KEY)
        # A near-copy of an earlier text names that text's digest, an exact copy its own.
        earlier_near = earlier and not np.array_equal(rows.kept_digests[i], rows.removed_digests[i])
        out.append({
            "removed_file": urls.get(removed, place_name(removed)), "removed_offset": int(rows.removed_offsets[i]),
            "removed_digest": _hex(rows.removed_digests[i]),
            "kept_file": urls.get(kept, place_name(kept)), "kept_offset": int(rows.kept_offsets[i]),
            "kept_digest": _hex(rows.kept_digests[i]),
            "match": NEAR if near else EARLIER_NEAR if earlier_near else EARLIER if earlier else EXACT,
            "estimated_similarity": round(float(rows.estimated[i]), 4),
            "similarity": _similarity(rows.exact[i]) if near else None if earlier_near else 1.0})
    return out


def _similarity(exact: float) -> float | None:
    """A near-copy's exact Jaccard similarity, to 6 decimals, or None when not known."""
    return None if np.isnan(exact) else round(float(exact), 6)


def _hex(digest: np.ndarray) -> str:
    return digest.astype("<u8").tobytes().hex()


def encode_rows(rows: list[dict], suffix: str) -> bytes:
    if suffix == PARQUET_SUFFIX:
        import pyarrow as pa
        import pyarrow.parquet as pq
        table = pa.Table.from_pylist(rows, schema=pa.schema([
            ("removed_file", pa.string()), ("removed_offset", pa.uint64()), ("removed_digest", pa.string()),
            ("kept_file", pa.string()), ("kept_offset", pa.uint64()), ("kept_digest", pa.string()),
            ("match", pa.string()), ("estimated_similarity", pa.float64()), ("similarity", pa.float64())]))
        buffer = io.BytesIO()
        # No creation time or writer version that changes: the same rows make the same bytes.
        pq.write_table(table, buffer, compression="zstd", store_schema=False)
        return buffer.getvalue()
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


class WriteReportShard(beam.DoFn):
    """(shard, rows) -> one report file, created (or found, the same bytes) -> its row count."""

    def __init__(self, url: str, run_id: str, num_shards: int, urls: dict[str, str],
                 storage_options: dict | None = None):
        self._url = url
        self._run_id = run_id
        self._shards = num_shards
        self._urls = urls
        self._storage_options = storage_options

    def process(self, keyed, created):
        shard, rows = keyed
        suffix = report_format(self._url)
        data = encode_rows(row_dicts(rows, self._urls), suffix)
        fs, path = url_to_fs(self._url, **(self._storage_options or {}))
        fs.makedirs(path, exist_ok=True)
        target = posixpath.join(path, report_file_name(self._run_id, shard, self._shards, suffix))
        try:
            create_only.put_new(fs, target, data)
        except create_only.ObjectConflict:
            raise ReportConflict(f"--dedup_report {self._url}: {target} already holds other rows; this run did not "
                              f"replace it (choose another --dedup_report directory)") from None
        yield {REPORT_ROWS: int(rows.near.size)}


class WriteDedupReport(beam.PTransform):
    """{rows, kept}: keyed ReportRows and KeptPlaces -> report files -> count dicts."""

    def __init__(self, url: str, run_id: str, num_shards: int, urls: dict[str, str], created,
                 storage_options: dict | None = None):
        super().__init__()
        self._args = (url, run_id, num_shards, urls, storage_options)
        self._created = created

    def expand(self, keyed):
        return (
            keyed
            | "JoinKeptPlaces" >> beam.CoGroupByKey()
            | "CompleteRows" >> beam.FlatMap(complete_rows)
            | "WriteReportFiles" >> beam.ParDo(WriteReportShard(*self._args), self._created)
        )


def check_report_rows(stats: dict, counts: dict) -> int:
    """The rows written (returned) are exactly the removed documents, or the dataset is not
    committed."""
    rows = counts.get(REPORT_ROWS, 0)
    removed = stats.get("duplicates", 0) + stats.get("near_duplicates", 0) + stats.get("dedup_against", 0)
    if rows != removed:
        raise RuntimeError(f"dedup report accounting failed: {rows} rows written for {removed} removed documents; "
                           f"the output is left uncommitted")
    return rows
