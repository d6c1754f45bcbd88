"""`flat-tokens export --format megatron DATASET PREFIX`: a committed dataset -> Megatron-LM
`.bin`/`.idx` pairs, as a Beam job on any runner.

    flat-tokens export --format megatron out/corpus.zarr out/megatron/corpus [--append_eod ID|none]
                       [--part_tokens N] [--overwrite] [--storage_option KEY=VALUE ...] [Beam options]

Each split is cut into parts of about --part_tokens tokens, at sequence boundaries; part k of
a split is `PREFIX-SPLIT-0000k.bin` and `.idx` (flat_tokens/megatron.py: the layout). Parts are
planned in the launcher (a few seq_starts reads per part, however large the split), and each
part is written by one worker, in parallel, with no merge step. A part's files are written
under temporary names and renamed into place, so a retried bundle writes the same bytes to
the same names. Every part reads the run the launcher opened (flat_tokens.reader refuses a
replaced dataset). At the end the launcher checks every file's size and prints Megatron's
data-path lists, weighted by tokens.

Megatron's GPT datasets expect an end-of-document id between documents, and flat-tokens stores
none: by default each sequence is followed by the end-of-text id of the tokenizer the dataset
records (flat_tokens/megatron.py: dataset_end_of_text), none when it defines none; `--append_eod
ID` chooses the id and `--append_eod none` writes none. The output says which.

An export's own files are listed in its manifest, `PREFIX.flat-tokens-export.json`, written
before any part. `--overwrite` replaces what a manifest lists (parts beyond the new export's
are removed once it has succeeded) and nothing else: a file at a part's name that no manifest
lists is a user's, and is refused. Temporary files (`*.<32 hex>.tmp` beside the parts) are
removed when a part fails, when the export fails, and, after a kill, by the next export.

Exit status: 0 written; 1 the pipeline failed (parts may be missing: rerun with --overwrite);
2 a usage error found before anything is written (no dataset, an id out of range, files that
exist without --overwrite or that no export manifest lists, an end-of-text id that cannot be
known).
"""
from __future__ import annotations

import argparse
import json
import math
import posixpath
import re
import sys
import uuid
from dataclasses import dataclass

from pipeline import logs  # noqa: I001 (before apache_beam: it filters Beam's import-time noise)

import apache_beam as beam  # noqa: E402
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from fsspec.core import url_to_fs

from pipeline import VERSION
from flat_tokens import megatron
from pipeline.options import unknown_options
from flat_tokens.reader import SPLITS, CorruptChunk, DatasetError, FlatTokensSplit, MissingChunk, open_dataset
from flat_tokens.tools.verify import storage_option
from flat_tokens.format import storage_faults

USAGE_ERROR = 2
PIPELINE_FAILED = 1
# A dataset whose stored chunks are damaged or lost fails the export (exit 1, as verify's
# problems do); a path that is not a dataset this tool reads, or whose arrays disagree
# (served_checks), is refused as inspect refuses it (exit 2).
DAMAGED = (CorruptChunk, MissingChunk)
DEFAULT_PART_TOKENS = 1 << 30  # 2 GB of uint16 ids per .bin
MAX_ID = 2**31 - 1
MANIFEST = ".flat-tokens-export.json"  # PREFIX + this: the files an export wrote


class ExportError(ValueError):
    """A usage error found before anything is written (exit 2)."""


@dataclass(frozen=True)
class Part:
    """Sequences [first, stop) of a split, written as `prefix`.bin and .idx."""

    split: str
    index: int
    first: int
    stop: int
    tokens: int  # in the .bin, EOD ids included
    prefix: str


def plan_parts(split: FlatTokensSplit, prefix: str, part_tokens: int, append_eod: bool) -> list[Part]:
    """The split cut at the sequences holding tokens part_tokens, 2*part_tokens, ...: parts of
    about part_tokens tokens (a sequence is never cut), none empty."""
    if len(split) == 0:
        return []
    cuts = sorted({split.sequence_at(k * part_tokens) for k in range(1, math.ceil(split.num_tokens / part_tokens))}
                  - {0})
    bounds = [0, *cuts, len(split)]
    starts = [split.sequence_bounds(b)[0] for b in bounds[:-1]] + [split.num_tokens]
    return [Part(split.split, k, a, b, starts[k + 1] - starts[k] + ((b - a) if append_eod else 0),
                 megatron.part_name(prefix, split.split, k))
            for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


class WritePart(beam.DoFn):
    """Part -> its .bin and .idx, written under temporary names and renamed into place;
    emits (part, bytes of the .bin)."""

    def __init__(self, url: str, storage_options: dict, run_id: str, dtype: str, append_eod: int | None):
        self._url, self._storage_options, self._run_id = url, storage_options, run_id
        self._dtype, self._append_eod = np.dtype(dtype), append_eod
        self._splits = None

    def setup(self):
        self._splits = {}

    def _split(self, name: str) -> FlatTokensSplit:
        if name not in self._splits:  # the run the launcher planned, or DatasetReplaced
            self._splits[name] = FlatTokensSplit(self._url, name, self._storage_options, _identity=self._run_id)
        return self._splits[name]

    def process(self, part: Part):
        split = self._split(part.split)
        lengths = split.sequence_lengths(part.first, part.stop) + (1 if self._append_eod is not None else 0)
        fs, path = url_to_fs(part.prefix, **self._storage_options)
        written = 0
        temporary = f"{path}.bin.{uuid.uuid4().hex}.tmp"
        try:
            with fs.open(temporary, "wb") as f:
                for encoded, bounds in split._sequence_blocks(part.first, part.stop):
                    data = megatron.bin_bytes(encoded, bounds, self._dtype, self._append_eod)
                    f.write(data)
                    written += len(data)
            if written != part.tokens * self._dtype.itemsize:
                raise RuntimeError(f"{part.prefix}.bin: wrote {written} bytes, expected "
                                   f"{part.tokens * self._dtype.itemsize}")
            fs.mv(temporary, f"{path}.bin")
        finally:
            if fs.exists(temporary):
                fs.rm(temporary)
        index = f"{path}.idx.{uuid.uuid4().hex}.tmp"
        try:
            fs.pipe_file(index, megatron.index_bytes(lengths, self._dtype))
            fs.mv(index, f"{path}.idx")
        finally:
            if fs.exists(index):
                fs.rm(index)
        yield part, written


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="flat-tokens export",
        usage="flat-tokens export --format megatron DATASET PREFIX [options] [Beam options]",
        description="Write a committed flat-tokens dataset as Megatron-LM .bin/.idx pairs (a Beam job).",
        epilog="Any Apache Beam option is accepted too (--runner, --direct_num_workers, ...).")
    ap.add_argument("dataset", help="the committed dataset (local path or gs:// URL)")
    ap.add_argument("prefix", help="path prefix of the parts: PREFIX-train-00000.bin/.idx, ...")
    ap.add_argument("--format", required=True, choices=("megatron",), help="the output layout")
    ap.add_argument("--append_eod", type=_eod_choice, default=AUTO, metavar="ID|none",
                    help="the id written after every sequence (Megatron's --append-eod); default: the "
                         "end-of-text id of the dataset's tokenizer, none when it defines none")
    ap.add_argument("--part_tokens", type=int, default=DEFAULT_PART_TOKENS,
                    help=f"about this many tokens per part, each written by one worker (default {DEFAULT_PART_TOKENS})")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export at PREFIX: every file its manifest lists, and nothing else")
    ap.add_argument("--storage_option", type=storage_option, action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec storage option for the dataset and the prefix, repeatable")
    ap.add_argument("--version", action="version", version=VERSION)
    return ap.parse_known_args(argv)


AUTO = "auto"


def _eod_choice(text: str):
    """--append_eod: an id, `none`, or `auto` (the tokenizer's end-of-text id)."""
    if text in ("none", AUTO):
        return None if text == "none" else AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a token id, or none") from None


def end_of_document(choice, splits: dict) -> tuple[int | None, str]:
    """(the id written after every sequence or None, how it was chosen, for the output)."""
    if choice is None:
        return None, "no end-of-document id (--append_eod none)"
    if choice != AUTO:
        return choice, f"id {choice} after every sequence (--append_eod)"
    train = splits["train"]
    try:
        found = megatron.dataset_end_of_text(train.attrs.get("tokenizer"), train.storage_options or None)
    except megatron.NoEndOfText as e:
        raise ExportError(f"--append_eod: {e}") from None
    if found is None:
        return None, (f"no end-of-document id: the dataset's tokenizer ({train.attrs['tokenizer'].get('spec')}) "
                      f"defines no end-of-text token (--append_eod ID to write one)")
    eod, token = found
    return eod, f"id {eod} ({token}, the tokenizer's end-of-text token) after every sequence"


def _temporary_name(base: str) -> re.Pattern:
    """The names of the temporary files an export to PREFIX writes beside its parts (each with a
    uuid4 in it): parts' .bin and .idx, and the manifest."""
    return re.compile(re.escape(base) + r"(-(train|validation)-\d{5}\.(bin|idx)|" + re.escape(MANIFEST)
                      + r")\.[0-9a-f]{32}\.tmp$")


def _part_name(base: str) -> re.Pattern:
    """The names of an export's parts: PREFIX-SPLIT-NNNNN (flat_tokens/megatron.py: part_name)."""
    return re.compile(re.escape(base) + r"-(train|validation)-\d{5}$")


def remove_temporary_files(prefix: str, storage_options: dict) -> int:
    """Removes the temporary files of exports to `prefix` (a killed one's too); their count."""
    fs, path = url_to_fs(prefix, **storage_options)
    parent, base = posixpath.split(path)
    pattern = _temporary_name(base)
    try:
        names = fs.ls(parent or ".", detail=False)
    except FileNotFoundError:
        return 0
    stale = [n for n in names if pattern.match(posixpath.basename(n))]
    for n in stale:
        fs.rm(n)
    return len(stale)


def read_manifest(prefix: str, storage_options: dict) -> list[str] | None:
    """The parts (names `BASE-SPLIT-NNNNN` beside PREFIX, without .bin/.idx) an earlier export
    to `prefix` lists as its own, or None when there is no manifest. ExportError for a file at
    the manifest's name that is not one (or that names files other than this prefix's parts)."""
    fs, path = url_to_fs(prefix, **storage_options)
    name = f"{prefix}{MANIFEST}"
    if not fs.exists(path + MANIFEST):
        return None
    pattern = _part_name(posixpath.basename(path))
    try:
        data = storage_faults.read_json(fs, path + MANIFEST, name)
        parts = data["parts"]
        if data.get("written_by") != "flat-tokens export" or not isinstance(parts, list):
            raise ValueError("not written by flat-tokens export")
        if not all(isinstance(p, str) and pattern.match(p) for p in parts):
            raise ValueError("it lists files that are not this PREFIX's parts")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ExportError(f"{name} exists and is not a flat-tokens export manifest ({e}); move it away, or "
                          f"choose another PREFIX") from None
    return parts


def write_manifest(prefix: str, storage_options: dict, parts: list[str], dataset: str, run_id: str,
                   complete: bool) -> None:
    """PREFIX.flat-tokens-export.json: the parts (names beside PREFIX) this export owns."""
    fs, path = url_to_fs(prefix, **storage_options)
    body = json.dumps({"written_by": "flat-tokens export", "format": "megatron", "dataset": dataset,
                       "run_id": run_id, "complete": complete, "parts": sorted(parts)}, indent=1)
    temporary = f"{path}{MANIFEST}.{uuid.uuid4().hex}.tmp"
    fs.pipe_file(temporary, body.encode())
    fs.mv(temporary, path + MANIFEST)


def plan_export(args) -> tuple[dict, list[Part], np.dtype]:
    """(the splits, every part, the .bin dtype); ExportError for what must be fixed first."""
    so = dict(args.storage_option)
    unknown = unknown_options(args.beam_args)
    if unknown:
        raise ExportError(f"unknown option {unknown[0]}; see --help")
    if args.part_tokens < 1:
        raise ExportError(f"--part_tokens {args.part_tokens}: must be a positive integer")
    if isinstance(args.append_eod, int) and not 0 <= args.append_eod <= MAX_ID:
        raise ExportError(f"--append_eod {args.append_eod}: must be a token id in [0, 2**31-1]")
    try:
        splits = open_dataset(args.dataset, so or None)
    except DAMAGED:
        raise
    except DatasetError as e:
        raise ExportError(str(e)) from None
    args.eod, args.eod_note = end_of_document(args.append_eod, splits)
    top = max([s.max_token_id for s in splits.values()] + [args.eod or 0])
    try:  # planning reads seq_starts: a split whose arrays disagree is found here (served_checks)
        parts = [p for name in SPLITS
                 for p in plan_parts(splits[name], args.prefix, args.part_tokens, args.eod is not None)]
    except DAMAGED:
        raise
    except DatasetError as e:
        raise ExportError(str(e)) from None
    fs, _ = url_to_fs(args.prefix, **so)
    earlier = read_manifest(args.prefix, so)
    ours = set(earlier or ())
    found = [(p, ext) for p in parts for ext in (".bin", ".idx") if fs.exists(f"{p.prefix}{ext}")]
    foreign = [f"{p.prefix}{ext}" for p, ext in found if posixpath.basename(p.prefix) not in ours]
    found = [f"{p.prefix}{ext}" for p, ext in found]
    if foreign:
        raise ExportError(f"{foreign[0]} exists and no export manifest ({args.prefix}{MANIFEST}) lists it, so it is "
                          f"not this tool's to replace ({len(foreign)} such files); move them away, or choose "
                          f"another PREFIX")
    if not args.overwrite and (found or earlier is not None):
        what = found[0] if found else f"{args.prefix}{MANIFEST}"
        raise ExportError(f"{what} exists (an earlier export to this PREFIX); pass --overwrite to replace it, or "
                          f"choose another PREFIX")
    args.earlier_parts = sorted(ours)
    parent = posixpath.dirname(url_to_fs(args.prefix, **so)[1])
    if parent:
        fs.makedirs(parent, exist_ok=True)
    return splits, parts, megatron.dtype_for(top)


def remove_parts(prefix: str, names: list[str], storage_options: dict) -> None:
    """Removes parts (their .bin and .idx), named as a manifest names them, beside `prefix`."""
    fs, path = url_to_fs(prefix, **storage_options)
    for name in names:
        for ext in (".bin", ".idx"):
            target = posixpath.join(posixpath.dirname(path), name + ext)
            if fs.exists(target):
                fs.rm(target)


def check_written(parts: list[Part], dtype: np.dtype, storage_options: dict) -> list[str]:
    """Every part's files exist at the sizes their sequences imply."""
    problems = []
    for p in parts:
        fs, path = url_to_fs(p.prefix, **storage_options)
        for ext, size in ((".bin", p.tokens * dtype.itemsize), (".idx", 34 + 20 * (p.stop - p.first) + 8)):
            got = fs.size(f"{path}{ext}") if fs.exists(f"{path}{ext}") else None
            if got != size:
                problems.append(f"{p.prefix}{ext}: {'missing' if got is None else f'{got} bytes'}, expected {size}")
    return problems


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, beam_args = parse_args(argv)
    args.beam_args = beam_args
    try:
        splits, parts, dtype = plan_export(args)
    except (storage_faults.StorageUnavailable, *DAMAGED) as e:  # not the user's error: the store, or the data
        print(f"flat-tokens: error: {e}", file=sys.stderr)
        return PIPELINE_FAILED
    except (ExportError, OSError) as e:
        print(f"flat-tokens: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    so = dict(args.storage_option)
    run_id = splits["train"].run_id
    options = PipelineOptions(args.beam_args)
    from pipeline.run import in_process_runner  # the same runner choice as `flat-tokens run`
    new = [posixpath.basename(url_to_fs(p.prefix, **so)[1]) for p in parts]
    try:
        remove_temporary_files(args.prefix, so)  # a killed export's
        # Listed before any part is written: a failed or killed export leaves no file the next
        # --overwrite would not know as its own.
        write_manifest(args.prefix, so, sorted(set(args.earlier_parts) | set(new)), args.dataset, run_id, False)
        with beam.Pipeline(runner=in_process_runner(options), options=options) as p:
            (p | "Parts" >> beam.Create(parts)
               | "OnePerWorker" >> beam.Reshuffle()
               | "WritePart" >> beam.ParDo(WritePart(args.dataset, so, run_id, dtype.name, args.eod)))
    except Exception as e:  # Beam wraps worker errors; the last line holds the cause
        cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        remove_temporary_files(args.prefix, so)
        print(f"flat-tokens: error: the export failed; parts may be missing or stale (rerun with --overwrite). "
              f"Cause: {cause}", file=sys.stderr)
        return PIPELINE_FAILED
    problems = check_written(parts, dtype, so)
    if problems:
        print(f"flat-tokens: error: the export is incomplete: {problems[0]} ({len(problems)} problems)",
              file=sys.stderr)
        return PIPELINE_FAILED
    stale = sorted(set(args.earlier_parts) - set(new))
    remove_parts(args.prefix, stale, so)
    write_manifest(args.prefix, so, new, args.dataset, run_id, True)
    print(f"flat-tokens: exported {args.dataset} (run {run_id}) as {len(parts)} Megatron .bin/.idx pairs, "
          f"ids as {dtype.name}, {args.eod_note}" + (f"; removed {len(stale)} parts of the earlier export"
                                                     if stale else ""))
    lists = {}
    for name in SPLITS:
        mine = [p for p in parts if p.split == name]
        lists[name] = megatron.data_path([(p.tokens, p.prefix) for p in mine])
        print(f"  {name}: {len(mine)} parts, {sum(p.tokens for p in mine):,} tokens")
    print("Megatron-LM data arguments (weights are tokens; Megatron normalises them):")
    print(f"  --data-path {lists['train']}")
    if lists["validation"]:
        print(f"  --train-data-path {lists['train']} --valid-data-path {lists['validation']}")
    return 0


if __name__ == "__main__":
    from pipeline.cli import run_command
    from pipeline.export import main as module_main  # so Part and WritePart pickle as pipeline.export's
    sys.exit(run_command(module_main))
