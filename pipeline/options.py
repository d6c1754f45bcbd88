"""The job's options: a Beam PipelineOptions subclass, so every Beam flag passes straight
through (--runner, --direct_num_workers, --job_endpoint, --project, ...)."""
import argparse
import difflib
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from pipeline import VERSION

DEFAULT_VALIDATION_FRACTION = 0.01
DEFAULT_TOKENS_CHUNK = 1 << 18  # measured: docs/design.md, 'Chunks and codecs'
DEFAULT_SEQ_STARTS_CHUNK = 1 << 16
DEFAULT_SHARD_MB = 64
DEDUP_CHOICES = ("none", "exact", "near")
NEAR_HASHES = (64, 128, 256, 512, 1024)  # signature bins (transforms/tokenize/minhash.py)
NEAR_BANDS = (8, 16, 32, 64)  # at most the fewest bins: every band has a bin or more
MAX_SEED = 1 << 64
REQUIRED_UNLESS_MIXTURE = "required, unless --mixture is given"


class OptionError(ValueError):
    """A bad option value: the message names the option and the fix."""


# ---------------------------------------------------------------------------------------------
# The option table: the one place where the job's own options are declared.
#
# Generated from it: the argparse arguments of FlatTokensOptions (so `--help` and Beam's parsing
# of the same argv), the README option-table check (tests/test_readme.py), and the Dataflow
# template's parameters (`python -m pipeline.template_metadata > templates/dataflow/metadata.json`;
# a test fails while the committed file differs).
#
# To add an option, add one Option(...) to OPTIONS, in its group's place:
#   name          the flag without `--`; also the attribute on FlatTokensOptions
#   group         its --help section (one of GROUPS)
#   type          str, int, float, or bool for a flag (`--name` sets True)
#   default       the value when it is not given
#   help          a phrase for --help; never the default (that is appended from `default`, or
#                 from `default_text` where `default` alone would mislead, e.g. None)
#   choices, repeatable (the flag may be given again, and takes several values at once, as an
#                 unquoted glob the shell expanded gives them; values collect in a list),
#   required      checked by check_options, not by argparse: Beam parses the same argv
#   template      Template(label, kind, ...): how the Dataflow template offers it; or a string
#                 saying why it is not a template parameter
# then regenerate metadata.json, add the option's row to the README's Options table, and, if its
# template kind is new to tests/test_templates.py, sample values there.
# Range checks stay in check_options.


@dataclass(frozen=True)
class Template:
    """The option as a Dataflow Flex Template parameter.

    kind: what a value may be; it sets the parameter type and the validation regex
        (pipeline/template_metadata.py, KINDS): text, count (>= 0), uint64 (a seed), positive_int,
        fraction ([0, 1]), fraction_below_1 ([0, 1)), flag (true|false), choice, gcs_file (one gs://
        file, no glob), gcs_read (a gs:// file, folder or glob), gcs_write (a gs:// path to create),
        tokenizer.
    help: when the parameter means less than the option (one value, on Cloud Storage); else
        the option's help is used.
    choices: kind choice: (value, label, description) for each value the template offers.
    example: a typical value: shown in the help, and the tests check it passes the regex.
    """
    label: str
    kind: str
    help: str | None = None
    choices: tuple[tuple[str, str, str], ...] = ()
    example: str | None = None


@dataclass(frozen=True, kw_only=True)
class Option:
    name: str
    group: str
    help: str
    template: Template | str
    type: type = str
    default: Any = None
    default_text: str | None = None
    choices: tuple = ()
    repeatable: bool = False
    required: bool = False


GROUPS = ("input", "tokenization", "split and shuffle", "output", "limits and tuning", "reporting")
_LAUNCHER_ONLY = "launcher logging only; a Dataflow job's progress and logs are in the Dataflow console"

OPTIONS: tuple[Option, ...] = (
    # input
    Option(name="input", group="input", repeatable=True, default_text=REQUIRED_UNLESS_MIXTURE,
           help="JSONL or Parquet file, directory or glob (local, gs://, any fsspec URL; .gz/.zst/.bz2/.xz "
                "decompressed by extension; *.parquet/*.pq read by row group). "
                "Example: --input 'gs://bucket/corpus/*.jsonl.zst'",
           template=Template("Input JSONL or Parquet files", "gcs_read", example="gs://my-bucket/corpus/*.jsonl.zst",
                             help="JSONL or Parquet file, folder or glob on Cloud Storage; .gz and .zst are "
                                  "decompressed by extension, *.parquet read by row group. One value: for more "
                                  "files, use a glob or a folder. Required unless mixture is given (give one "
                                  "of the two)")),
    Option(name="text_key", group="input", default="text",
           help="JSON key (or Parquet column) holding each document's text",
           template=Template("Text key", "text")),
    Option(name="mixture", group="input",
           help="a YAML or JSON file (local or gs://) listing weighted sources, instead of --input: each "
                "source's share of the train tokens and how often its documents may be reused (docs/mixtures.md)",
           template=Template("Mixture file (instead of input)", "gcs_file",
                             example="gs://my-bucket/mixtures/web-code.yaml",
                             help="A YAML or JSON file on Cloud Storage listing weighted sources, instead of "
                                  "input: each source's name, input (files or globs), weight (its share of the "
                                  "train tokens) and optional max_epochs, validation_input and text_key. Give "
                                  "either input or mixture")),
    Option(name="dedup", group="input", default="none", choices=DEDUP_CHOICES,
           help="none; exact: keep each distinct text once, whichever file or source it comes from; or near: "
                "also keep one text of each cluster of near-copies (MinHash, --near_threshold). A text (a "
                "cluster) is never in both splits, and a file may then be listed twice",
           template=Template("Deduplication", "choice",
                             choices=(("none", "none", "keep every document"),
                                      ("exact", "exact", "keep each distinct text once"),
                                      ("near", "near", "keep one text of each cluster of near-copies")))),
    Option(name="near_threshold", group="input", type=float, default=0.8,
           help="--dedup near: texts whose shingles (--near_shingle) have at least this Jaccard similarity, as "
                "their MinHash signatures estimate it, are near-copies",
           template=Template("Near-duplicate threshold", "fraction", example="0.8")),
    Option(name="near_shingle", group="input", default="words", choices=("words", "tokens"),
           help="--dedup near: shingles are n-grams of words (tokenizer-independent) or of token ids",
           template=Template("Near-duplicate shingles", "choice",
                             choices=(("words", "word n-grams", "independent of the tokenizer"),
                                      ("tokens", "token n-grams", "n-grams of token ids")))),
    Option(name="near_shingle_size", group="input", type=int, default=5,
           help="--dedup near: n, the words (or tokens) of a shingle; a text with fewer has no near-copies",
           template=Template("Near-duplicate shingle size", "positive_int")),
    Option(name="near_hashes", group="input", type=int, default=256, choices=NEAR_HASHES,
           help="--dedup near: bins of each MinHash signature (2 bytes each); more estimate similarity "
                "more closely",
           template=Template("Near-duplicate signature bins", "choice",
                             choices=tuple((str(k), f"{k} bins", f"{2 * k} bytes per document")
                                           for k in NEAR_HASHES))),
    Option(name="near_bands", group="input", type=int, default=32, choices=NEAR_BANDS,
           help="--dedup near: locality-sensitive hashing bands, each of near_hashes / near_bands bins: "
                "texts sharing a band are compared",
           template=Template("Near-duplicate bands", "choice",
                             choices=tuple((str(b), f"{b} bands", "of near_hashes / near_bands bins each")
                                           for b in NEAR_BANDS))),
    Option(name="dedup_report", group="input",
           help="with --dedup exact or near: a directory (local or gs://) for the report of every removed document: "
                "where it was read, the kept document it was matched to, their similarity; Parquet files when it "
                "ends in .parquet, else JSONL (docs/dedup.md)",
           template=Template("Dedup report folder", "gcs_write", example="gs://my-bucket/flat-tokens/dedup-report",
                             help="Cloud Storage folder for the report of every document removed by dedup (where "
                                  "it was read, the kept document it was matched to, their similarity); Parquet "
                                  "files when it ends in .parquet, else JSONL. Needs dedup exact or near")),
    Option(name="dedup_against", group="input", repeatable=True,
           help="with --dedup exact or near: committed datasets (paths or globs, local or gs://; the output itself "
                "is skipped) whose texts (with --dedup near, and their near-copies) this build removes, reading "
                "only their dedup indexes; an earlier dataset's split wins (docs/dedup.md)",
           template=Template("Deduplicate against datasets", "gcs_read", example="gs://my-bucket/flat-tokens/*.zarr",
                             help="Committed datasets (a path or glob on Cloud Storage) whose texts this build "
                                  "removes, reading only their dedup indexes. Needs dedup exact or near")),
    # tokenization
    Option(name="tokenizer", group="tokenization", required=True,
           help="tokenizer.json path or URL; 'bytes' (built in: UTF-8 byte b -> id b+1); or a "
                "HuggingFace hub name when the network allows",
           template=Template("Tokenizer", "tokenizer", example="gs://my-bucket/tokenizers/tokenizer.json",
                             help="A tokenizer.json on Cloud Storage (gs://.../tokenizer.json) or at an https:// "
                                  "URL, 'bytes' (built in: UTF-8 byte b becomes id b+1), or a HuggingFace hub "
                                  "name such as gpt2 or org/name (the https and hub forms need internet access "
                                  "from the launcher and the workers)")),
    Option(name="tokenizer_backend", group="tokenization", default="auto",
           help="auto (fastokens when installed and it agrees with HF tokenizers on the guard's checks, "
                "else hf), hf, fastokens, or a plugin module:factory",
           template=Template("Tokenizer backend", "choice",
                             help="auto (fastokens when it agrees with HF tokenizers on the guard's checks, "
                                  "else hf), hf or fastokens",
                             choices=(("auto", "auto", "fastest backend that passes the guard"),
                                      ("hf", "HF tokenizers", "the reference implementation"),
                                      ("fastokens", "fastokens", "fast; fails the launch if it disagrees with HF")))),
    Option(name="split_special_tokens", group="tokenization", type=bool,
           help="encode special-token text found in documents (such as <|endoftext|>) as ordinary text, not "
                "as the special token's id",
           template=Template("Encode special-token text as text", "flag")),
    Option(name="tokenizer_check_fraction", group="tokenization", type=float, default=0.001,
           help="share of documents re-encoded with HF tokenizers during the run to check a fast backend; "
                "any difference fails the job",
           template=Template("Tokenizer check fraction", "fraction", example="1e-3")),
    Option(name="min_tokens", group="tokenization", type=int, default=0,
           help="drop documents of fewer tokens than this (counted in the summary and stats, as empty ones "
                "are); 0 keeps every non-empty document",
           template=Template("Minimum tokens per document", "count", example="16")),
    Option(name="max_tokens", group="tokenization", type=int, default=0,
           help="documents of more tokens than this are split or truncated (--long_documents); 0: no maximum",
           template=Template("Maximum tokens per document", "count", example="8192")),
    Option(name="long_documents", group="tokenization", choices=("split", "truncate"), default="split",
           help="with --max_tokens: split a longer document into consecutive sequences of at most that many "
                "tokens (kept in order, in one split), or truncate it to its first tokens",
           template=Template("Documents longer than max_tokens", "choice",
                             help="with max_tokens: split (a longer document becomes consecutive sequences of at "
                                  "most max_tokens tokens, kept in order and in one split) or truncate (its first "
                                  "max_tokens tokens)",
                             choices=(("split", "split", "consecutive pieces of at most max_tokens tokens"),
                                      ("truncate", "truncate", "the first max_tokens tokens")))),
    # split and shuffle
    Option(name="seed", group="split and shuffle", type=int, default=0,
           help="seed of the global shuffle and the split: 0 <= seed < 2**64",
           template=Template("Shuffle seed", "uint64", example="42")),
    Option(name="validation_input", group="split and shuffle", repeatable=True,
           help="JSONL or Parquet file/glob that forms the validation split; when given, all of --input is "
                "train (so --validation_fraction is refused)",
           template=Template("Validation input files", "gcs_read", example="gs://my-bucket/corpus/valid/*.jsonl.gz",
                             help="JSONL or Parquet file, folder or glob on Cloud Storage that forms the "
                                  "validation split. When given, all of input is train, and validation_fraction "
                                  "must not be given")),
    Option(name="validation_fraction", group="split and shuffle", type=float,
           default_text=f"{DEFAULT_VALIDATION_FRACTION}",
           help="fraction of --input documents put in validation, chosen by a seeded hash; not allowed with "
                "--validation_input",
           template=Template("Validation fraction", "fraction_below_1", example="0.01")),
    Option(name="num_shards", group="split and shuffle", type=int, default=0,
           help=f"shuffle shards per split (0 = auto: one per ~{DEFAULT_SHARD_MB} MiB of text). "
                f"Changes parallelism and memory only, never the output",
           template=Template("Shuffle shards per split", "count")),
    # output
    Option(name="output", group="output", required=True,
           help="the zarr group to create (local path or gs:// URL)",
           template=Template("Output zarr dataset", "gcs_write", example="gs://my-bucket/flat-tokens/2024-06-01.zarr",
                             help="The zarr group to create on Cloud Storage. The job refuses to start when it "
                                  "exists and is not empty (unless overwrite=true)")),
    Option(name="overwrite", group="output", type=bool,
           help="replace an existing --output written by this tool, or an empty directory; never anything "
                "else (it is uncommitted first, then deleted)",
           template=Template("Replace an existing output", "flag",
                             help="true to replace an existing output written by this tool (it is uncommitted "
                                  "first, then deleted); anything else at the path is refused. With false the "
                                  "job refuses to touch an existing non-empty output")),
    Option(name="restart", group="output", type=bool,
           help="start over: throw away the work an unfinished run of this command kept at --output "
                "(OUTPUT/.flat-tokens-staging) and its chunks, instead of resuming from them",
           template=Template("Start over instead of resuming", "flag",
                             help="true to throw away the work that an earlier, failed job with this output kept "
                                  "there (and the chunks it wrote), instead of resuming from it")),
    Option(name="no_staging", group="output", type=bool,
           help="keep no staging area at --output: a run that fails or is killed starts over from nothing "
                "(saves writing each tokenized batch to the output's storage; any staging area found there is "
                "thrown away, as with --restart)",
           template=Template("Keep no work for a relaunch", "flag",
                             help="true to keep no staging area under the output: a failed job is then relaunched "
                                  "from nothing, but no tokenized batch is written to Cloud Storage during the "
                                  "job")),
    Option(name="rejected_output", group="output", default_text="OUTPUT.rejected",
           help="directory for the rejected-lines report (file, line, reason, excerpt); "
                "OUTPUT.rejected is next to the zarr group",
           template=Template("Rejected-lines report folder", "gcs_write",
                             example="gs://my-bucket/flat-tokens/rejected/2024-06-01",
                             help="Cloud Storage folder for the report of rejected input lines (file, line, "
                                  "reason, excerpt); OUTPUT.rejected is next to the zarr group")),
    Option(name="record_sources", group="output", type=bool,
           help="also write each split's seq_sources: the source (mixture source, or --input pattern) of every "
                "sequence, one uint16 each, and the names as the root attribute sources; an extension plain "
                "flat-tokens readers ignore (always on with --mixture)",
           template=Template("Record each sequence's source", "flag",
                             help="true to also write each split's seq_sources array: the source (mixture source, "
                                  "or input pattern) of every sequence, an extension plain flat-tokens readers "
                                  "ignore; always on with a mixture")),
    Option(name="zarr_format", group="output", type=int, default=2, choices=(2, 3),
           help="2 (readable by zarr 2.x and seqax) or 3",
           template=Template("Zarr format", "choice",
                             choices=(("2", "zarr format 2", "readable by zarr 2.x, zarr 3.x and seqax"),
                                      ("3", "zarr format 3", "needs zarr-python 3; allows sharding")))),
    Option(name="tokens_chunk_size", group="output", type=int, default=DEFAULT_TOKENS_CHUNK,
           help="encoded_tokens chunk, in tokens",
           template=Template("encoded_tokens chunk size", "positive_int")),
    Option(name="seq_starts_chunk_size", group="output", type=int, default=DEFAULT_SEQ_STARTS_CHUNK,
           help="seq_starts chunk, in entries",
           template=Template("seq_starts chunk size", "positive_int")),
    Option(name="chunks_per_shard", group="output", type=int, default=0,
           help="zarr 3 only: store this many chunks per shard object (0 = no sharding)",
           template=Template("Chunks per zarr shard", "count")),
    Option(name="codec", group="output", default="zstd", choices=("zstd", "blosc-zstd", "blosc-lz4"),
           help="chunk compression: zstd (level 1: on real GPT-2 tokens 35% smaller than Blosc zstd with "
                "bit-shuffle, and faster both ways), blosc-zstd or blosc-lz4",
           template=Template("Chunk compression", "choice",
                             choices=(("zstd", "zstd level 1", "smallest output on real text"),
                                      ("blosc-zstd", "Blosc zstd(3) + bit-shuffle", "smaller on random-looking ids"),
                                      ("blosc-lz4", "Blosc lz4 + bit-shuffle", "fastest to encode")))),
    # limits and tuning
    Option(name="max_rejected_fraction", group="limits and tuning", type=float, default=0.001,
           help="fail the job when more than this fraction of non-blank lines is rejected",
           template=Template("Maximum rejected fraction", "fraction")),
    Option(name="read_range_mb", group="limits and tuning", type=int, default=64,
           help="uncompressed files are read in parallel ranges of this many MiB (2**20 bytes)",
           template=Template("Read range (MiB)", "positive_int")),
    Option(name="batch_documents", group="limits and tuning", type=int, default=8192,
           help="documents per batch between stages",
           template=Template("Documents per batch", "positive_int")),
    Option(name="local_parallelism", group="limits and tuning", default="auto",
           help="worker processes of the in-process runner (no --runner given): auto (from the cores and the "
                "input's size: one process on one core or below 1 GiB of input, else one per core), or a number (1: one "
                "process, which uses threads), at most 4 per core (more is refused, exit 2); Beam's "
                "--direct_running_mode and --direct_num_workers win when given; the output is the same whatever it is",
           template="the in-process runner's only; on Dataflow the workers are --num_workers and --max_num_workers"),
    Option(name="storage_patience", group="limits and tuning", type=float, default=300.0,
           help="seconds one object of the store may keep failing (503, 429, resets, timeouts) or stalling before "
                "the run fails with 'storage unavailable' (exit 1; the same command resumes); a read whose bytes "
                "fail their checksum is read again before it is called damaged (docs/failures.md, 'Storage faults')",
           template="the launcher's and local workers' only (FLAT_TOKENS_STORAGE_PATIENCE); Dataflow workers keep "
                    "the default"),
    Option(name="storage_request_timeout", group="limits and tuning", type=float, default=120.0,
           help="seconds one request to Cloud Storage may take (gcsfs's requests_timeout) before it is cut and "
                "retried; a stalled request never waits longer",
           template="the launcher's and local workers' only (FLAT_TOKENS_REQUEST_TIMEOUT); Dataflow workers keep "
                    "the default"),
    # reporting
    Option(name="summary_json", group="reporting",
           help="also write the end-of-run summary as JSON to this path (for schedulers)",
           template="a file on the launcher VM, which is discarded; on Dataflow the same stats are the "
                    "committed dataset's root attributes"),
    Option(name="report", group="reporting",
           help="after the run, also write the dataset's self-contained HTML report (flat-tokens report, "
                "docs/report.md) to this path, local or gs://; a report that cannot be written is a warning",
           template="written by the launcher once the job is done, and a Dataflow job is not waited for: run "
                    "`flat-tokens report OUTPUT --html PATH` on the committed dataset"),
    Option(name="progress_interval", group="reporting", type=float, default=10.0,
           help="seconds between progress lines on local runners", template=_LAUNCHER_ONLY),
    Option(name="quiet", group="reporting", type=bool,
           help="only warnings, errors and the final summary (no progress lines)", template=_LAUNCHER_ONLY),
    Option(name="verbose", group="reporting", type=bool,
           help="debug logging, Beam's own logs and full tracebacks included", template=_LAUNCHER_ONLY),
)


def default_text(o: Option) -> str:
    """The default as --help, the README and the template state it."""
    if o.required:
        return "required"
    if o.default_text is not None:
        return o.default_text
    if o.type is bool:
        return "off"
    return "none" if o.default is None else str(o.default)


def argparse_help(o: Option) -> str:
    extra = ["repeatable"] if o.repeatable else []
    if o.required or o.type is not bool and (o.default is not None or o.default_text is not None):
        stated = default_text(o)
        extra.append(stated if stated.startswith("required") else f"default {stated}")
    text = o.help + (f" ({'; '.join(extra)})" if extra else "")
    return text.replace("%", "%%")  # argparse formats help with %


def add_option(parser, o: Option) -> None:
    if o.type is bool:
        parser.add_argument(f"--{o.name}", action="store_true", default=False, help=argparse_help(o))
        return
    kwargs = {"type": o.type} if o.type is not str else {}
    if o.choices:
        kwargs["choices"] = o.choices
    if o.repeatable:
        # Several values after one flag, not only the flag repeated: `--input data/*.jsonl`
        # unquoted reaches us as one path per file, and Beam would drop all but the first.
        kwargs.update(action="extend", nargs="+")
    parser.add_argument(f"--{o.name}", default=o.default, help=argparse_help(o), **kwargs)


class FlatTokensOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        for group in GROUPS:
            g = parser.add_argument_group(group)
            for o in OPTIONS:
                if o.group == group:
                    add_option(g, o)


class ViewsMadeOnce(PipelineOptions):
    """PipelineOptions that make each view (`view_as(StandardOptions)`, ...) once.

    Beam's view_as builds an argument parser over every registered option and parses the
    command line again on each call; applying our graph calls it ~270 times (~0.3 s on
    the command line's critical path). Views of one options object share its values, so
    one view per class is the same as a new one each time."""

    def view_as(self, cls):
        views = self.__dict__.setdefault("_views_made", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]


def check_options(o: FlatTokensOptions) -> None:
    """Raises OptionError for a missing or out-of-range value, naming the option."""
    if o.input and o.mixture:
        raise OptionError("--input and --mixture cannot be combined: list every input as a source of the mixture")
    if not o.input and not o.mixture:
        raise OptionError("--input is required (or --mixture, a file of weighted sources)")
    if o.mixture and o.validation_input:
        raise OptionError("--validation_input cannot be combined with --mixture: give each source its own "
                          "validation_input in the mixture file")
    for name in ("output", "tokenizer"):
        if not getattr(o, name):
            raise OptionError(f"--{name} is required")
    if o.validation_fraction is not None and not 0 <= o.validation_fraction < 1:
        raise OptionError(f"--validation_fraction {o.validation_fraction}: must be in [0, 1)")
    if o.validation_fraction and o.validation_input:
        # With --validation_input all of --input is train: a fraction would be silently ignored.
        raise OptionError(f"--validation_fraction {o.validation_fraction} cannot be combined with "
                          f"--validation_input (then all of --input is train); give only one of them")
    if not 0 <= o.seed < MAX_SEED:
        # The seeds a trainer's reader (flat_tokens.reader: numpy's SeedSequence) takes too.
        raise OptionError(f"--seed {o.seed}: must be in [0, 2**64)")
    if not 0 <= o.tokenizer_check_fraction <= 1:
        raise OptionError(f"--tokenizer_check_fraction {o.tokenizer_check_fraction}: must be in [0, 1]")
    if not 0 <= o.max_rejected_fraction <= 1:
        raise OptionError(f"--max_rejected_fraction {o.max_rejected_fraction}: must be in [0, 1]")
    for name in ("tokens_chunk_size", "seq_starts_chunk_size", "read_range_mb", "batch_documents"):
        if getattr(o, name) < 1:
            raise OptionError(f"--{name} {getattr(o, name)}: must be a positive integer")
    if o.min_tokens < 0 or o.max_tokens < 0:
        raise OptionError("--min_tokens and --max_tokens must be >= 0 (0: no limit)")
    if o.max_tokens and o.min_tokens > o.max_tokens:
        raise OptionError(f"--min_tokens {o.min_tokens} is above --max_tokens {o.max_tokens}: every document kept "
                          f"would be cut below the minimum; lower --min_tokens or raise --max_tokens")
    if o.long_documents != "split" and not o.max_tokens:
        raise OptionError(f"--long_documents {o.long_documents} needs --max_tokens (the length above which a "
                          f"document is split or truncated)")
    if o.local_parallelism != "auto" and not (o.local_parallelism.isdigit() and int(o.local_parallelism) >= 1):
        raise OptionError(f"--local_parallelism {o.local_parallelism}: use auto, or a number of processes >= 1 "
                          f"(1: one process)")
    if o.num_shards < 0 or o.chunks_per_shard < 0:
        raise OptionError("--num_shards and --chunks_per_shard must be >= 0")
    if o.chunks_per_shard and o.zarr_format != 3:
        raise OptionError("--chunks_per_shard needs --zarr_format 3 (zarr 2 has no sharding)")
    check_near_options(o)


NEAR_OPTIONS = ("near_threshold", "near_shingle", "near_shingle_size", "near_hashes", "near_bands")


def check_near_options(o: FlatTokensOptions) -> None:
    # As --long_documents without --max_tokens: an option that would be silently ignored is
    # refused. "Given" is "set to other than its default" (the options object holds values,
    # not the command line; a Dataflow template passes every parameter, defaults included).
    if o.dedup_report and o.dedup == "none":
        raise OptionError(f"--dedup_report {o.dedup_report} needs --dedup exact or near (without dedup nothing is "
                          f"removed to report)")
    if o.dedup_against and o.dedup == "none":
        raise OptionError(f"--dedup_against {o.dedup_against[0]} needs --dedup exact or near (it removes the texts of "
                          f"earlier datasets as copies)")
    if o.dedup != "near":
        defaults = {opt.name: opt.default for opt in OPTIONS}
        given = [name for name in NEAR_OPTIONS if getattr(o, name) != defaults[name]]
        if given:
            raise OptionError(f"--{given[0]} {getattr(o, given[0])} needs --dedup near (it only tunes near-duplicate "
                              f"removal; with --dedup {o.dedup} it would be ignored)")
    if not 0 <= o.near_threshold <= 1:
        raise OptionError(f"--near_threshold {o.near_threshold}: must be in [0, 1]")
    if o.near_shingle_size < 1:
        raise OptionError(f"--near_shingle_size {o.near_shingle_size}: must be a positive integer")


def validation_fraction(o: FlatTokensOptions) -> float:
    if o.validation_fraction is not None:
        return o.validation_fraction
    return 0.0 if o.validation_input else DEFAULT_VALIDATION_FRACTION


def _every_option_parser() -> _BeamArgumentParser:
    """A parser of this job's options and every installed Beam options class, as Beam builds it."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser


def unknown_options(argv: list[str]) -> list[str]:
    """The arguments that neither this job nor any installed Beam options class takes: unknown
    flags, and values no flag takes (`--tokenizer bytes extra`).

    Beam itself only logs a warning for these ("Discarding unparseable args") and goes on: a
    misspelt --ouput, or the second file of an unquoted glob after a flag that takes one value,
    would be silently ignored."""
    _, unknown = _every_option_parser().parse_known_args(argv)
    return unknown


def unknown_option_message(argv: list[str], unknown: str) -> str:
    """What to say about the first argument unknown_options found, with the fix."""
    if not unknown.startswith("-"):
        at = argv.index(unknown) if unknown in argv else 0
        flag = next((j for j in range(at - 1, -1, -1) if argv[j].startswith("-")), None)
        after = f" (after {' '.join(argv[flag:at])})" if flag is not None else ""
        return (f"unexpected argument {unknown}{after}: no option takes it. Only --input and --validation_input "
                f"take several values; quote a glob ('data/*.jsonl') or put the flag before each value; see --help")
    name = unknown.split("=", 1)[0]
    known = [s for s in _every_option_parser()._option_string_actions if s.startswith("--")]
    guess = "--" + name.lstrip("-").replace("-", "_")
    if guess not in known:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        guess = close[0] if close else None
    return f"unknown option {name}" + (f"; did you mean {guess}?" if guess else "") + " See --help"


def option_value_error(argv: list[str]) -> str | None:
    """The first value of one of this job's options that argparse would refuse (a choice it
    does not offer, a number that is not one), said in one line as an unknown option is; None
    when every value parses. Beam's parser would print its whole usage block first."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    FlatTokensOptions._add_argparse_args(parser)
    try:
        parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        return f"{e.argument_name}: {e.message}; see --help"
    return None


def help_text() -> str:
    parser = argparse.ArgumentParser(
        prog="flat-tokens run",
        # Short, with the required options first: argparse's own line lists every option.
        usage="flat-tokens run (--input GLOB | --mixture FILE) --tokenizer SPEC --output PATH [options] "
              "[Beam options]\n       flat-tokens run --help | --version",
        description="Turn a JSONL corpus into a globally shuffled, tokenized flat-tokens zarr dataset.",
        epilog="Any Apache Beam option is accepted too (--runner, --direct_num_workers, "
               "--direct_running_mode, --job_endpoint, --project, --region, --temp_location, ...).\n\n"
               "example:\n  flat-tokens run --input 'corpus/*.jsonl.gz' --tokenizer tokenizer.json "
               "--output out/corpus.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    FlatTokensOptions._add_argparse_args(parser)
    parser.add_argument("--version", action="version", version=VERSION, help="print the version and exit")
    return parser.format_help()
