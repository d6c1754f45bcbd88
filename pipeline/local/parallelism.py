"""How many processes a local run uses: `--local_parallelism`, mapped onto Beam's in-process
runner.

One process (Beam's `in_memory` mode) already keeps several cores busy: the tokenizer encodes
each batch on threads of its own, and the writer compresses chunks on a pool of threads. What
one process cannot spread is the rest: reading and parsing JSON, the shuffle, the gathering
of each shard. Several worker processes (`multi_processing`, forked from the launcher:
pipeline/local/forked_workers.py) each do all of it for part of the input, and each sizes its
threads by its share of the cores (transforms/cores.py).

`--local_parallelism auto` (the default) picks from the cores this process may run on and the
size of the input, as HF datasets' `num_proc` or datatrove's `workers` are picked by hand:

- one process on a single core, or below MULTI_PROCESS_MIN_BYTES of input: a small input
  does not pay for the workers' stages (on a quiet 2-core machine, 250 MB: two forked
  workers 0.95x the wall and 1.06x the CPU of one process);
- else one worker process per core, and no more workers than the input has read ranges (on
  2 cores, 1.25 GB: two forked workers took 0.77x the wall and 0.93x the CPU of one process;
  docs/performance.md, "Performance IV", has the measurements).

`--local_parallelism N` asks for N worker processes (1: the one process). Beam's own options
win when given (`--direct_running_mode`, `--direct_num_workers`): `multi_threading` is
reachable that way. Other runners decide their own parallelism (Dataflow's --num_workers,
Flink's --parallelism): there `--local_parallelism N` is refused, since it would change
nothing. More than MAX_WORKERS_PER_CORE worker processes per core are refused too. The
output is the same bytes whatever the parallelism (tests/test_parallelism.py).
"""
from dataclasses import asdict, dataclass

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from pipeline.options import OptionError
from transforms import cores

AUTO = "auto"
IN_MEMORY, MULTI_PROCESSING, MULTI_THREADING = "in_memory", "multi_processing", "multi_threading"
# The rule `auto` follows; measured in docs/performance.md, "Performance IV".
MULTI_PROCESS_MIN_CORES = 2
MULTI_PROCESS_MIN_BYTES = 1 << 30
BEAM_OPTIONS = ("--direct_running_mode", "--direct_num_workers")
# `--local_parallelism N` above this many worker processes per core is refused: each worker is
# a whole pipeline (its reads, tokenizer, shuffle buffers and writer threads), so more of them
# than cores only adds memory and contention; 1000 on 2 cores forked 1000 processes that read
# nothing for minutes and died. A few per core still leaves room for workers that wait on
# object-store reads.
MAX_WORKERS_PER_CORE = 4


@dataclass(frozen=True)
class Parallelism:
    """What a run used: Beam's running mode, its worker count, the cores it could use, and
    who decided (`auto`, `--local_parallelism`, `Beam options`, or `the runner`) and why."""
    mode: str
    workers: int
    cores: int
    chosen_by: str
    reason: str = ""

    @property
    def cores_per_worker(self) -> int:
        return max(1, self.cores // self.workers) if self.mode == MULTI_PROCESSING else self.cores

    def report(self) -> dict:
        return {**asdict(self), "cores_per_worker": self.cores_per_worker}


def parse(value: str) -> str | int:
    """`auto`, or a number of processes (checked by pipeline.options.check_options)."""
    return AUTO if value == AUTO else int(value)


def given_beam_options(argv: list[str]) -> list[str]:
    """The Beam options of the in-process runner's parallelism given on a command line."""
    return [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in BEAM_OPTIONS]


def auto_workers(available: int, input_bytes: int, read_units: int) -> tuple[int, str]:
    """(worker processes, why) for `--local_parallelism auto`; 1 means the one in-process worker."""
    if available < MULTI_PROCESS_MIN_CORES:
        return 1, "one core" if available == 1 else f"fewer than {MULTI_PROCESS_MIN_CORES} cores"
    if input_bytes < MULTI_PROCESS_MIN_BYTES:
        return 1, f"less than {MULTI_PROCESS_MIN_BYTES / 2**30:g} GiB of input"
    workers = max(1, min(available, read_units))
    why = "one per core" if workers == available else f"one per read range ({read_units})"
    return workers, why


def check_requested(requested: int, available: int) -> None:
    """Refuses `--local_parallelism N` above MAX_WORKERS_PER_CORE worker processes per core
    (OptionError: exit 2, before any process is started)."""
    limit = MAX_WORKERS_PER_CORE * available
    if requested > limit:
        raise OptionError(f"--local_parallelism {requested}: more than {MAX_WORKERS_PER_CORE} worker processes per "
                          f"core ({available} core{'s' if available != 1 else ''} here: at most {limit}); each "
                          f"worker is a whole pipeline, so more only add memory and contention. Use auto, or at "
                          f"most {limit}")


def choose(requested: str | int, argv: list[str], options: PipelineOptions, in_process: bool, input_bytes: int,
           read_units: int) -> Parallelism:
    """The run's parallelism; sets Beam's options for it on the in-process runner. Raises
    OptionError for `--local_parallelism N` on a runner it does not apply to."""
    available = cores.available()
    if not in_process:
        if requested != AUTO:
            raise OptionError(f"--local_parallelism {requested}: only the in-process runner (no --runner given) "
                              f"takes it; this runner decides its own parallelism (e.g. --num_workers on Dataflow)")
        return Parallelism("runner", 0, available, "the runner")
    direct = options.view_as(DirectOptions)
    if given_beam_options(argv):
        mode = direct.direct_running_mode or IN_MEMORY
        workers = direct.direct_num_workers or available  # Beam's 0: one per core
        if mode == IN_MEMORY:
            workers = 1
        why = "" if requested == AUTO else f"--local_parallelism {requested} ignored"
        return Parallelism(mode, workers, available, "Beam options", why)
    if requested == AUTO:
        workers, why = auto_workers(available, input_bytes, read_units)
        chosen_by = "auto"
    else:
        check_requested(requested, available)
        workers, why, chosen_by = requested, "", "--local_parallelism"
    mode = MULTI_PROCESSING if workers > 1 else IN_MEMORY
    direct.direct_running_mode = mode
    direct.direct_num_workers = workers
    return Parallelism(mode, workers, available, chosen_by, why)


def describe(p: dict) -> str:
    """One line of the summary, from Parallelism.report()."""
    if p["mode"] == "runner":
        return "parallelism: decided by the runner"
    if p["mode"] == IN_MEMORY:
        what = f"one process (threads on {p['cores']} core{'s' if p['cores'] != 1 else ''})"
    elif p["mode"] == MULTI_PROCESSING:
        what = f"{p['workers']} worker processes, {p['cores_per_worker']} of {p['cores']} cores each"
    else:
        what = f"{p['mode']}, {p['workers']} workers on {p['cores']} cores"
    why = f": {p['reason']}" if p.get("reason") else ""
    return f"parallelism: {what} ({p['chosen_by']}{why})"
