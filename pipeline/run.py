"""Entry point: python -m pipeline.run --input GLOB --output PATH --tokenizer SPEC [options] [Beam options]

Exit codes: 0 the dataset was written and committed (on Dataflow: the job was submitted;
it commits the dataset when it succeeds); 1 the pipeline failed (the output is left
uncommitted, and `flat_tokens.tools.verify` rejects it); 2 a usage or configuration error, found
before any data was read; 143 / 130 stopped by SIGTERM / SIGINT (its temporary files
removed).
"""
import contextlib
import gc
import json
import logging
import os
import posixpath
import signal
import sys
import tempfile
import threading
import time

from pipeline import logs  # noqa: I001 (before apache_beam: it filters Beam's import-time noise)
from pipeline import prefetch

if __name__ == "__main__":
    prefetch.head_start(sys.argv[1:])  # before numpy and Beam are imported below

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, PortableOptions, StandardOptions
from fsspec.core import url_to_fs

from pipeline import VERSION, cloud, resume
from pipeline.local import allocator, parallelism, scratch, worker_guard
from pipeline.graph import build_pipeline
from pipeline.local.environment import worker_environment, workers_see_launcher_disk
from pipeline.plan import plan_job
from pipeline.local.write_memory import check_write_memory
from pipeline.options import (FlatTokensOptions, OptionError, ViewsMadeOnce, check_options, help_text,
                              option_value_error, unknown_option_message, unknown_options)
from flat_tokens.format import storage_faults
from transforms.write import zarr_store
from flat_tokens.format.object_trees import tree_size
from transforms.read.inputs import InputError
from flat_tokens.format.mixture_table import source_table
from transforms.write import rejected
from transforms.write.ownership import DATASET_ENTRIES, OWN_PREFIX, contains, location, refuse_overlaps
from transforms.progress import ProgressLogger
from flat_tokens.format.report_files import ReportPathError, check_report_writable
from flat_tokens.format.index_files import MissingIndex
from transforms.tokenize.tokenizer import TokenizerError

USAGE_ERROR = 2
PIPELINE_FAILED = 1


def _fail(message: str, code: int) -> int:
    print(f"flat-tokens: error: {message}", file=sys.stderr)
    return code


def in_process_runner(options: PipelineOptions, report_dir: str | None = None):
    """The runner for the default `--runner` (unset or DirectRunner): Beam's FnApiRunner,
    set up as DirectRunner sets it up, so --direct_running_mode and --direct_num_workers
    work as documented. Beam's DirectRunner would first try to switch to the Prism runner,
    a binary it downloads at run time when the network allows: the same command would then
    run on one runner online and another offline. None for any other --runner.
    `report_dir`: where workers started by a command report an early end (WorkerWatch)."""
    if options.view_as(StandardOptions).runner not in (None, "DirectRunner"):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    from pipeline.local import forked_workers, worker

    class FnApiRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            whole_elements_on_the_data_plane()
            # multi_processing workers: this project's harness (quiet unless --verbose), told
            # their share of the cores, and forked from this process where it can
            environment = worker.environment_for(self._num_workers)
            if forked_workers.available():
                with forked_workers.serving(pipeline_proto, environment):
                    return super().run_via_runner_api(pipeline_proto, options)
            worker.run_our_workers(pipeline_proto, environment)
            return super().run_via_runner_api(pipeline_proto, options)

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    # --environment_type: workers started elsewhere, by a command (pipeline/local/environment.py)
    return FnApiRunner(default_environment=worker_environment(options, report_dir),
                       provision_info=fn_runner.ExtendedProvisionInfo(
                           beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def whole_elements_on_the_data_plane() -> None:
    """Makes the default runner's gRPC data plane send elements only whole: no flushing on a
    timer, in the runner or in its multi_threading workers.

    Beam's FnApiRunner (2.77) sets a 1-second time limit on the data buffers of its gRPC
    server and of the SDK harnesses it runs on threads (--direct_running_mode
    multi_threading). A timer thread then sends whatever the buffer holds, even while a
    bundle's thread is halfway through encoding an element (the harness's size-based flush
    waits for an element boundary; the timer does not), and it clears the buffer after
    sending, dropping what was written meanwhile. The receiver decodes each message on its
    own: a split element fails the job ("'utf-8' codec can't decode byte ...", "Invalid
    PaneInfoEncoding"), or could decode as something else. Only bundles that run longer
    than a second are exposed, so small inputs passed. Beam's own subprocess workers
    (multi_processing) and the SDK harness of Dataflow and Flink have the timer off by
    default; this turns it off here too (0: size-based flushing, at element boundaries)."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0  # read when the run starts its server and workers


def runs_in_process(options: PipelineOptions) -> bool:
    """Whether the run is the default runner's, with workers it starts itself (in this
    process, or as worker processes beside it): what --local_parallelism applies to."""
    return (options.view_as(StandardOptions).runner in (None, "DirectRunner")
            and not options.view_as(PortableOptions).environment_type)


def local_temp_root(options: PipelineOptions) -> str | None:
    """Where a local run keeps its temporary files: --temp_location when it is a local path,
    else the system's temporary directory (None)."""
    temp = options.view_as(GoogleCloudOptions).temp_location
    return temp if temp and "://" not in temp else None


def check_local_temp_root(options: PipelineOptions) -> None:
    """A local --temp_location must be a directory this run can write in: spill files and
    Beam's own temporary files go there."""
    root = local_temp_root(options)
    if root and not (os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK)):
        raise OptionError(f"--temp_location {root}: not a writable directory; create it, or leave the option out "
                          f"(the system's temporary directory, {tempfile.gettempdir()}, is used then)")


def output_bytes(url: str, storage_options: dict | None = None) -> int | None:
    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
        return tree_size(fs, path)  # in bounded memory: a dataset holds one object per chunk
    except (OSError, ValueError, NotImplementedError):
        return None


def summarize(output: str, wall_seconds: float, storage_options: dict | None = None, reused=None,
              used: parallelism.Parallelism | None = None) -> dict:
    """The end-of-run summary, from the committed dataset's own attributes; `reused`: the
    run's Resume (pipeline/resume.py), for how much of an earlier attempt it reused; `used`:
    the parallelism the run had (pipeline/local/parallelism.py)."""
    attrs = zarr_store.read_root_attributes(output, storage_options)
    stats = attrs["stats"]
    tokens = sum(stats[s]["tokens"] for s in ("train", "validation"))
    size = output_bytes(output, storage_options)
    return {"output": output, "stats": stats, "tokens": tokens, "output_bytes": size,
            "bytes_per_token": round(size / tokens, 3) if size and tokens else None,
            "wall_seconds": round(wall_seconds, 3),
            "tokens_per_second": round(tokens / wall_seconds, 1) if wall_seconds > 0 else None,
            "tokenizer": attrs.get("tokenizer"), "run_id": attrs.get("run_id"),
            "rejected_output": attrs.get("rejected_output") if stats["rejected"] else None,
            "mixture": attrs.get("mixture"),
            "reused": reused.report(stats) if reused is not None else None,
            "parallelism": used.report() if used is not None else None}


def format_summary(summary: dict) -> str:
    s = summary["stats"]
    built = summary.get("already_built")
    first = (f"flat-tokens: {summary['output']} was already built by run {summary.get('built_by_run')}; nothing "
             f"was rewritten" if built else f"flat-tokens: wrote {summary['output']}")
    lines = [first,
             f"  input: {s['documents']:,} documents, {s['blank']:,} blank lines, {s['rejected']:,} rejected lines, "
             f"{s['empty']:,} empty documents (dropped)"
             + (f", {s['duplicates']:,} duplicates (removed)" if s.get("duplicates") else "")
             + (f", {s['dedup_against']:,} texts held by earlier datasets (removed)" if "dedup_against" in s else "")
             + (f", {s['too_short']:,} shorter than --min_tokens (dropped)" if "too_short" in s else "")
             + (f", {s['truncated']:,} truncated to --max_tokens ({s['truncated_tokens']:,} tokens dropped)"
                if s.get("truncated") else "")
             + (f", {s['split']:,} split by --max_tokens into {s['split'] + s['extra_sequences']:,} sequences"
                if s.get("split") else "")]
    if "near_dedup" in s:
        near = s["near_dedup"]
        lines.append(f"  near-duplicates: {s['near_duplicates']:,} removed from {near['clusters']:,} clusters of "
                     f"{near['clustered_texts']:,} texts ({near['verified_pairs']:,} of {near['candidate_pairs']:,} "
                     f"candidate pairs verified; estimated false-positive rate "
                     f"{near['estimated_false_positive_rate']:.2%})")
    if summary.get("rejected_output"):
        reasons = ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
        lines.append(f"  rejected lines ({reasons}) are listed in {summary['rejected_output']}/")
    for split in ("train", "validation"):
        lines.append(f"  {split}: {s[split]['sequences']:,} sequences, {s[split]['tokens']:,} tokens, "
                     f"max_token_id {s[split]['max_token_id']}")
    if summary.get("mixture"):
        lines += source_table(summary["mixture"])
    reused = summary.get("reused")
    damaged = (reused or {}).get("damaged") or {}
    changed = (reused or {}).get("input_units_changed")
    if reused and (reused["input_units"] or reused["chunks"] or any(damaged.values()) or changed):
        lines.append(f"  resumed: reused {reused['input_units']:,} of {reused['input_units_total']:,} input units, "
                     f"{reused['chunks']:,} of {reused['chunks_total']:,} chunks"
                     + (f"; {changed:,} staged units read again (their input changed)" if changed else "")
                     + (f"; redone, {resume.describe_damage(damaged)}" if any(damaged.values()) else ""))
    if summary["output_bytes"] is not None:
        per_token = f", {summary['bytes_per_token']} bytes/token" if summary["bytes_per_token"] else ""
        lines.append(f"  output: {summary['output_bytes'] / 2**20:,.1f} MiB{per_token}")
    if summary.get("parallelism"):
        lines.append("  " + parallelism.describe(summary["parallelism"]))
    if not built:
        lines.append(f"  time: {summary['wall_seconds']:,.1f} s, {summary['tokens_per_second'] or 0:,.0f} tokens/s")
    return "\n".join(lines)


@contextlib.contextmanager
def _beam_errors_logged_quietly():
    """Beam logs every worker exception with its whole traceback before re-raising it; the
    cause is reported once, in one line, by main(). --log_level DEBUG shows everything."""
    loggers = [logging.getLogger(n) for n in ("apache_beam", "apache_beam.runners")]
    levels = [lg.level for lg in loggers]
    if not logs.log().isEnabledFor(logging.DEBUG):
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _submitted(result, ft: FlatTokensOptions) -> int:
    """A Dataflow job was submitted: say which, and do not wait for it."""
    job_id = result.job_id() if getattr(result, "has_job", False) else None
    print(f"flat-tokens: submitted Dataflow job {job_id or '(job graph handed to the template launcher)'}; "
          f"{ft.output} is committed when the job succeeds (check: flat-tokens verify {ft.output})")
    if ft.summary_json:
        print("flat-tokens: --summary_json is not written for a Dataflow job: the stats are the committed "
              "dataset's root attribute 'stats'", file=sys.stderr)
    if ft.report:
        print(f"flat-tokens: --report is not written for a Dataflow job: once it is done, run `flat-tokens report "
              f"{ft.output} --html {ft.report}`", file=sys.stderr)
    return 0


def _tokenizer_file(spec: str) -> list[str]:
    """The tokenizer's file, when it is one (not `bytes` or a hub name)."""
    return [spec] if spec != "bytes" and ("://" in spec or os.path.exists(spec)) else []


def summary_in_output(ft: FlatTokensOptions) -> tuple:
    """A --summary_json inside --output: its name there, or (). The output then holds it as
    this tool's own, so that a later --overwrite replaces it with the dataset; anywhere in
    the output but its top level (inside a split, or under a name the layout uses) it would
    make the output foreign, and is refused."""
    if not ft.summary_json:
        return ()
    out, summary = location(ft.output), location(ft.summary_json)
    if not contains(out, summary):
        return ()
    name = posixpath.relpath(summary[1], out[1])
    if name == "." or "/" in name or name.startswith(OWN_PREFIX) or name in DATASET_ENTRIES:
        raise OptionError(f"--summary_json {ft.summary_json}: inside --output {ft.output}, where the dataset's own "
                          f"files go; write it beside the output, or at its top level under a name of its own "
                          f"(e.g. {ft.output.rstrip('/')}/summary.json)")
    return (name,)


def check_summary_path(path: str, in_output: bool = False, output: str = "") -> None:
    """--summary_json must be writable before any data is read: a run must not fail, after
    its dataset is committed, for want of a place to say so. One `in_output` is written in a
    directory the run makes: `output`, checked writable for the dataset anyway."""
    if in_output and not os.path.isdir(output):
        return
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
        if not existed:
            os.remove(path)
    except OSError as e:
        raise OptionError(f"--summary_json {path}: cannot be written ({e.strerror or e}); "
                          f"choose a path in a writable directory") from None


class _Stopping:
    """SIGTERM (what schedulers and `docker stop` send) and SIGINT (Ctrl-C) end a run like a
    failure: its temporary files removed, its worker processes stopped, one line, exit
    128 + the signal (143, 130). Every local runner's worker thread dies with the process;
    the output is left as a kill leaves it (the old dataset, or an unfinished output that the
    same command resumes, or that a run with --overwrite replaces)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, output: str, resumable: bool = True):
        self.output = output
        self.resumable = resumable  # not with --no_staging: nothing is kept for a rerun
        self.phase = "checking"  # then "running", then "committed"
        self.directories: list[str] = []
        self._saved = {}
        self._failing = threading.Lock()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.signal(s, self._stop) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    def fail(self, message: str) -> None:
        """Ends the run as failed, from any thread: for a failure the runner would wait on
        forever (a worker that died). Exit 1, its temporary files removed, one line."""
        with self._failing:
            if self.phase != "running":
                return
            self._end()
            print(f"flat-tokens: error: the pipeline failed; {self.output} was not committed. Cause: {message}",
                  file=sys.stderr)
            logs.exit_process(PIPELINE_FAILED)

    def _end(self) -> None:
        # The runner's threads notice their workers stopping, and would print tracebacks: the
        # one line the caller prints says what happened.
        threading.excepthook = lambda args: None
        logging.disable(logging.CRITICAL)
        _stop_children()
        for path in reversed(self.directories):
            scratch.remove(path)

    def _stop(self, signum, frame):
        for s in self.SIGNALS:  # a second signal while stopping must not interrupt the cleanup
            signal.signal(s, signal.SIG_IGN)
        phase, self.phase = self.phase, "stopping"  # the workers it stops are not failures (fail)
        self._end()
        what = {"checking": "before the pipeline started; nothing was written",
                "running": f"before the run finished; {self.output} was not committed by this run ("
                           + ("rerun the same command to resume it" if self.resumable else
                              "--no_staging kept nothing to resume: rerunning the same command starts over")
                           + "); its temporary files are removed",
                "committed": f"after {self.output} was committed; its temporary files are removed"}[phase]
        print(f"flat-tokens: stopped by {signal.Signals(signum).name} {what}", file=sys.stderr)
        logs.exit_process(128 + signum)


def _stop_children() -> None:
    """Sends SIGTERM to this process's descendants (multi_processing workers, which Beam
    starts through a shell), which a signal sent to this process alone would leave running.
    Linux (/proc) only; elsewhere they stop when their connection breaks."""
    parents = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            parents[pid] = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    ours, found = {os.getpid()}, True
    while found:
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= found
    for pid in ours - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def refuse_report_overlaps(report: str, output: str, inputs: list[str], storage_options: dict | None) -> None:
    """--dedup_report may be neither inside the output (replacing the output would delete it)
    nor inside an input directory or around an input file (a later run would read the report
    as documents)."""
    at = location(report, storage_options)
    if contains(location(output, storage_options), at):
        raise OptionError(f"--dedup_report {report}: is inside --output {output}; put the report outside the output")
    for url in inputs:
        where = location(url, storage_options)
        if contains(where, at) or contains(at, where):
            raise OptionError(f"--dedup_report {report}: overlaps the input {url}; put the report outside every "
                              f"input, or a later run would read it as documents")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(help_text())
        return 0
    if "--version" in argv:
        print(VERSION)
        return 0
    problem = option_value_error(argv)  # before Beam's parser, which would print its usage block
    if problem:
        return _fail(problem, USAGE_ERROR)
    options = ViewsMadeOnce(argv)
    ft = options.view_as(FlatTokensOptions)
    logs.configure("verbose" if ft.verbose else "quiet" if ft.quiet else "info")
    with _Stopping(ft.output, resumable=not ft.no_staging) as stopping:
        return _main(argv, options, ft, stopping)


def _main(argv, options, ft, stopping: _Stopping) -> int:
    try:
        unknown = unknown_options(argv)
        if unknown:
            raise OptionError(unknown_option_message(argv, unknown[0]))
        check_options(ft)
        try:
            storage_faults.configure(ft.storage_patience, ft.storage_request_timeout)  # workers inherit it
        except ValueError as e:
            raise OptionError(str(e)) from None
        check_write_memory(ft)  # chunk and shard sizes a writer could not hold: before any data is read
        local = workers_see_launcher_disk(options)  # checks --environment_type too
        cloud.check_gcs_reachable(cloud.urls_of(ft))  # in seconds, not after gcsfs's retries
        if local:
            check_local_temp_root(options)
        also_ours = summary_in_output(ft)
        if ft.summary_json:
            check_summary_path(ft.summary_json, bool(also_ours), ft.output)
        # A dataset this command built already is not built again (a retry after its commit).
        committed = None if ft.overwrite else resume.committed_here(ft)
        built = committed if resume.built_by(committed, ft) else None
        if built is None:  # before any data is read; an unfinished output that this command made is resumed
            earlier = committed.get("command") if committed else resume.earlier_command(ft)
            same = not committed and resume.is_command(earlier, ft)
            found = zarr_store.refuse_occupied(ft.output, ft.overwrite, resumable=same, also_ours=also_ours,
                                               other_command=resume.option_changes(earlier, ft) if earlier and not same
                                               else None)
        plan = plan_job(ft)
        plan.also_ours = also_ours
        plan.provenance["command"] = resume.built_from(ft, plan)
        if built is not None:
            changed = resume.input_changes(built, ft, plan)
            if changed:
                raise zarr_store.OutputError(
                    f"--output {ft.output}: holds a dataset this command built (run {built.get('run_id')}), but "
                    f"from other input: {changed}. Pass --overwrite to build it again from the input as it is "
                    f"now, or choose another path")
            return _report_built(ft, built)
        used = parallelism.choose(parallelism.parse(ft.local_parallelism), argv, options, runs_in_process(options),
                                  plan.input_bytes, len(plan.read_ranges()) + len(plan.row_groups))
        plan.local_processes = used.workers if used.mode == parallelism.MULTI_PROCESSING else 1
        plan.expected_owner = (*found.owner, found.committed)  # CreateOutput replaces only this, or stops
        plan.take_unfinished = not found.committed
        # Files a directory input holds but does not read count too: an output among them
        # would be in the input directory, and its files read by a later run.
        inputs = ([f.url for f in plan.files] + plan.skipped_files + _tokenizer_file(ft.tokenizer)
                  + ([ft.mixture] if ft.mixture else []))
        refuse_overlaps(ft.output, inputs, plan.rejected_url)
        if plan.dedup_report:
            refuse_report_overlaps(plan.dedup_report, ft.output, inputs + list(ft.input or [])
                                   + list(ft.validation_input or []), plan.target.storage_options)
        zarr_store.check_writable(plan.target)
        rejected.check_writable(plan.rejected_url, plan.target.run_id, plan.target.storage_options)
        if plan.dedup_report:  # written after every document was deduplicated: find out now
            check_report_writable(plan.dedup_report, plan.target.run_id, plan.target.storage_options)
    except (OptionError, InputError, TokenizerError, zarr_store.OutputError, ReportPathError, MissingIndex) as e:
        return _fail(str(e), USAGE_ERROR)
    except storage_faults.StorageUnavailable as e:  # no configuration error: the same command, later
        return _fail(str(e), PIPELINE_FAILED)
    try:
        plan.resume = resume.prepare(plan, ft, found, plan.target.storage_options)
    except storage_faults.StorageUnavailable as e:
        return _fail(str(e), PIPELINE_FAILED)
    except OSError as e:  # a full disk, a read-only output: the same command, once that is mended
        return _fail(f"--output {ft.output}: cannot write its staging area ({e})", PIPELINE_FAILED)
    for notable, line in resume.describe(plan.resume):
        (logs.log().warning if notable else logs.log().info)(line)
    damage = resume.damage_report(plan.resume)
    if damage:
        logs.log().warning(damage)

    started = time.time()
    stopping.phase = "running"
    try:
        for path in scratch.remove_leftovers([None, local_temp_root(options)]):
            logs.log().debug("removed %s, left by a run whose process has ended", path)
        temp_dir = scratch.make_progress_directory()
        stopping.directories.append(temp_dir)
        if local:
            tuned = allocator.keep_freed_memory_for_reuse()
            logs.log().debug("malloc keeps freed memory for reuse: %s", tuned)
            if not ft.quiet:
                plan.progress_dir = temp_dir
            plan.spill_dir = scratch.make_spill_directory(plan.target.run_id, local_temp_root(options))
            stopping.directories.append(plan.spill_dir)
            logs.log().debug("shard parts wait for the sort in %s", plan.spill_dir)
        with scratch.temporary_files_in(temp_dir):  # Beam's own temporary directory too
            code = _run(options, plan, ft, stopping, os.path.join(temp_dir, "workers"))
    finally:
        for path in reversed(stopping.directories):
            scratch.remove(path)
    if code is not None:
        return code
    stopping.phase = "committed"
    return _report(ft, plan, time.time() - started, used)


def _report_built(ft, attrs: dict) -> int:
    """The same command over the same input finds its dataset committed (a retry of a run
    killed after its commit, a scheduler's second try): nothing is rewritten; its summary is
    reported (and written to --summary_json) as if it had just been built. Exit 0."""
    logs.log().info("flat-tokens: %s: already built by run %s (this command, the same input files and "
                    "tokenizer); nothing to do", ft.output, attrs.get("run_id"))
    return _report(ft, None, 0.0, extra={"already_built": True, "built_by_run": attrs.get("run_id")})


def _report(ft, plan, wall_seconds: float, used: parallelism.Parallelism | None = None,
            extra: dict | None = None) -> int:
    """The summary of a committed dataset. Nothing here can fail the run any more: the
    dataset is committed, and a scheduler must not be told otherwise."""
    try:
        summary = summarize(ft.output, wall_seconds, plan.target.storage_options if plan else None,
                            plan.resume if plan else None, used)
        summary.update(extra or {})
    except Exception as e:  # e.g. another run --overwrite replaced it already
        logs.log().warning("flat-tokens: warning: %s is committed, but its summary could not be read (%s: %s)",
                           ft.output, type(e).__name__, e)
        return 0
    if ft.summary_json:  # before printing: a closed stdout must not cost the scheduler its JSON
        try:
            with open(ft.summary_json, "w") as f:
                json.dump(summary, f, indent=2)
        except OSError as e:
            logs.log().warning("flat-tokens: warning: --summary_json %s: cannot be written (%s); %s is committed",
                               ft.summary_json, e.strerror or e, ft.output)
    print(format_summary(summary))
    if ft.report:
        write_report(ft, summary, plan.target.storage_options if plan else None, plan.dedup_report if plan else None)
    return 0


def write_report(ft, summary: dict, storage_options: dict | None, dedup_report: str | None = None) -> None:
    """--report: the dataset's HTML page (flat_tokens/tools/report.py), with this run's summary for its
    build time and this run's --dedup_report (its pairs and cluster sizes). The dataset is
    committed: a report that cannot be written is a warning."""
    from flat_tokens.tools.report import make_report
    options = [f"--storage_option={k}={json.dumps(v)}" for k, v in (storage_options or {}).items()]
    if dedup_report:
        options.append(f"--dedup_report={dedup_report}")
    try:
        make_report(ft.output, ft.report, options, summary=summary)
        print(f"  report: {ft.report}")
    except Exception as e:
        logs.log().warning("flat-tokens: warning: --report %s: not written (%s: %s); %s is committed",
                           ft.report, type(e).__name__, str(e)[:300], ft.output)


def _run(options, plan, ft, stopping: _Stopping | None = None, report_dir: str | None = None) -> int | None:
    """Runs the pipeline; None when it finished, else the exit code. Workers started by a
    command of the user's report an early end in `report_dir`: the run then fails (exit 1,
    through `stopping`) with what the worker said, where the runner would wait forever."""
    pipeline = beam.Pipeline(runner=in_process_runner(options, report_dir), options=options)
    build_pipeline(pipeline, plan)
    watch, excepthook = None, threading.excepthook
    if stopping is not None and report_dir is not None and worker_environment(options) is not None:
        def worker_ended(message: str) -> None:
            if not _committed_by(plan):  # a worker dying after the commit cannot fail the run
                stopping.fail(f"{message}. The runner cannot go on without it; check --environment_config "
                              f"(see docs/scale.md, 'A cluster on one machine')")
        watch = worker_guard.WorkerWatch(report_dir, worker_ended)
        watch.start()
        if not ft.verbose:  # Beam's thread would print a traceback per worker; the watch says it in one line
            threading.excepthook = _quiet_worker_exits(threading.excepthook)
    if not gc.isenabled():
        # The command line (only it: a caller's process is not ours to change) starts with
        # the collector off. Imports and the graph leave ~120k long-lived objects, which every
        # full collection would traverse again; from here it looks at new objects only.
        gc.freeze()
        gc.enable()
    progress = None
    if plan.progress_dir:
        progress = ProgressLogger(plan.progress_dir, plan.input_bytes, logs.log().info, ft.progress_interval)
        progress.start()
    try:
        with _beam_errors_logged_quietly():
            result = pipeline.run()
            if type(result).__name__ == "DataflowPipelineResult":
                # Dataflow (e.g. the Flex Template launcher): the job outlives this process, so
                # return once it is submitted; its outcome is the job state, its summary the
                # committed dataset's root attribute `stats`.
                return _submitted(result, ft)
            result.wait_until_finish()
    except Exception as e:  # Beam wraps worker errors; the last line holds the cause
        cause = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        logs.log().debug("pipeline failure", exc_info=True)
        return _fail(f"the pipeline failed; {ft.output} was not committed. Cause: {cause}", PIPELINE_FAILED)
    finally:
        if progress:
            progress.stop()
        if watch:
            watch.stop()
            threading.excepthook = excepthook
    return None


def _quiet_worker_exits(previous):
    """A threading.excepthook that leaves out the error Beam's worker threads raise when their
    worker process exits (`Worker subprocess exited with return code N`)."""
    def hook(args):
        if getattr(args.thread, "name", "") == "run_worker" and "Worker subprocess exited" in str(args.exc_value):
            return
        previous(args)
    return hook


def _committed_by(plan) -> bool:
    """Whether this run committed its dataset already."""
    try:
        return zarr_store.read_root_attributes(plan.target.url, plan.target.storage_options).get(
            "run_id") == plan.target.run_id
    except Exception:
        return False


if __name__ == "__main__":
    from pipeline.cli import run_command
    logs.exit_process(run_command(main))
