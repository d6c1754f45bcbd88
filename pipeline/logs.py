"""Logging for the command line: our messages plain on stderr, Beam's kept quiet.

Imported before apache_beam, because Beam logs an irrelevant warning ("apitools not found")
through the root logger while it is being imported."""
import logging
import sys

from flat_tokens.tools.cli import exit_process  # noqa: F401 (the job's entry points end through it too)

LOGGER = "flat_tokens"
_NOISE = ("apitools not found",)


class _DropNoise(logging.Filter):
    def filter(self, record):
        return not any(n in record.getMessage() for n in _NOISE)


def configure(level: str = "info") -> None:
    """info: our progress and summary; quiet: warnings and errors only; verbose: everything,
    Beam's own logs included."""
    root = logging.getLogger()
    if not any(getattr(h, "_flat_tokens", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_DropNoise())
        handler._flat_tokens = True
        root.handlers = [handler]
    root.setLevel(logging.DEBUG if level == "verbose" else logging.WARNING)
    # fsspec's read-ahead logs each failed fetch with its traceback, and the error reaches
    # the reader too, which reports it once (a GCS input rewritten during the run).
    logging.getLogger("fsspec.prefetcher").setLevel(logging.NOTSET if level == "verbose" else logging.CRITICAL)
    logging.getLogger(LOGGER).setLevel({"quiet": logging.WARNING, "info": logging.INFO}.get(level, logging.DEBUG))


def log() -> logging.Logger:
    return logging.getLogger(LOGGER)


configure()
