"""The `flat-tokens` console script: `flat-tokens run|verify|inspect|report ...`."""
import importlib
import os
import signal
import sys

from pipeline import VERSION, logs  # noqa: F401 (logs before apache_beam: it filters Beam's import-time noise)
from pipeline import prefetch

COMMANDS = {
    "run": ("pipeline.run", "turn a JSONL corpus into a shuffled, tokenized flat-tokens dataset"),
    "verify": ("pipeline.verify", "check every invariant of a dataset; non-zero exit on any violation"),
    "index": ("pipeline.add_index", "add the dedup index to a dataset built without one (its arrays unchanged)"),
    "inspect": ("pipeline.inspect", "summarize a dataset, show sequences and packed windows"),
    "report": ("pipeline.report", "write a self-contained HTML report of a dataset (docs/report.md)"),
    "export": ("pipeline.export", "write a dataset as Megatron-LM .bin/.idx pairs (a Beam job)"),
}


# What `run` and `export` need beyond the reader's numpy, zarr and fsspec (setup.py).
PIPELINE_ONLY = {"apache_beam", "tokenizers", "orjson", "zstandard", "yaml", "pyarrow"}


def usage() -> str:
    rows = "\n".join(f"  {name:8} {text}" for name, (_, text) in COMMANDS.items())
    return (f"usage: flat-tokens COMMAND [options]\n       flat-tokens --version\n\ncommands:\n{rows}\n\n"
            f"`flat-tokens COMMAND --help` for a command's options.")


# The status of a Unix tool killed by SIGPIPE, as a shell reports it.
CLOSED_STDOUT = 128 + signal.SIGPIPE


def run_command(main, argv=None) -> int:
    """Runs a command's main(argv). A stdout closed by its reader (`flat-tokens inspect ... |
    head -2`) ends the command quietly with status 141, as it ends a Unix tool, instead of a
    BrokenPipeError traceback. (Python ignores SIGPIPE, so the closed pipe is an exception.)"""
    try:
        code = main(argv)
        sys.stdout.flush()  # so a write still in the buffer fails here, not at interpreter exit
        return code
    except BrokenPipeError:
        # Interpreter exit flushes stdout again: point it at /dev/null so that says nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_STDOUT


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(VERSION)
        return 0
    if argv[0] not in COMMANDS:
        print(f"flat-tokens: error: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if argv[0] == "run":
        prefetch.head_start(argv[1:])  # before the run's modules (numpy, Beam) are imported
    try:
        module = importlib.import_module(COMMANDS[argv[0]][0])
    except ModuleNotFoundError as e:
        if e.name not in PIPELINE_ONLY:
            raise
        print(f"flat-tokens: error: `flat-tokens {argv[0]}` needs {e.name}, which this environment lacks: the "
              f"reader-only install (flat-tokens-reader) reads datasets (verify, inspect) but runs no pipeline. "
              f"Install flat-tokens-beam for `run` and `export`.", file=sys.stderr)
        return 2
    return module.main(argv[1:])


def console_script() -> None:
    """The `flat-tokens` entry point: main(), a closed stdout handled as Unix tools do, then
    the process ends without the interpreter's teardown (logs.exit_process)."""
    logs.exit_process(run_command(main))


if __name__ == "__main__":
    console_script()
