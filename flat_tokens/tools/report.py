"""A dataset report people look at: one self-contained HTML page per dataset (docs/report.md).

    flat-tokens report DATASET --html PATH [--tokenizer SPEC] [--window LENGTH]
                       [--sample_tokens N] [--sample_sequences N] [--summary SUMMARY_JSON]
                       [--rejected DIR] [--dedup_report DIR_OR_FILE] [--storage_option KEY=VALUE ...]

DATASET and PATH are local paths or fsspec URLs (gs://, ...). The page (flat_tokens/tools/report_html.py)
needs nothing at view time: no script, no network; every figure is inline SVG.

Bounded work, whatever the dataset's size: the counts come from the dataset's metadata and its
root attributes (stats, mixture, provenance); the distributions (sequence lengths, per-source
lengths, token-id frequencies) come from a sample of fixed size, read through the project's
reader (flat_tokens/reader.py), which checks every chunk's checksum:

* lengths: up to --sample_sequences sequences per split, in SAMPLE_RANGES contiguous runs spread
  evenly over the split (all of them when the split has no more);
* tokens: up to --sample_tokens tokens per split, in SAMPLE_RANGES windows spread evenly over
  encoded_tokens (all of them when the split has no more);
* a few documents decoded, one packed window of --window tokens, a few rejected lines per reason;
* the dedup report's files, whole, until DEDUP_ROWS_READ rows are passed (cluster sizes), and
  the texts of DEDUP_PAIRS removed/kept pairs, read from the inputs at the places it names.

The page states the sample it was computed from. The one unbounded step is a storage listing for
bytes per token (as `inspect` does; --no_du skips it).

Exit status: 0; 2 when the dataset is missing, not committed, or an argument is out of range.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import fsspec
import numpy as np

from flat_tokens import VERSION
from flat_tokens.tools.inspect import LengthDistribution, NoTokenizers, choose_decoder, storage_bytes
from flat_tokens.reader import SPLITS, DatasetError, FlatTokensSplit, decode, open_dataset
from flat_tokens.format.report_files import COLUMNS, read_report_file, row_texts, run_report_files

USAGE_ERROR = 2
SAMPLE_RANGES = 16
DEFAULT_SAMPLE_TOKENS = 1 << 22  # 16 MiB of decoded ids per split
DEFAULT_SAMPLE_SEQUENCES = 1 << 20  # 8 MiB of seq_starts per split
DOCUMENTS_SHOWN = 6
DOCUMENT_MAX_TOKENS = 1 << 14  # longer sequences are not picked to be shown decoded
DOCUMENT_CHARS = 1200
REJECTED_EXAMPLES = 3
REJECTED_LINES_READ = 2000  # lines of the rejected-lines report read for examples, at most
DEDUP_PAIRS = 5  # removed/kept pairs shown: near-copies first, then exact copies
DEDUP_PAIR_CHARS = 600
DEDUP_ROWS_READ = 200_000  # dedup report rows read for the cluster sizes: whole files, until past this
TOP_TOKENS = 25
WINDOW_LENGTHS = (512, 1024, 2048, 4096, 8192)


# ---------------------------------------------------------------------------------------------
# Where the sample is read


def spread(count: int, size: int, ranges: int) -> list[tuple[int, int]]:
    """Up to `ranges` disjoint [lo, hi) runs of `size` items spread evenly over [0, count), in
    order; the whole of [0, count) in one run when it holds no more than ranges * size items."""
    if count <= 0:
        return []
    if count <= ranges * size:
        return [(0, count)]
    last = count - size
    starts = sorted({k * last // (ranges - 1) for k in range(ranges)}) if ranges > 1 else [0]
    return [(lo, lo + size) for lo in starts]


# ---------------------------------------------------------------------------------------------
# Per split


def length_sample(split: FlatTokensSplit, sample_sequences: int) -> dict:
    """Sequence lengths (and sources, when recorded) of the sampled runs of sequences."""
    runs = spread(split.num_sequences, max(1, sample_sequences // SAMPLE_RANGES), SAMPLE_RANGES)
    lengths, sources = [], []
    for lo, hi in runs:
        lengths.append(split.sequence_lengths(lo, hi))
        if split.source_names is not None:
            sources.append(split.sources(slice(lo, hi)).astype(np.int64))
    lengths = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    dist = LengthDistribution()
    dist.add(lengths)
    out = {"runs": runs, "sampled": int(lengths.size), "exact": len(runs) <= 1,
           "values": dist.values.tolist(), "counts": dist.counts.tolist(), "summary": dist.summary(),
           "percentiles": {f"p{p}": dist.percentile(p) for p in (10, 50, 90, 99)} if dist.n else {}}
    if sources:
        ids = np.concatenate(sources)
        per = []
        for k, name in enumerate(split.source_names):
            d = LengthDistribution()
            d.add(lengths[ids == k])
            per.append({"name": name, "sampled": d.n, "values": d.values.tolist(), "counts": d.counts.tolist(),
                        "summary": d.summary(),
                        "sampled_tokens": int(lengths[ids == k].sum())})
        out["per_source"] = per
    return out


def token_sample(split: FlatTokensSplit, sample_tokens: int) -> dict:
    """Token-id frequencies of the sampled windows of encoded_tokens (np.unique: memory bounded by
    the sample, not the vocabulary)."""
    if split.num_tokens == 0:
        return {"sampled": 0, "exact": True, "windows": 0, "ids": [], "counts": []}
    if split.num_tokens <= sample_tokens:
        windows, length = [(0, split.num_tokens)], split.num_tokens
    else:
        length = max(1, sample_tokens // SAMPLE_RANGES)
        windows = [(lo, lo + 1) for lo, _ in spread(split.num_windows(length), 1, SAMPLE_RANGES)]
    ids, counts = np.empty(0, np.int64), np.empty(0, np.int64)
    sampled = 0
    for w, _ in windows:
        got = decode(split.packed(w, length, partial=True))[0]
        sampled += got.size
        v, c = np.unique(got, return_counts=True)
        ids, counts = np.concatenate([ids, v]), np.concatenate([counts, c])
    merged, inverse = np.unique(ids, return_inverse=True)
    totals = np.bincount(inverse, weights=counts).astype(np.int64)
    order = np.argsort(-totals, kind="stable")
    return {"sampled": sampled, "exact": len(windows) == 1 and sampled == split.num_tokens,
            "windows": len(windows), "window_tokens": length,
            "ids": merged[order].tolist(), "counts": totals[order].tolist()}


def split_section(split: FlatTokensSplit, args) -> dict:
    size = storage_bytes(split.url, split.split, split.storage_options) if not args.no_du else None
    lengths = sorted({*WINDOW_LENGTHS, args.window})
    return {"sequences": split.num_sequences, "tokens": split.num_tokens, "max_token_id": split.max_token_id,
            "bytes": size, "bytes_per_token": round(size / split.num_tokens, 3) if size and split.num_tokens else None,
            "windows": [{"length": n, "full": split.num_tokens // n, "dropped_tokens": split.num_tokens % n,
                         "chosen": n == args.window} for n in lengths],
            "lengths": length_sample(split, args.sample_sequences),
            "token_ids": token_sample(split, args.sample_tokens)}


# ---------------------------------------------------------------------------------------------
# Documents and one packed window


def documents(split: FlatTokensSplit, decoder) -> list[dict]:
    """DOCUMENTS_SHOWN sequences spread evenly over the split (all when it has no more), decoded;
    a sequence too long to show is named, not read."""
    n = split.num_sequences
    picks = list(range(n)) if n <= DOCUMENTS_SHOWN else [lo for lo, _ in spread(n, 1, DOCUMENTS_SHOWN)]
    out = []
    for i in picks:
        a, b = split.sequence_bounds(i)
        if b - a > DOCUMENT_MAX_TOKENS:
            out.append({"index": i, "tokens": b - a, "skipped": f"longer than {DOCUMENT_MAX_TOKENS} tokens"})
            continue
        ids = split.sequence(i)
        entry = {"index": i, "tokens": int(ids.size)}
        if split.source_names is not None:
            entry["source"] = split.source_names[split.sources(i)]
        if decoder is not None:
            text = decoder.decode(ids)
            entry.update(chars=len(text), text=text[:DOCUMENT_CHARS], truncated=len(text) > DOCUMENT_CHARS)
        else:
            entry.update(ids=ids[:200].tolist(), truncated=ids.size > 200)
        out.append(entry)
    return out


def packed_window(split: FlatTokensSplit, length: int, decoder) -> dict:
    """Window 0 of `length` tokens (partial when the split is shorter), cut at its document
    boundaries (start bits), each piece decoded."""
    if split.num_tokens == 0:
        return {"error": f"{split.split} is empty"}
    partial = split.num_windows(length) == 0
    encoded = split.packed(0, length, partial=True)
    ids, starts = decode(encoded)
    cuts = [0, *np.flatnonzero(starts[1:]).__add__(1).tolist(), ids.size]
    pieces = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        if a == b:
            continue
        piece = {"first": a, "tokens": b - a, "starts_document": bool(starts[a])}
        if decoder is not None:
            piece["text"] = decoder.decode(ids[a:b])
        else:
            piece["ids"] = ids[a:b][:64].tolist()
        pieces.append(piece)
    return {"split": split.split, "index": 0, "length": length, "tokens": int(ids.size), "partial": partial,
            "pieces": pieces}


# ---------------------------------------------------------------------------------------------
# Rejected lines and dedup pairs: small files beside the dataset


def read_jsonl_head(url: str, limit: int, storage_options: dict | None) -> tuple[list[dict], str | None]:
    """The first `limit` JSON lines of a file or of the *.jsonl files of a folder, and a note
    when they cannot be read (the report shows it; a missing report is not an error)."""
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        files = sorted(fs.glob(path.rstrip("/") + "/*.jsonl")) if fs.isdir(path) else [path]
        rows = []
        for name in files:
            with fs.open(name, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if len(rows) >= limit:
                        return rows, None
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(row, dict):
                        rows.append(row)
        return rows, None
    except Exception as e:
        return [], f"{url}: cannot be read ({type(e).__name__}: {str(e)[:200]})"


def rejected_section(stats: dict, where: str | None, storage_options: dict | None) -> dict:
    by_reason = dict(stats.get("rejected_by_reason") or {})
    out = {"total": stats.get("rejected", 0), "by_reason": by_reason, "where": where, "examples": {}, "note": None}
    if not where or not out["total"]:
        return out
    rows, out["note"] = read_jsonl_head(where, REJECTED_LINES_READ, storage_options)
    for row in rows:
        got = out["examples"].setdefault(str(row.get("reason")), [])
        if len(got) < REJECTED_EXAMPLES:
            got.append({k: row.get(k) for k in ("file", "line", "excerpt")})
    return out


def dedup_section(attrs: dict, report: str | None, storage_options: dict | None) -> dict:
    """Removals per source from the dataset's stats; from the run's dedup report (issue 39's
    --dedup_report, given or recorded in the dataset's attribute `dedup_report`): a few
    removed/kept pairs with their texts, and how many documents each kept text was matched by."""
    stats = attrs.get("stats") or {}
    sources = sorted({*(stats.get("duplicates_by_source") or {}), *(stats.get("near_duplicates_by_source") or {})},
                     key=lambda s: list(attrs.get("sources") or []).index(s) if s in (attrs.get("sources") or []) else 0)
    out = {"mode": attrs.get("dedup", "none"), "exact": stats.get("duplicates", 0),
           "near": stats.get("near_duplicates"), "near_dedup": stats.get("near_dedup"),
           "near_options": attrs.get("near_dedup"),
           "per_source": [{"name": s, "exact": (stats.get("duplicates_by_source") or {}).get(s, 0),
                           "near": (stats.get("near_duplicates_by_source") or {}).get(s, 0)} for s in sources],
           "pairs": [], "pairs_from": None, "note": None, "rows": None, "files": None, "files_read": None,
           "cluster_sizes": None}
    recorded = attrs.get("dedup_report")
    where = report or (recorded if isinstance(recorded, str) else None)
    if where:
        out["pairs_from"] = where
        try:
            out.update(dedup_report_summary(where, attrs, storage_options))
        except Exception as e:  # the caller decides: an error for a given file, a note for a recorded one
            out["note"] = f"{where}: cannot be read ({type(e).__name__}: {str(e)[:200]})"
    return out


def dedup_report_summary(url: str, attrs: dict, storage_options: dict | None) -> dict:
    """Reads the dedup report at `url`: the directory the run wrote (its files of the
    dataset's run id) or one of its files. Whole files are read until DEDUP_ROWS_READ rows
    are passed: every row of a kept text is in the same file (the rows are filed by the kept
    text's dedup shard), so the cluster sizes of the files read are exact."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if fs.isfile(path):
        names = [path]
    else:
        fs, names = run_report_files(url, attrs.get("run_id", ""), storage_options)
    removed = (attrs.get("stats") or {}).get("duplicates", 0) + ((attrs.get("stats") or {}).get("near_duplicates") or 0)
    if not names and removed:
        raise ValueError(f"holds no report file of run {attrs.get('run_id')} (dedup-{attrs.get('run_id')}-*); "
                         f"name the --dedup_report directory of the run that built this dataset")
    per_kept: Counter = Counter()
    near, exact = [], []
    rows = read = 0
    for name in names:
        if rows >= DEDUP_ROWS_READ:
            break
        got = read_report_file(fs, name)
        missing = [c for c in COLUMNS if got and c not in got[0]]
        if missing:
            raise ValueError(f"{name} is not a flat-tokens dedup report: its rows lack {', '.join(missing)}")
        rows += len(got)
        read += 1
        per_kept.update(r["kept_digest"] for r in got)
        for r in got:
            picked = near if r["match"] == "near" else exact
            if len(picked) < DEDUP_PAIRS:
                picked.append(r)
    # Near-copies first (the interesting ones), exact copies for the rest, up to DEDUP_PAIRS.
    n_near = min(len(near), max(DEDUP_PAIRS - len(exact), (DEDUP_PAIRS + 1) // 2))
    chosen = near[:n_near] + exact[:DEDUP_PAIRS - n_near]
    key = attrs.get("text_key", "text")
    pairs = [{**{k: r[k] for k in COLUMNS}, **row_texts(r, key, DEDUP_PAIR_CHARS, storage_options)} for r in chosen]
    # A cluster: a kept text and the documents removed as its copies (exact or near).
    sizes = Counter(n + 1 for n in per_kept.values())
    return {"pairs": pairs, "rows": rows, "files": len(names), "files_read": read,
            "cluster_sizes": sorted(sizes.items())}


# ---------------------------------------------------------------------------------------------
# Provenance


def command_line(attrs: dict) -> str | None:
    """The run's command as recorded (its non-default-looking options), as a shell line."""
    options = (attrs.get("command") or {}).get("options")
    if not isinstance(options, dict):
        return None
    parts = ["flat-tokens run"]
    for key, value in options.items():
        if value is None or value is False:
            continue
        for v in value if isinstance(value, list) else [value]:
            parts.append(f"--{key}" if v is True else f"--{key} {v}")
    return " ".join(parts)


def provenance_section(attrs: dict, split: FlatTokensSplit, summary: dict | None, decoder_name, decoder_note) -> dict:
    storage = attrs.get("storage") or {}
    scheme = split.chunk_checksums
    out = {"command": command_line(attrs), "inputs": attrs.get("inputs"),
           "validation_inputs": attrs.get("validation_inputs"), "mixture_file": (attrs.get("mixture") or {}).get("file"),
           "tokenizer": attrs.get("tokenizer"), "seed": attrs.get("seed"), "run_id": attrs.get("run_id"),
           "package": attrs.get("package"), "dedup": attrs.get("dedup"),
           "storage": storage,
           "checksums": (f"every chunk this report read was checked against its {scheme} checksum" if scheme else
                         "the chunks carry no checksums (written before this tool's chunks did): read unchecked"),
           "manifest": attrs.get("manifest"),
           "decoder": decoder_name, "decoder_note": decoder_note,
           "build": None}
    if summary:
        out["build"] = {k: summary.get(k) for k in ("wall_seconds", "tokens_per_second", "output_bytes",
                                                      "bytes_per_token", "parallelism")}
    return out


# ---------------------------------------------------------------------------------------------
# The whole report


def collect(args) -> dict:
    """Everything the page shows; raises DatasetError or ValueError (exit 2)."""
    began = time.monotonic()
    options = dict(args.storage_option) or None
    splits = open_dataset(args.dataset, options)
    attrs = splits["train"].attrs
    try:  # the reader-only install has no `tokenizers`: the page shows ids, and says how to decode
        decoder, note = choose_decoder(args.tokenizer, attrs.get("tokenizer"), options)
    except NoTokenizers as e:  # asked for by --tokenizer: the user's choice cannot be honoured
        raise ValueError(f"--tokenizer {args.tokenizer}: {e}") from None
    summary = args.summary_data
    if summary is None and args.summary:
        try:
            with fsspec.open(args.summary, "rt", **(options or {})) as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"--summary {args.summary}: cannot be read ({e})") from None
    report = {"dataset": args.dataset, "version": VERSION,
              "sample": {"ranges": SAMPLE_RANGES, "sequences": args.sample_sequences, "tokens": args.sample_tokens},
              "splits": {name: split_section(s, args) for name, s in splits.items()}}
    train = splits["train"]
    report["top_tokens"] = [{"id": i, "count": c, "piece": decoder.piece(i) if decoder else None}
                            for i, c in zip(report["splits"]["train"]["token_ids"]["ids"][:TOP_TOKENS],
                                            report["splits"]["train"]["token_ids"]["counts"][:TOP_TOKENS])]
    report["documents"] = documents(train, decoder)
    report["window"] = packed_window(train, args.window, decoder)
    report["mixture"] = attrs.get("mixture")
    stats = attrs.get("stats") or {}
    report["stats"] = {k: v for k, v in stats.items() if k not in SPLITS}
    report["rejected"] = rejected_section(stats, args.rejected or attrs.get("rejected_output"), options)
    report["dedup"] = dedup_section(attrs, args.dedup_report, options)
    # A file the user names must be read; one the dataset records may be gone (a note on the page).
    for given, section, option in ((args.rejected, "rejected", "--rejected"),
                                   (args.dedup_report, "dedup", "--dedup_report")):
        if given and report[section]["note"]:
            raise ValueError(f"{option} {report[section]['note']}")
    report["provenance"] = provenance_section(attrs, train, summary, getattr(decoder, "name", None), note)
    report["seconds"] = round(time.monotonic() - began, 3)
    report["generated"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return report


def write_html(text: str, path: str, storage_options: dict | None) -> None:
    with fsspec.open(path, "w", encoding="utf-8", **(storage_options or {})) as f:
        f.write(text)


def make_report(dataset: str, html_path: str, argv: list[str] | None = None, summary: dict | None = None) -> dict:
    """Writes the report of `dataset` to html_path (for `flat-tokens run --report`); returns it."""
    from flat_tokens.tools.report_html import render
    args = parse_args([dataset, "--html", html_path, *(argv or [])])
    args.summary_data = summary
    report = collect(args)
    write_html(render(report), html_path, dict(args.storage_option) or None)
    return report


# ---------------------------------------------------------------------------------------------
# Command line


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def storage_option(text: str) -> tuple[str, object]:
    """KEY=VALUE, VALUE parsed as JSON when it can be (as verify and inspect take it)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="flat-tokens report",
                                 description="Write a self-contained HTML report of a flat-tokens dataset.")
    ap.add_argument("dataset", help="dataset path or fsspec URL (gs://, file://, ...)")
    ap.add_argument("--html", required=True, metavar="PATH", help="the HTML file to write (local or fsspec URL)")
    ap.add_argument("--version", action="version", version=VERSION)
    ap.add_argument("--tokenizer", help="tokenizer.json path/URL, or 'bytes'; default: the dataset's own if loadable")
    ap.add_argument("--window", type=_positive, default=2048, metavar="LENGTH",
                    help="packed window length shown and counted (default 2048)")
    ap.add_argument("--sample_tokens", type=_positive, default=DEFAULT_SAMPLE_TOKENS, metavar="N",
                    help=f"tokens per split read for the token-id frequencies (default {DEFAULT_SAMPLE_TOKENS})")
    ap.add_argument("--sample_sequences", type=_positive, default=DEFAULT_SAMPLE_SEQUENCES, metavar="N",
                    help=f"sequence lengths per split read for the distributions (default {DEFAULT_SAMPLE_SEQUENCES})")
    ap.add_argument("--summary", metavar="SUMMARY_JSON",
                    help="the run's --summary_json, for the build time and throughput (not in the dataset)")
    ap.add_argument("--rejected", metavar="DIR", help="the rejected-lines report (default: the one the dataset records)")
    ap.add_argument("--dedup_report", metavar="FILE", help="the run's dedup report (its --dedup_report directory, or one of its files); "
                         "default: the one the dataset records")
    ap.add_argument("--no_du", action="store_true", help="do not list the storage to size the dataset")
    ap.add_argument("--storage_option", type=storage_option, action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec storage option, repeatable; VALUE is parsed as JSON if it can be")
    args = ap.parse_args(argv)
    args.summary_data = None
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from flat_tokens.tools.report_html import render
    try:
        report = collect(args)
    except (DatasetError, ValueError) as e:
        print(f"flat-tokens report: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return USAGE_ERROR
    try:
        write_html(render(report), args.html, dict(args.storage_option) or None)
    except OSError as e:
        print(f"flat-tokens report: error: --html {args.html}: cannot be written ({e})", file=sys.stderr)
        return USAGE_ERROR
    sampled = report["splits"]["train"]["token_ids"]["sampled"]
    print(f"flat-tokens report: wrote {args.html} ({report['seconds']:.1f} s; train sample: "
          f"{report['splits']['train']['lengths']['sampled']:,} sequence lengths, {sampled:,} tokens)")
    return 0


if __name__ == "__main__":
    from flat_tokens.tools.cli import run_command
    sys.exit(run_command(main))
