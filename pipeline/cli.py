"""The `flat-tokens` console script: `flat-tokens run|verify|inspect ...`."""
import importlib
import sys

from pipeline import logs  # (before apache_beam: it filters Beam's import-time noise)
from pipeline import prefetch

COMMANDS = {
    "run": ("pipeline.run", "turn a JSONL corpus into a shuffled, tokenized flat-tokens dataset"),
    "verify": ("pipeline.verify", "check every invariant of a dataset; non-zero exit on any violation"),
    "inspect": ("pipeline.inspect", "summarize a dataset, show sequences and packed windows"),
}


def usage() -> str:
    rows = "\n".join(f"  {name:8} {text}" for name, (_, text) in COMMANDS.items())
    return f"usage: flat-tokens COMMAND [options]\n\ncommands:\n{rows}\n\n`flat-tokens COMMAND --help` for a command's options."


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"flat-tokens: error: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if argv[0] == "run":
        prefetch.tokenizer_from_argv(argv[1:])  # loads while the run's modules are imported
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


def console() -> None:
    """The `flat-tokens` console script: main(), then the process ends (logs.exit_process)."""
    logs.exit_process(main())


if __name__ == "__main__":
    console()
