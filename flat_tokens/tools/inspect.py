"""Inspect a flat-tokens dataset: summary, length histogram, decoded sequences, a packed window.

    python -m flat_tokens.tools.inspect PATH_OR_URL [--tokenizer SPEC] [--sequences N] [--window LENGTH]
                               [--window_index I] [--split train|validation] [--json]
                               [--storage_option KEY=VALUE ...]

Prints, for a committed dataset at a local path or fsspec URL (gs://, ...):

* per split: sequences, tokens, max_token_id, sequence length min/mean/p50/p90/p99/max, bytes on
  storage and bytes per token; the lengths come from ``seq_starts`` read in bounded blocks;
* a sequence-length histogram over power-of-two buckets;
* the first N sequences of --split decoded to text. --tokenizer is a tokenizer.json path or
  URL, or ``bytes`` (id b+1 is byte b, decoded as UTF-8 with errors="replace"); by default the
  tokenizer recorded in the dataset is used when it can be loaded (and has the recorded
  sha256), else token ids are shown;
* packed window I of length LENGTH of --split with its start bits, targets and inputs, as the
  format defines them (see flat_tokens.reader);
* provenance: tokenizer, seed, inputs, package version, run id, document counts.

With --duplicates N (a dataset built with --dedup_report): instead, the first N rows of its
dedup report, each removed document beside the kept one it was matched to (read from the
input files at the places the report names), with their similarity.

Exit status: 0; 2 when the dataset is missing, not committed, or an argument is out of range.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys

import fsspec
import numpy as np

from flat_tokens import VERSION
from flat_tokens.reader import SPLITS, DatasetError, FlatTokensSplit, inputs_targets, open_dataset
from flat_tokens.tools.verify import storage_option
from flat_tokens.format import storage_faults
from flat_tokens.format.mixture_table import source_table
from flat_tokens.format.report_files import EARLIER, EARLIER_NEAR, read_report, row_texts

USAGE_ERROR = 2
BAR_WIDTH = 40
EIGHTHS = " ▏▎▍▌▋▊▉█"
PERCENTILES = (50, 90, 99)


# ---------------------------------------------------------------------------------------------
# Tokenizers for display


class BytesDecoder:
    """The built-in ``bytes`` tokenizer: id b+1 is UTF-8 byte b."""
    name = "bytes"

    def decode(self, ids) -> str:
        """UTF-8 with errors="replace"; an id outside [1, 256] (not a byte) becomes U+FFFD."""
        ids = np.asarray(ids, np.int64)
        if ids.size and (ids.min() < 1 or ids.max() > 256):
            runs = _runs((ids >= 1) & (ids <= 256))
            return "".join(self.decode(ids[a:b]) if ok else "\ufffd" * (b - a) for ok, a, b in runs)
        return (ids - 1).astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def piece(self, i: int) -> str:
        if not 1 <= i <= 256:
            return f"<{i}>"
        b = i - 1
        return chr(b) if 0x21 <= b < 0x7f else ("␣" if b == 0x20 else f"\\x{b:02x}")


def _runs(mask: np.ndarray):
    """(value, start, end) of each run of equal values in a boolean array."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), mask.size]
    return [(bool(mask[a]), a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class HfDecoder:
    """A tokenizer.json (HuggingFace tokenizers)."""

    def __init__(self, tokenizer, name: str):
        self._tk, self.name = tokenizer, name

    def decode(self, ids) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=False)

    def piece(self, i: int) -> str:
        text = self._tk.decode([int(i)], skip_special_tokens=False)
        return json.dumps(text, ensure_ascii=False)[1:-1].replace(" ", "␣") or f"<{i}>"


NO_TOKENIZERS = "decoding a tokenizer.json needs the `tokenizers` package: pip install tokenizers"


class NoTokenizers(ValueError):
    """The tokenizer is a tokenizer.json, and `tokenizers` is not installed."""


def load_decoder(spec: str, storage_options: dict | None = None, sha256: str | None = None):
    """A decoder for spec, or raises ValueError saying why it cannot be used."""
    if spec == "bytes":
        return BytesDecoder()
    try:
        fs, path = fsspec.core.url_to_fs(spec, **(storage_options or {}))
        with fs.open(path, "rb") as f:
            raw = f.read()
    except Exception as e:
        raise ValueError(f"cannot read {spec} ({type(e).__name__}: {e})") from None
    if sha256 and hashlib.sha256(raw).hexdigest() != sha256:
        raise ValueError(f"{spec} is not the tokenizer the dataset was written with (sha256 differs)")
    try:
        from tokenizers import Tokenizer
    except ImportError:  # the reader-only install (reader/setup.py) leaves tokenizers out
        raise NoTokenizers(NO_TOKENIZERS) from None
    try:
        return HfDecoder(Tokenizer.from_str(raw.decode("utf-8")), spec)
    except Exception as e:
        raise ValueError(f"{spec} is not a valid tokenizer.json ({str(e)[:200]})") from None


def choose_decoder(explicit: str | None, recorded: dict | None, storage_options: dict | None):
    """(decoder or None, note): the --tokenizer, else the dataset's own when it loads."""
    if explicit:
        return load_decoder(explicit, storage_options), None
    recorded = recorded if isinstance(recorded, dict) else {}
    spec, kind = recorded.get("spec"), recorded.get("kind")
    if not spec:
        return None, "no tokenizer recorded in the dataset; showing token ids (pass --tokenizer)"
    if kind == "hub":
        return None, f"recorded tokenizer {spec} is a hub name; showing token ids (pass --tokenizer PATH)"
    try:
        sha = recorded.get("sha256") if kind == "file" else None
        return load_decoder(spec, storage_options if "://" in spec else None, sha), None
    except NoTokenizers:
        return None, f"showing token ids: {NO_TOKENIZERS} to see them as text"
    except ValueError as e:
        return None, f"recorded tokenizer not loadable: {e}; showing token ids (pass --tokenizer)"


# ---------------------------------------------------------------------------------------------
# Sequence-length statistics in bounded memory


class LengthDistribution:
    """Exact distribution of sequence lengths as (distinct value, count) pairs.

    Distinct lengths k of sequences summing to T tokens satisfy k(k+1)/2 <= T, so this holds
    at most sqrt(2T) pairs, plus one block of lengths while adding it."""

    def __init__(self):
        self.values = np.empty(0, np.int64)
        self.counts = np.empty(0, np.int64)

    def add(self, lengths: np.ndarray) -> None:
        if not lengths.size:
            return
        v, c = np.unique(lengths, return_counts=True)
        values, counts = np.concatenate([self.values, v]), np.concatenate([self.counts, c])
        order = np.argsort(values, kind="stable")
        values, counts = values[order], counts[order]
        self.values, first = np.unique(values, return_index=True)
        self.counts = np.add.reduceat(counts, first)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def percentile(self, p: float) -> int:
        """Nearest-rank percentile: the smallest length with at least p% of sequences <= it."""
        rank = max(1, math.ceil(p / 100 * self.n))
        return int(self.values[np.searchsorted(np.cumsum(self.counts), rank)])

    def summary(self) -> dict | None:
        if not self.n:
            return None
        out = {"min": int(self.values[0]),
               "mean": round(float((self.values * self.counts).sum()) / self.n, 2)}
        out.update({f"p{p}": self.percentile(p) for p in PERCENTILES})
        out["max"] = int(self.values[-1])
        return out

    def histogram(self) -> list[dict]:
        """Power-of-two buckets [2^k, 2^(k+1)) from the shortest to the longest length."""
        if not self.n:
            return []
        exps = np.floor(np.log2(self.values)).astype(np.int64)
        lo, hi = int(exps.min()), int(exps.max())
        per = np.bincount(exps - lo, weights=self.counts, minlength=hi - lo + 1).astype(np.int64)
        return [{"lo": 1 << (lo + j), "hi": (1 << (lo + j + 1)) - 1, "count": int(c)} for j, c in enumerate(per)]


def length_distribution(split: FlatTokensSplit, block: int) -> LengthDistribution:
    dist = LengthDistribution()
    for lengths in split.iter_sequence_lengths(block):
        dist.add(lengths)
    return dist


def storage_bytes(url: str, split: str, storage_options: dict | None) -> int | None:
    """Bytes the split's objects take on storage (fsspec du), None if that cannot be listed."""
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
        return int(fs.du(f"{path.rstrip('/')}/{split}", total=True))
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Collecting the report


def source_counts(split: FlatTokensSplit, block: int) -> list[dict] | None:
    """Sequences and tokens of each recorded source (--record_sources), in bounded blocks;
    None for a dataset that does not record sources."""
    if split.source_names is None:
        return None
    n = len(split.source_names)
    sequences, tokens = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for lo in range(0, split.num_sequences, block):
        hi = min(split.num_sequences, lo + block)
        ids = split.sources(slice(lo, hi)).astype(np.int64)
        sequences += np.bincount(ids, minlength=n)[:n]
        tokens += np.bincount(ids, weights=split.sequence_lengths(lo, hi), minlength=n)[:n].astype(np.int64)
    return [{"name": name, "sequences": int(a), "tokens": int(b)}
            for name, a, b in zip(split.source_names, sequences, tokens)]


def split_report(split: FlatTokensSplit, block: int, du: bool) -> dict:
    dist = length_distribution(split, block)
    size = storage_bytes(split.url, split.split, split.storage_options) if du else None
    return {"sequences": split.num_sequences, "tokens": split.num_tokens, "max_token_id": split.max_token_id,
            "length": dist.summary(), "histogram": dist.histogram(), "bytes": size,
            "bytes_per_token": round(size / split.num_tokens, 3) if size is not None and split.num_tokens else None,
            "sources": source_counts(split, block)}


def sequences_report(split: FlatTokensSplit, n: int, decoder, max_chars: int) -> list[dict]:
    out = []
    for i in range(min(n, len(split))):
        ids = split.sequence(i)
        entry = {"index": i, "tokens": int(ids.size)}
        if decoder is not None:
            text = decoder.decode(ids)
            entry["chars"] = len(text)
            entry["truncated"] = bool(max_chars and len(text) > max_chars)
            entry["text"] = text[:max_chars] if entry["truncated"] else text
        else:
            shown = ids[:max_chars] if max_chars else ids
            entry["truncated"] = bool(shown.size < ids.size)
            entry["ids"] = shown.tolist()
        out.append(entry)
    return out


def window_report(split: FlatTokensSplit, index: int, length: int, decoder) -> dict:
    window = split.packed(index, length)
    inputs, targets = inputs_targets(window)
    out = {"split": split.split, "index": index, "length": length,
           "range": [index * length, (index + 1) * length],
           "encoded": window.tolist(), "start": (window & 1).astype(int).tolist(),
           "targets": targets.tolist(), "inputs": inputs.tolist()}
    if decoder is not None:
        out["pieces"] = [decoder.piece(int(t)) for t in targets]
    return out


PROVENANCE_KEYS = ("tokenizer", "seed", "validation_fraction", "inputs", "validation_inputs", "text_key",
                   "input_files", "dedup", "near_dedup", "mixture", "package", "run_id", "storage", "rejected_output")


def provenance(attrs: dict) -> dict:
    out = {k: attrs[k] for k in PROVENANCE_KEYS if k in attrs}
    stats = attrs.get("stats")
    if isinstance(stats, dict):
        out["stats"] = {k: v for k, v in stats.items() if k not in SPLITS}
    return out


# ---------------------------------------------------------------------------------------------
# Rendering


def _num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _bar(count: int, top: int) -> str:
    eighths = round(BAR_WIDTH * 8 * count / top) if top else 0
    if count and not eighths:
        eighths = 1
    full, part = divmod(eighths, 8)
    return "█" * full + (EIGHTHS[part] if part else "")


def render_histogram(hist: list[dict], total: int) -> list[str]:
    labels = [f"{h['lo']}" if h["lo"] == h["hi"] else f"{h['lo']}–{h['hi']}" for h in hist]
    width = max(map(len, labels))
    top = max(h["count"] for h in hist)
    cw = len(_num(top))
    return [f"    {label:>{width}} │{_bar(h['count'], top):<{BAR_WIDTH}} {_num(h['count']):>{cw}} "
            f"{100 * h['count'] / total:5.1f}%" for label, h in zip(labels, hist)]


def render_window(w: dict, per_line: int = 16) -> list[str]:
    rows = [("position", list(range(w["range"][0], w["range"][0] + len(w["encoded"])))),
            ("encoded", w["encoded"]), ("start", w["start"]), ("targets", w["targets"]), ("inputs", w["inputs"])]
    if "pieces" in w:
        rows.append(("token", w["pieces"]))
    lines = []
    n = len(w["encoded"])
    for a in range(0, n, per_line):
        cols = range(a, min(n, a + per_line))
        widths = [max(len(str(r[1][j])) for r in rows) for j in cols]
        for name, values in rows:
            cells = " ".join(f"{str(values[j]):>{wd}}" for j, wd in zip(cols, widths))
            lines.append(f"    {name:>8}  {cells}")
        lines.append("")
    return lines[:-1]


def render(report: dict) -> str:
    out = [f"flat-tokens dataset {report['path']}"]
    for name in SPLITS:
        s = report["splits"][name]
        line = (f"  {name}: {_num(s['sequences'])} sequences, {_num(s['tokens'])} tokens, "
                f"max_token_id {s['max_token_id']}")
        if s["bytes"] is not None:
            line += f", {_size(s['bytes'])} on storage"
            if s["bytes_per_token"] is not None:
                line += f" ({s['bytes_per_token']:.2f} bytes/token)"
        out.append(line)
        if s.get("sources"):
            width = max(len(e["name"]) for e in s["sources"]) + 1
            out.append("    per source (seq_sources):")
            out += [f"      {e['name'] + ':':<{width}}  {_num(e['sequences'])} sequences, {_num(e['tokens'])} tokens"
                    for e in s["sources"]]
        length = s["length"]
        if length is None:
            out.append("    (empty split)")
            continue
        out.append("    sequence length: " + "  ".join(f"{k} {_num(v)}" for k, v in length.items()))
        out.append("    length histogram (tokens per sequence):")
        out += render_histogram(s["histogram"], s["sequences"])
    seqs = report["sequences"]
    out.append("")
    how = f"decoded with {report['decoder']}" if report["decoder"] else report["decoder_note"]
    out.append(f"first {len(seqs)} {report['split']} sequences" + (f" ({how})" if how else ""))
    for e in seqs:
        if "text" in e:
            more = f" … (+{e['chars'] - len(e['text'])} chars)" if e["truncated"] else ""
            out.append(f"  [{e['index']}] {e['tokens']} tokens: {json.dumps(e['text'], ensure_ascii=False)}{more}")
        else:
            more = " …" if e["truncated"] else ""
            out.append(f"  [{e['index']}] {e['tokens']} tokens: ids {' '.join(map(str, e['ids']))}{more}")
    out.append("")
    w = report["window"]
    if "error" in w:
        out.append(f"packed window: {w['error']}")
    else:
        out.append(f"packed window {w['index']} of length {w['length']} ({w['split']}: encoded_tokens"
                   f"[{w['range'][0]}:{w['range'][1]}]); targets = ids, inputs = previous target or 0 at a start")
        out += render_window(w)
    out.append("")
    out.append("provenance")
    p = report["provenance"]
    for key, value in p.items():
        if key in ("stats", "mixture"):
            continue
        out.append(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
    if p.get("mixture"):
        out += source_table(p["mixture"])
    stats = p.get("stats", {})
    if stats:
        order = ("lines", "documents", "blank", "rejected", "empty", "duplicates", "near_duplicates")
        parts = [f"{k} {_num(stats[k])}" for k in order if k in stats]
        out.append("  stats: " + "  ".join(parts))
        if stats.get("near_dedup"):
            out.append("  near dedup: " + ", ".join(f"{k} {v}" for k, v in stats["near_dedup"].items()))
        if stats.get("rejected_by_reason"):
            out.append("  rejected by reason: " + ", ".join(f"{k} {v}" for k, v in stats["rejected_by_reason"].items()))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Command line


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="flat-tokens inspect",
                                 description="Summarize a flat-tokens dataset; show sequences and a packed window.")
    ap.add_argument("path", help="dataset path or fsspec URL (gs://, file://, ...)")
    ap.add_argument("--version", action="version", version=VERSION)
    ap.add_argument("--tokenizer", help="tokenizer.json path/URL, or 'bytes'; default: the dataset's own if loadable")
    ap.add_argument("--sequences", type=_count, default=3, metavar="N", help="sequences to decode (default 3)")
    ap.add_argument("--split", choices=SPLITS, default="train", help="split for --sequences and --window")
    ap.add_argument("--window", type=_positive, default=16, metavar="LENGTH", help="packed window length (default 16)")
    ap.add_argument("--window_index", type=_count, default=None, metavar="I", help="packed window index (default 0)")
    ap.add_argument("--max_chars", type=_count, default=400,
                    help="truncate each decoded sequence to this many characters, 0 for all (default 400)")
    ap.add_argument("--block", type=_positive, default=1 << 20,
                    help="seq_starts entries read at a time for the length statistics (bounds memory)")
    ap.add_argument("--no_du", action="store_true", help="do not list the storage to size the dataset")
    ap.add_argument("--storage_option", type=storage_option, action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec storage option, repeatable; VALUE is parsed as JSON if it can be")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--duplicates", type=_count, default=None, metavar="N",
                    help="show N removed documents of the dedup report (--dedup_report) beside the kept ones")
    return ap.parse_args(argv)


def duplicates_report(attrs: dict, n: int, max_chars: int, options: dict | None) -> list[dict]:
    """The first N rows of the dataset's dedup report, each with both documents' texts."""
    url = attrs.get("dedup_report")
    if not url:
        raise ValueError("--duplicates: this dataset was built without --dedup_report; nothing to show")
    rows = read_report(url, attrs["run_id"], options)[:n]
    key = attrs.get("text_key", "text")
    for row in rows:
        row.update(row_texts(row, key, max_chars, options))
    return rows


def render_duplicates(rows: list[dict], width: int = 60) -> str:
    import textwrap
    out = []
    for row in rows:
        similarity = ("exact copy" if row["match"] == "exact" else "exact copy of a text this earlier dataset holds"
                      if row["match"] == EARLIER
                      else f"near-copy of a text this earlier dataset holds, estimated Jaccard "
                           f"{row['estimated_similarity']:.3f}" if row["match"] == EARLIER_NEAR
                      else f"near-copy, estimated Jaccard {row['estimated_similarity']:.3f}"
                      + (f", exact {row['similarity']:.3f}" if row.get("similarity") is not None else ""))
        out.append(f"removed {row['removed_file']} @ {row['removed_offset']}  |  kept {row['kept_file']} @ "
                   f"{row['kept_offset']}  ({similarity})")
        left = textwrap.wrap(row["removed_text"], width) or [""]
        right = textwrap.wrap(row["kept_text"], width) or [""]
        for i in range(max(len(left), len(right))):
            out.append(f"  {(left[i] if i < len(left) else ''):<{width}} | {right[i] if i < len(right) else ''}")
        out.append("")
    return "\n".join(out) if out else "(the dedup report has no rows)"


def _error(message: str) -> int:
    print(f"flat-tokens inspect: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def build_report(args) -> dict:
    """The whole report; raises DatasetError or ValueError (both exit 2)."""
    options = dict(args.storage_option) or None
    splits = open_dataset(args.path, options)
    attrs = splits["train"].attrs
    decoder, note = choose_decoder(args.tokenizer, attrs.get("tokenizer"), options)
    report = {"path": args.path,
              "splits": {name: split_report(s, args.block, not args.no_du) for name, s in splits.items()},
              "split": args.split, "decoder": getattr(decoder, "name", None), "decoder_note": note}
    chosen = splits[args.split]
    report["sequences"] = sequences_report(chosen, args.sequences, decoder, args.max_chars)
    index = 0 if args.window_index is None else args.window_index
    available = chosen.num_windows(args.window)
    if index < available:
        report["window"] = window_report(chosen, index, args.window, decoder)
    elif args.window_index is not None:
        raise ValueError(f"--window_index {index}: {args.split} has {available} full windows of length "
                         f"{args.window} ({chosen.num_tokens} tokens)")
    else:
        report["window"] = {"error": f"{args.split} has no full window of length {args.window} "
                                     f"({chosen.num_tokens} tokens)"}
    report["provenance"] = provenance(attrs)
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.duplicates is not None:
        try:
            options = dict(args.storage_option) or None
            rows = duplicates_report(open_dataset(args.path, options)["train"].attrs, args.duplicates,
                                     args.max_chars, options)
        except (DatasetError, ValueError, OSError) as e:
            return _error(str(e).splitlines()[0] if str(e) else type(e).__name__)
        print(json.dumps(rows, ensure_ascii=False, indent=1) if args.json else render_duplicates(rows))
        return 0
    try:
        report = build_report(args)
    except (DatasetError, ValueError) as e:
        return _error(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except Exception as e:  # noqa: BLE001 - a storage fault is one line and exit 1, never a traceback
        failure = storage_faults.one_line(e, args.path)
        if failure is None:
            raise
        print(f"flat-tokens inspect: error: {failure}", file=sys.stderr)
        return 1
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else render(report))
    return 0


if __name__ == "__main__":
    from flat_tokens.tools.cli import run_command
    sys.exit(run_command(main))
