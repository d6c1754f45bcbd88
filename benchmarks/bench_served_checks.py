#!/usr/bin/env python3
"""The cost of the reader's checks of what it serves (flat_tokens/served_checks.py).

    python benchmarks/bench_served_checks.py --dataset out.zarr [--rounds 3]

Reads one split in one process: (1) ``for ids in split`` and (2) one epoch of
``packed_batches(LENGTH, BATCH)``, each with the checks as the reader runs them, timed from
inside: every call of a check adds its own thread's CPU time (``time.thread_time``) to a
total, and the loop's CPU time (``time.process_time``: user + sys, all threads) is measured
around it. The checks' share is the first over the second. Both are CPU seconds of the same
loop, so the load of a shared machine inflates them alike (an A/B of wall times there varies
by +-30% between identical runs: benchmarks/README.md). Prints the median of the rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flat_tokens.reader import FlatTokensSplit  # noqa: E402


class TimedChecks:
    """Wraps a split's SplitChecks: each call adds the CPU time of its thread to `seconds`."""

    def __init__(self, checks):
        self._checks, self.seconds, self.calls = checks, 0.0, 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        check = getattr(self._checks, name)

        def timed(*args):
            started = time.thread_time()
            try:
                return check(*args)
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.seconds += spent
                    self.calls += 1
        return timed


def iterate(split: FlatTokensSplit, length: int, batch: int) -> int:
    return sum(ids.size for ids in split)


def packed(split: FlatTokensSplit, length: int, batch: int) -> int:
    return sum(targets.size for _, targets in split.packed_batches(length, batch, epochs=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--split", default="train", choices=("train", "validation"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)
    split = FlatTokensSplit(args.dataset, args.split)
    print(f"reader checks: {args.dataset} {args.split}: {split.num_tokens:,} tokens, {len(split):,} sequences; "
          f"medians of {args.rounds} rounds")
    print(f"  {'read':28s} {'loop CPU s':>10s} {'checks CPU s':>12s} {'share':>7s} {'calls':>7s}  share of each round")
    for name, read in (("iterate", iterate), ("packed", packed)):
        rounds = []
        for _ in range(args.rounds):
            timed = TimedChecks(split._checks)  # the split's own checks, timed (a benchmark's look inside)
            split._checks = timed
            try:
                cpu = time.process_time()
                read(split, args.length, args.batch)
                rounds.append((time.process_time() - cpu, timed.seconds, timed.calls))
            finally:
                split._checks = timed._checks
        loop = statistics.median(r[0] for r in rounds)
        spent = statistics.median(r[1] for r in rounds)
        label = "for ids in split" if name == "iterate" else f"packed_batches({args.length}, {args.batch})"
        print(f"  {label:28s} {loop:10.3f} {spent:12.4f} {spent / loop:7.2%} {rounds[0][2]:7d}  "
              + " ".join(f"{r[1] / r[0]:.2%}" for r in rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
