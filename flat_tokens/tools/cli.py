"""The reading half of the `flat-tokens` console script: `flat-tokens verify|inspect|report ...`.

The reader-only install (reader/setup.py) runs this one; the full install's script
(pipeline/cli.py) adds the Beam jobs, `run` and `export`, to the same commands."""
import importlib
import logging
import os
import signal
import sys

from flat_tokens import VERSION

# name -> (module, what it does)
COMMANDS = {
    "verify": ("flat_tokens.tools.verify", "check every invariant of a dataset; non-zero exit on any violation"),
    "inspect": ("flat_tokens.tools.inspect", "summarize a dataset, show sequences and packed windows"),
    "report": ("flat_tokens.tools.report", "write a self-contained HTML report of a dataset (docs/report.md)"),
}
JOB_COMMANDS = ("run", "export", "index")  # the job's commands: the full distribution's (pipeline/cli.py)

# The status of a Unix tool killed by SIGPIPE, as a shell reports it.
CLOSED_STDOUT = 128 + signal.SIGPIPE


def usage(commands: dict) -> str:
    rows = "\n".join(f"  {name:8} {text}" for name, (_, text) in commands.items())
    return (f"usage: flat-tokens COMMAND [options]\n       flat-tokens --version\n\ncommands:\n{rows}\n\n"
            f"`flat-tokens COMMAND --help` for a command's options.")


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


def needs_full_install(command: str, why: str) -> int:
    """The one line (and exit 2) for a job's command where only the reader is installed."""
    print(f"flat-tokens: error: `flat-tokens {command}` {why}: the reader-only install (flat-tokens-reader) "
          f"reads datasets (verify, inspect, report) but runs no pipeline. Install flat-tokens-beam for "
          f"`run`, `export` and `index`.", file=sys.stderr)
    return 2


def dispatch(argv, commands: dict, missing: set, before=None) -> int:
    """`flat-tokens COMMAND ...`: imports the command's module and runs its main. A module
    needing a package in `missing` (what only the full install has) says which install runs it.
    `before(name, args)` runs first (the full install's head start for `run`)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(commands))
        return 0 if argv else 2
    if argv[0] == "--version":
        print(VERSION)
        return 0
    if argv[0] not in commands:
        if argv[0] in JOB_COMMANDS:
            return needs_full_install(argv[0], "is the job's")
        print(f"flat-tokens: error: unknown command {argv[0]!r}\n\n{usage(commands)}", file=sys.stderr)
        return 2
    if before is not None:
        before(argv[0], argv[1:])
    try:
        module = importlib.import_module(commands[argv[0]][0])
    except ModuleNotFoundError as e:
        if e.name not in missing:
            raise
        return needs_full_install(argv[0], f"needs {e.name}, which this environment lacks")
    return module.main(argv[1:])


def main(argv=None) -> int:
    return dispatch(list(sys.argv[1:] if argv is None else argv), COMMANDS, set())


def _observed() -> bool:
    """Whether a profiler or tracer (cProfile, coverage, a debugger) is watching this process."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    # From Python 3.12 cProfile and coverage may watch through sys.monitoring instead.
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(
        monitoring.get_tool(tool) is not None for tool in (monitoring.PROFILER_ID, monitoring.COVERAGE_ID))


def exit_process(code: int) -> None:
    """Ends a command-line process once its output is flushed, without the interpreter's
    teardown: freeing the tokenizers, a last garbage collection over Beam's objects and
    module cleanup measured 0.3 s of CPU at the end of every run, and do nothing the
    operating system does not do when the process ends. Files are closed by then (the
    commands write through `with` blocks); only the console script and `python -m` use it.

    A profiler or coverage tracer writes its data during that teardown, so under one the
    process exits the ordinary way."""
    if _observed():
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def console_script() -> None:
    """The reader-only install's `flat-tokens` entry point: main(), a closed stdout handled as
    Unix tools do, then the process ends without the interpreter's teardown (exit_process)."""
    exit_process(run_command(main))


if __name__ == "__main__":
    console_script()
