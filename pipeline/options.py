"""The job's options: a Beam PipelineOptions subclass, so every Beam flag passes straight
through (--runner, --direct_num_workers, --job_endpoint, --project, ...)."""
import argparse

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from pipeline import VERSION

DEFAULT_VALIDATION_FRACTION = 0.01
DEFAULT_TOKENS_CHUNK = 1 << 18  # measured: docs/design.md, 'Chunks and codecs'
DEFAULT_SEQ_STARTS_CHUNK = 1 << 16
DEFAULT_SHARD_MB = 64
REQUIRED = ("input", "output", "tokenizer")  # checked by check_options, so Beam's parser keeps them optional


class OptionError(ValueError):
    """A bad option value: the message names the option and the fix."""


class FlatTokensOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        g = parser.add_argument_group("input")
        g.add_argument("--input", action="append", default=None,
                       help="JSONL file, directory or glob (local, gs://, any fsspec URL; .gz/.zst by "
                            "extension). Repeatable. Example: --input 'gs://bucket/corpus/*.jsonl.zst'")
        g.add_argument("--text_key", default="text", help="JSON key holding each document's text (default: text)")

        g = parser.add_argument_group("tokenization")
        g.add_argument("--tokenizer", default=None,
                       help="tokenizer.json path or URL; 'bytes' (built in: UTF-8 byte b -> id b+1); or a "
                            "HuggingFace hub name when the network allows")
        g.add_argument("--tokenizer_backend", default="auto",
                       help="auto (default: fastokens when installed and it agrees with HF tokenizers on the "
                            "guard's checks, else hf), hf, fastokens, or a plugin module:factory")
        g.add_argument("--tokenizer_check_fraction", type=float, default=0.001,
                       help="share of documents re-encoded with HF tokenizers during the run to check a fast "
                            "backend; any difference fails the job (default 0.001)")

        g = parser.add_argument_group("split and shuffle")
        g.add_argument("--seed", type=int, default=0, help="seed of the global shuffle and the split (default 0)")
        g.add_argument("--validation_input", action="append", default=None,
                       help="JSONL file/glob that forms the validation split (repeatable); when given, "
                            "all of --input is train (so --validation_fraction is refused)")
        g.add_argument("--validation_fraction", type=float, default=None,
                       help=f"fraction of --input documents put in validation, chosen by a seeded hash "
                            f"(default {DEFAULT_VALIDATION_FRACTION}; not allowed with --validation_input)")
        g.add_argument("--num_shards", type=int, default=0,
                       help=f"shuffle shards per split (0 = auto: one per ~{DEFAULT_SHARD_MB} MB of text). "
                            f"Changes parallelism and memory only, never the output")

        g = parser.add_argument_group("output")
        g.add_argument("--output", default=None, help="the zarr group to create (local path or gs:// URL)")
        g.add_argument("--overwrite", action="store_true", default=False,
                       help="replace an existing --output (it is uncommitted first, then deleted)")
        g.add_argument("--rejected_output", default=None,
                       help="directory for the rejected-lines report (file, line, reason, excerpt); "
                            "default: OUTPUT.rejected, next to the zarr group")
        g.add_argument("--zarr_format", type=int, default=2, choices=(2, 3),
                       help="2 (default: readable by zarr 2.x and seqax) or 3")
        g.add_argument("--tokens_chunk_size", type=int, default=DEFAULT_TOKENS_CHUNK,
                       help=f"encoded_tokens chunk, in tokens (default {DEFAULT_TOKENS_CHUNK})")
        g.add_argument("--seq_starts_chunk_size", type=int, default=DEFAULT_SEQ_STARTS_CHUNK,
                       help=f"seq_starts chunk, in entries (default {DEFAULT_SEQ_STARTS_CHUNK})")
        g.add_argument("--chunks_per_shard", type=int, default=0,
                       help="zarr 3 only: store this many chunks per shard object (0 = no sharding)")
        g.add_argument("--codec", default="zstd", choices=("zstd", "blosc-zstd", "blosc-lz4"),
                       help="chunk compression (default zstd: level 3, measured 39%% smaller than Blosc "
                            "zstd with bit-shuffle on real GPT-2 tokens, and faster)")

        g = parser.add_argument_group("limits and tuning")
        g.add_argument("--max_rejected_fraction", type=float, default=0.001,
                       help="fail the job when more than this fraction of non-blank lines is rejected (default 0.001)")
        g.add_argument("--read_range_mb", type=int, default=64,
                       help="uncompressed files are read in parallel ranges of this size (default 64)")
        g.add_argument("--batch_documents", type=int, default=8192,
                       help="documents per batch between stages (default 8192)")

        g = parser.add_argument_group("reporting")
        g.add_argument("--summary_json", default=None,
                       help="also write the end-of-run summary as JSON to this path (for schedulers)")
        g.add_argument("--progress_interval", type=float, default=10.0,
                       help="seconds between progress lines on local runners (default 10)")
        g.add_argument("--quiet", action="store_true", default=False,
                       help="only warnings, errors and the final summary (no progress lines)")
        g.add_argument("--verbose", action="store_true", default=False,
                       help="debug logging, Beam's own logs and full tracebacks included")


def check_options(o: FlatTokensOptions) -> None:
    """Raises OptionError for a missing or out-of-range value, naming the option."""
    for name in REQUIRED:
        if not getattr(o, name):
            raise OptionError(f"--{name} is required")
    if o.validation_fraction is not None and not 0 <= o.validation_fraction < 1:
        raise OptionError(f"--validation_fraction {o.validation_fraction}: must be in [0, 1)")
    if o.validation_fraction and o.validation_input:
        # With --validation_input all of --input is train: a fraction would be silently ignored.
        raise OptionError(f"--validation_fraction {o.validation_fraction} cannot be combined with "
                          f"--validation_input (then all of --input is train); give only one of them")
    if not 0 <= o.tokenizer_check_fraction <= 1:
        raise OptionError(f"--tokenizer_check_fraction {o.tokenizer_check_fraction}: must be in [0, 1]")
    if not 0 <= o.max_rejected_fraction <= 1:
        raise OptionError(f"--max_rejected_fraction {o.max_rejected_fraction}: must be in [0, 1]")
    for name in ("tokens_chunk_size", "seq_starts_chunk_size", "read_range_mb", "batch_documents"):
        if getattr(o, name) < 1:
            raise OptionError(f"--{name} {getattr(o, name)}: must be a positive integer")
    if o.num_shards < 0 or o.chunks_per_shard < 0:
        raise OptionError("--num_shards and --chunks_per_shard must be >= 0")
    if o.chunks_per_shard and o.zarr_format != 3:
        raise OptionError("--chunks_per_shard needs --zarr_format 3 (zarr 2 has no sharding)")


def validation_fraction(o: FlatTokensOptions) -> float:
    if o.validation_fraction is not None:
        return o.validation_fraction
    return 0.0 if o.validation_input else DEFAULT_VALIDATION_FRACTION


def unknown_options(argv: list[str]) -> list[str]:
    """Flags that neither this job nor any installed Beam options class knows.

    Beam itself only logs a warning for these and goes on; a misspelt --ouput must fail."""
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(argv)
    return [a for a in unknown if a.startswith("-")]


def help_text() -> str:
    parser = argparse.ArgumentParser(
        prog="flat-tokens run",
        # Short, with the three required options first: argparse's own line lists all 25 options.
        usage="flat-tokens run --input GLOB --tokenizer SPEC --output PATH [options] [Beam options]\n"
              "       flat-tokens run --help | --version",
        description="Turn a JSONL corpus into a globally shuffled, tokenized flat-tokens zarr dataset.",
        epilog="Any Apache Beam option is accepted too (--runner, --direct_num_workers, "
               "--direct_running_mode, --job_endpoint, --project, --region, --temp_location, ...).\n\n"
               "example:\n  flat-tokens run --input 'corpus/*.jsonl.gz' --tokenizer tokenizer.json "
               "--output out/corpus.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    FlatTokensOptions._add_argparse_args(parser)
    for action in parser._actions:
        if action.dest in REQUIRED:
            action.help = "(required) " + action.help
    parser.add_argument("--version", action="version", version=VERSION, help="print the version and exit")
    return parser.format_help()
