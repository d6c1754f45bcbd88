"""The `flat-tokens` console script: `flat-tokens run|verify|inspect|report|export ...`.

The reading commands are flat_tokens/tools/cli.py's (the reader-only install runs that
one); this one adds the Beam jobs."""
import sys

from pipeline import logs  # noqa: F401 (logs before apache_beam: it filters Beam's import-time noise)
from pipeline import prefetch
from flat_tokens.tools import cli as reading
from flat_tokens.tools.cli import CLOSED_STDOUT, run_command  # noqa: F401 (this module's API, as before)

COMMANDS = {
    "run": ("pipeline.run", "turn a JSONL corpus into a shuffled, tokenized flat-tokens dataset"),
    **reading.COMMANDS,
    "index": ("pipeline.add_index", "add the dedup index to a dataset built without one (its arrays unchanged)"),
    "export": ("pipeline.export", "write a dataset as Megatron-LM .bin/.idx pairs (a Beam job)"),
}

# What `run` and `export` need beyond the reader's numpy, zarr and fsspec (setup.py).
PIPELINE_ONLY = {"apache_beam", "tokenizers", "orjson", "zstandard", "yaml", "pyarrow"}


def head_start(command: str, args: list) -> None:
    if command == "run":
        prefetch.head_start(args)  # before the run's modules (numpy, Beam) are imported


def main(argv=None) -> int:
    return reading.dispatch(list(sys.argv[1:] if argv is None else argv), COMMANDS, PIPELINE_ONLY, head_start)


def console_script() -> None:
    """The `flat-tokens` entry point: main(), a closed stdout handled as Unix tools do, then
    the process ends without the interpreter's teardown (exit_process)."""
    logs.exit_process(run_command(main))


if __name__ == "__main__":
    console_script()
