"""Entry point: python -m pipeline.run --input GLOB --output PATH --tokenizer SPEC [options] [Beam options]

Exit codes: 0 the dataset was written and committed (on Dataflow: the job was submitted;
it commits the dataset when it succeeds); 1 the pipeline failed (the output is left
uncommitted, and `pipeline.verify` rejects it); 2 a usage or configuration error, found
before any data was read.
"""
import contextlib
import gc
import json
import logging
import os
import sys
import tempfile
import time

from pipeline import logs  # noqa: I001 (before apache_beam: it filters Beam's import-time noise)
from pipeline import prefetch

if __name__ == "__main__":
    prefetch.head_start(sys.argv[1:])  # before numpy and Beam are imported below

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions
from fsspec.core import url_to_fs

from pipeline import VERSION, allocator, cloud
from pipeline.graph import build_pipeline
from pipeline.environment import worker_environment, workers_see_launcher_disk
from pipeline.plan import plan_job
from pipeline.options import FlatTokensOptions, OptionError, ViewsMadeOnce, check_options, help_text, unknown_options
from transforms.shuffle import spill
from transforms.write import zarr_store
from transforms.write.object_trees import tree_size
from transforms.read.inputs import InputError
from transforms.read.mixture import source_table
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


def output_bytes(url: str, storage_options: dict | None = None) -> int | None:
    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
        return tree_size(fs, path)  # in bounded memory: a dataset holds one object per chunk
    except (OSError, ValueError, NotImplementedError):
        return None


def summarize(output: str, wall_seconds: float, storage_options: dict | None = None) -> dict:
    """The end-of-run summary, from the committed dataset's own attributes."""
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
            "mixture": attrs.get("mixture")}


def format_summary(summary: dict) -> str:
    s = summary["stats"]
    lines = [f"flat-tokens: wrote {summary['output']}",
             f"  input: {s['documents']:,} documents, {s['blank']:,} blank lines, {s['rejected']:,} rejected lines, "
             f"{s['empty']:,} empty documents (dropped)"
             + (f", {s['duplicates']:,} duplicates (removed)" if s.get("duplicates") else "")]
    if summary.get("rejected_output"):
        reasons = ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
        lines.append(f"  rejected lines ({reasons}) are listed in {summary['rejected_output']}/")
    for split in ("train", "validation"):
        lines.append(f"  {split}: {s[split]['sequences']:,} sequences, {s[split]['tokens']:,} tokens, "
                     f"max_token_id {s[split]['max_token_id']}")
    if summary.get("mixture"):
        lines += source_table(summary["mixture"])
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
          f"{ft.output} is committed when the job succeeds (check: python -m pipeline.verify {ft.output})")
    if ft.summary_json:
        print("flat-tokens: --summary_json is not written for a Dataflow job: the stats are the committed "
              "dataset's root attribute 'stats'", file=sys.stderr)
    return 0


def _tokenizer_file(spec: str) -> list[str]:
    """The tokenizer's file, when it is one (not `bytes` or a hub name)."""
    return [spec] if spec != "bytes" and ("://" in spec or os.path.exists(spec)) else []


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
    try:
        unknown = unknown_options(argv)
        if unknown:
            raise OptionError(f"unknown option {unknown[0]}; see --help")
        check_options(ft)
        local = workers_see_launcher_disk(options)  # checks --environment_type too
        cloud.check_gcs_reachable(cloud.urls_of(ft))  # in seconds, not after gcsfs's retries
        found = zarr_store.refuse_occupied(ft.output, ft.overwrite)  # before any data is read
        plan = plan_job(ft)
        plan.expected_owner = found.owner  # CreateOutput replaces only this, or stops
        inputs = [f.url for f in plan.files] + _tokenizer_file(ft.tokenizer) + ([ft.mixture] if ft.mixture else [])
        refuse_overlaps(ft.output, inputs, plan.rejected_url)
        zarr_store.check_writable(plan.target)
    except (OptionError, InputError, TokenizerError, zarr_store.OutputError) as e:
        return _fail(str(e), USAGE_ERROR)

    started = time.time()
    if local:
        tuned = allocator.keep_freed_memory_for_reuse()
        logs.log().debug("malloc keeps freed memory for reuse: %s", tuned)
    with tempfile.TemporaryDirectory(prefix="flat-tokens-progress-") as progress_dir:
        if local and not ft.quiet:
            plan.progress_dir = progress_dir
        if local:
            plan.spill_dir = spill.make_directory(plan.target.run_id, local_temp_root(options))
            logs.log().debug("shard parts wait for the sort in %s", plan.spill_dir)
        try:
            code = _run(options, plan, ft)
        finally:
            if plan.spill_dir:
                spill.remove_directory(plan.spill_dir)
    if code is not None:
        return code
    summary = summarize(ft.output, time.time() - started, plan.target.storage_options)
    if ft.summary_json:  # before printing: a closed stdout must not cost the scheduler its JSON
        with open(ft.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
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
