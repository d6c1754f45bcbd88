"""Entry point: python -m pipeline.run --input GLOB --output PATH --tokenizer SPEC [options] [Beam options]

Exit codes: 0 the dataset was written and committed (on Dataflow: the job was submitted;
it commits the dataset when it succeeds); 1 the pipeline failed (the output is left
uncommitted, and `pipeline.verify` rejects it); 2 a usage or configuration error, found
before any data was read.
"""
import contextlib
import json
import logging
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.graph import build_pipeline, plan_job
from pipeline.options import FlatTokensOptions, OptionError, check_options, help_text, unknown_options
from transforms import zarr_store
from transforms.inputs import InputError
from transforms.tokenize import TokenizerError

USAGE_ERROR = 2
PIPELINE_FAILED = 1


def _fail(message: str, code: int) -> int:
    print(f"flat-tokens: error: {message}", file=sys.stderr)
    return code


def summarize(output: str, wall_seconds: float, storage_options: dict | None = None) -> dict:
    """The end-of-run summary, from the committed dataset's own attributes."""
    attrs = zarr_store.read_root_attributes(output, storage_options)
    stats = attrs["stats"]
    tokens = sum(stats[s]["tokens"] for s in ("train", "validation"))
    return {"output": output, "stats": stats, "wall_seconds": round(wall_seconds, 3),
            "tokens_per_second": round(tokens / wall_seconds, 1) if wall_seconds > 0 else None,
            "tokenizer": attrs.get("tokenizer"), "run_id": attrs.get("run_id"),
            "rejected_output": attrs.get("rejected_output") if stats["rejected"] else None}


def format_summary(summary: dict) -> str:
    s = summary["stats"]
    lines = [f"flat-tokens: wrote {summary['output']}",
             f"  documents {s['documents']}  blank lines {s['blank']}  rejected lines {s['rejected']}  "
             f"empty documents {s['empty']}"]
    if summary.get("rejected_output"):
        reasons = ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
        lines.append(f"  rejected lines ({reasons}) are listed in {summary['rejected_output']}/")
    for split in ("train", "validation"):
        lines.append(f"  {split}: {s[split]['sequences']} sequences, {s[split]['tokens']} tokens, "
                     f"max_token_id {s[split]['max_token_id']}")
    lines.append(f"  {summary['wall_seconds']:.1f} s, {summary['tokens_per_second'] or 0:,.0f} tokens/s")
    return "\n".join(lines)


@contextlib.contextmanager
def _beam_errors_logged_quietly():
    """Beam logs every worker exception with its whole traceback before re-raising it; the
    cause is reported once, in one line, by main(). --log_level DEBUG shows everything."""
    loggers = [logging.getLogger(n) for n in ("apache_beam", "apache_beam.runners")]
    levels = [lg.level for lg in loggers]
    if logging.getLogger().level > logging.DEBUG:
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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(help_text())
        return 0
    options = PipelineOptions(argv)
    ft = options.view_as(FlatTokensOptions)
    try:
        unknown = unknown_options(argv)
        if unknown:
            raise OptionError(f"unknown option {unknown[0]}; see --help")
        check_options(ft)
        plan = plan_job(ft)
        if zarr_store.output_state(plan.target) == "occupied" and not ft.overwrite:
            raise zarr_store.OutputError(f"--output {ft.output}: exists and is not empty; pass --overwrite "
                                         f"to replace it, or choose another path")
        zarr_store.check_writable(plan.target)
    except (OptionError, InputError, TokenizerError, zarr_store.OutputError) as e:
        return _fail(str(e), USAGE_ERROR)

    started = time.time()
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, plan)
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
        logging.getLogger(__name__).debug("pipeline failure", exc_info=True)
        return _fail(f"the pipeline failed; {ft.output} was not committed. Cause: {cause}", PIPELINE_FAILED)
    summary = summarize(ft.output, time.time() - started)
    print(format_summary(summary))
    if ft.summary_json:
        with open(ft.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.WARNING)
    sys.exit(main())
