"""How many cores one process of the job may keep busy.

A process sizes its thread pools (the writer's chunk encoders, the tokenizer's threads) by
its share of the machine: all the cores it may run on, or, when the launcher started several
worker processes on one machine (`--local_parallelism`, or Beam's `--direct_num_workers`), the
share the launcher gave each of them in `FLAT_TOKENS_CORES`. Sized by the machine instead,
N workers on N cores ran N x N threads: on 16 cores 16 workers cost 4.7 times the CPU of one
process for the same work (docs/performance.md, "Performance IV").
"""
import os

# Set by the launcher for the worker processes it starts on its own machine.
ENVIRONMENT = "FLAT_TOKENS_CORES"


def available() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def share() -> int:
    """This process's share of the cores: FLAT_TOKENS_CORES when the launcher set it, else
    every core it may run on."""
    try:
        given = int(os.environ.get(ENVIRONMENT, ""))
    except ValueError:
        given = 0
    return max(1, min(given, available())) if given > 0 else available()
