"""The worker processes of `--direct_running_mode multi_processing`: Beam's SDK harness
(apache_beam.runners.worker.sdk_worker_main), with this project's logging and options.

Started as Beam starts its own (`python -m apache_beam.runners.worker.sdk_worker_main`, with
the job in environment variables), the harness printed ~24 lines of INFO per worker on
stderr, whatever --quiet said: importing Beam logs a warning through the root logger, which
installs Python's default stderr handler before the harness sets its level to INFO. It also
warned "Discarding unparseable args: [--output=...]", because the worker does not know this
job's options (they were not dropped: the launcher parsed them). Here our stderr handler is
installed first, and our options class is known; unless the job runs with --verbose, only
warnings reach stderr, and Beam's own harness messages only when critical (the launcher
reports a failure in one line). The harness still sends its records to the runner.
"""
import json
import logging
import os
import shlex
import signal
import sys

from pipeline import logs  # noqa: I001 (before apache_beam: our handler, so Beam's import-time warning is filtered)
from pipeline import options  # noqa: F401 (the harness then knows this job's options)
from apache_beam.runners.worker import sdk_worker_main

BEAM_WORKER = "-m apache_beam.runners.worker.sdk_worker_main"


def command() -> str:
    """The shell command that starts one of these workers (what Beam starts, with this module)."""
    return f"{shlex.quote(sys.executable)} -m pipeline.worker"


def run_our_workers(pipeline_proto) -> None:
    """Makes the job's subprocess workers (Beam's multi_processing environment) start this
    module instead of Beam's harness module; it runs that harness itself."""
    from apache_beam.portability import python_urns
    for environment in pipeline_proto.components.environments.values():
        if environment.urn == python_urns.SUBPROCESS_SDK and environment.payload.decode().endswith(BEAM_WORKER):
            environment.payload = command().encode()


def job_is_verbose(options_json: str | None) -> bool:
    """--verbose in the PIPELINE_OPTIONS the runner hands its workers (either of Beam's forms)."""
    found = json.loads(options_json or "{}")
    found = found.get("options", found)
    return bool(found.get("verbose") or found.get("beam:option:verbose:v1"))


def _stopped(signum, frame) -> None:
    """SIGTERM: the launcher is stopping the run and passes it on to its workers. It says so
    in one line; a worker ends without a traceback."""
    os._exit(128 + signum)


def main() -> None:
    # Ctrl-C reaches every process of the terminal's group: a worker leaves it to the
    # launcher, which stops its workers itself (SIGTERM) once it is ready to say why.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped)
    if job_is_verbose(os.environ.get("PIPELINE_OPTIONS")):
        logs.configure("verbose")
    else:
        logs.configure("quiet")
        for handler in logging.getLogger().handlers:  # the harness lowers the root logger to INFO
            handler.setLevel(logging.WARNING)
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        # The harness also prints each failed bundle's traceback straight to stderr; it sends
        # it to the runner too, and the launcher reports the cause in one line. Our handler
        # keeps the real stderr.
        sys.stderr = open(os.devnull, "w")
    try:
        sdk_worker_main.main(sys.argv)
    except BaseException:
        logs.log().critical("flat-tokens worker: the SDK harness failed", exc_info=True)
        raise


if __name__ == "__main__":
    main()
