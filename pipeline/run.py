"""Entry point: python -m pipeline.run --input GLOB --output PATH --tokenizer SPEC [options] [Beam options]

Exit codes: 0 the dataset was written and committed (on Dataflow: the job was submitted;
it commits the dataset when it succeeds); 1 the pipeline failed (the output is left
uncommitted, and `pipeline.verify` rejects it); 2 a usage or configuration error, found
before any data was read; 143 / 130 stopped by SIGTERM / SIGINT (its temporary files
removed).
"""
import contextlib
import gc
import json
import logging
import os
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
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions
from fsspec.core import url_to_fs

from pipeline import VERSION, allocator, cloud, resume, scratch
from pipeline.graph import build_pipeline
from pipeline.environment import worker_environment, workers_see_launcher_disk
from pipeline.plan import plan_job
from pipeline.options import (FlatTokensOptions, OptionError, ViewsMadeOnce, check_options, help_text,
                              unknown_option_message, unknown_options)
from transforms.write import zarr_store
from transforms.write.object_trees import tree_size
from transforms.read.inputs import InputError
from transforms.read.mixture import source_table
from transforms.write import rejected
from transforms.write.ownership import refuse_overlaps
from transforms.progress import ProgressLogger
from transforms.tokenize.tokenizer import TokenizerError

USAGE_ERROR = 2
PIPELINE_FAILED = 1


def _fail(message: str, code: int) -> int:
    print(f"flat-tokens: error: {message}", file=sys.stderr)
    return code


def in_process_runner(options: PipelineOptions):
    """The runner for the default `--runner` (unset or DirectRunner): Beam's FnApiRunner,
    set up as DirectRunner sets it up, so --direct_running_mode and --direct_num_workers
    work as documented. Beam's DirectRunner would first try to switch to the Prism runner,
    a binary it downloads at run time when the network allows: the same command would then
    run on one runner online and another offline. None for any other --runner."""
    if options.view_as(StandardOptions).runner not in (None, "DirectRunner"):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    from pipeline import worker

    class FnApiRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            worker.run_our_workers(pipeline_proto)  # multi_processing workers: quiet unless --verbose
            return super().run_via_runner_api(pipeline_proto, options)

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    # --environment_type: workers started elsewhere, by a command (pipeline/environment.py)
    return FnApiRunner(default_environment=worker_environment(options),
                       provision_info=fn_runner.ExtendedProvisionInfo(
                           beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


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


def summarize(output: str, wall_seconds: float, storage_options: dict | None = None, reused=None) -> dict:
    """The end-of-run summary, from the committed dataset's own attributes; `reused`: the
    run's Resume (pipeline/resume.py), for how much of an earlier attempt it reused."""
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
            "reused": reused.report(stats) if reused is not None else None}


def format_summary(summary: dict) -> str:
    s = summary["stats"]
    lines = [f"flat-tokens: wrote {summary['output']}",
             f"  input: {s['documents']:,} documents, {s['blank']:,} blank lines, {s['rejected']:,} rejected lines, "
             f"{s['empty']:,} empty documents (dropped)"
             + (f", {s['duplicates']:,} duplicates (removed)" if s.get("duplicates") else "")]
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
    if reused and (reused["input_units"] or reused["chunks"]):
        lines.append(f"  resumed: reused {reused['input_units']:,} of {reused['input_units_total']:,} input units, "
                     f"{reused['chunks']:,} of {reused['chunks_total']:,} chunks")
    if summary["output_bytes"] is not None:
        per_token = f", {summary['bytes_per_token']} bytes/token" if summary["bytes_per_token"] else ""
        lines.append(f"  output: {summary['output_bytes'] / 2**20:,.1f} MB{per_token}")
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
    return 0


def _tokenizer_file(spec: str) -> list[str]:
    """The tokenizer's file, when it is one (not `bytes` or a hub name)."""
    return [spec] if spec != "bytes" and ("://" in spec or os.path.exists(spec)) else []


def check_summary_path(path: str) -> None:
    """--summary_json must be writable before any data is read: a run must not fail, after
    its dataset is committed, for want of a place to say so."""
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

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.signal(s, self._stop) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    def _stop(self, signum, frame):
        for s in self.SIGNALS:  # a second signal while stopping must not interrupt the cleanup
            signal.signal(s, signal.SIG_IGN)
        # The runner's threads notice their workers stopping, and would print tracebacks: the
        # one line below says what happened.
        threading.excepthook = lambda args: None
        logging.disable(logging.CRITICAL)
        _stop_children()
        for path in reversed(self.directories):
            scratch.remove(path)
        what = {"checking": "before the pipeline started; nothing was written",
                "running": f"before the run finished; {self.output} was not committed by this run ("
                           + ("rerun the same command to resume it" if self.resumable else
                              "--no_staging kept nothing: rerun with --overwrite to replace it")
                           + "); its temporary files are removed",
                "committed": f"after {self.output} was committed; its temporary files are removed"}[self.phase]
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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(help_text())
        return 0
    if "--version" in argv:
        print(VERSION)
        return 0
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
        local = workers_see_launcher_disk(options)  # checks --environment_type too
        cloud.check_gcs_reachable(cloud.urls_of(ft))  # in seconds, not after gcsfs's retries
        if local:
            check_local_temp_root(options)
        if ft.summary_json:
            check_summary_path(ft.summary_json)
        # before any data is read; an unfinished output that this command made is resumed
        found = zarr_store.refuse_occupied(ft.output, ft.overwrite, resumable=resume.same_command(ft))
        plan = plan_job(ft)
        plan.expected_owner = (*found.owner, found.committed)  # CreateOutput replaces only this, or stops
        plan.take_unfinished = not found.committed
        # Files a directory input holds but does not read count too: an output among them
        # would be in the input directory, and its files read by a later run.
        inputs = ([f.url for f in plan.files] + plan.skipped_files + _tokenizer_file(ft.tokenizer)
                  + ([ft.mixture] if ft.mixture else []))
        refuse_overlaps(ft.output, inputs, plan.rejected_url)
        zarr_store.check_writable(plan.target)
        rejected.check_writable(plan.rejected_url, plan.target.run_id, plan.target.storage_options)
    except (OptionError, InputError, TokenizerError, zarr_store.OutputError) as e:
        return _fail(str(e), USAGE_ERROR)
    plan.resume = resume.prepare(plan, ft, found, plan.target.storage_options)
    resuming = resume.describe(plan.resume)
    if resuming:
        logs.log().info(resuming)

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
            code = _run(options, plan, ft)
    finally:
        for path in reversed(stopping.directories):
            scratch.remove(path)
    if code is not None:
        return code
    stopping.phase = "committed"
    return _report(ft, plan, time.time() - started)


def _report(ft, plan, wall_seconds: float) -> int:
    """The summary of a committed dataset. Nothing here can fail the run any more: the
    dataset is committed, and a scheduler must not be told otherwise."""
    try:
        summary = summarize(ft.output, wall_seconds, plan.target.storage_options, plan.resume)
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
    return 0


def _run(options, plan, ft) -> int | None:
    """Runs the pipeline; None when it finished, else the exit code."""
    pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
    build_pipeline(pipeline, plan)
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
    return None


if __name__ == "__main__":
    from pipeline.cli import run_command
    logs.exit_process(run_command(main))
