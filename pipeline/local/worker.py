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

from transforms import cores

BEAM_WORKER = "-m apache_beam.runners.worker.sdk_worker_main"


def command(environment: dict | None = None) -> str:
    """The shell command that starts one of these workers (what Beam starts, with this
    module), with `environment`'s variables set."""
    assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in (environment or {}).items())
    return f"{assignments}{shlex.quote(sys.executable)} -m pipeline.local.worker"


def run_our_workers(pipeline_proto, environment: dict | None = None) -> None:
    """Makes the job's subprocess workers (Beam's multi_processing environment) start this
    module instead of Beam's harness module; it runs that harness itself."""
    from apache_beam.portability import python_urns
    for env in pipeline_proto.components.environments.values():
        if env.urn == python_urns.SUBPROCESS_SDK and env.payload.decode().endswith(BEAM_WORKER):
            env.payload = command(environment).encode()


def environment_for(workers: int) -> dict:
    """What the launcher tells the `workers` processes it starts on its machine: their share
    of the cores (transforms/cores.py)."""
    return {cores.ENVIRONMENT: str(max(1, cores.available() // max(1, workers)))}


def job_is_verbose(options_json: str | None) -> bool:
    """--verbose in the PIPELINE_OPTIONS the runner hands its workers (either of Beam's forms)."""
    found = json.loads(options_json or "{}")
    found = found.get("options", found)
    return bool(found.get("verbose") or found.get("beam:option:verbose:v1"))


def _stopped(signum, frame) -> None:
    """SIGTERM: the launcher is stopping the run and passes it on to its workers. It says so
    in one line; a worker ends without a traceback."""
    os._exit(128 + signum)


def size_tokenizer_threads() -> None:
    """The tokenizers' thread pools sized by this worker's share of the cores (set by the
    launcher, transforms/cores.py), not by the whole machine's; a setting the user made is
    left alone. Read by the tokenizers when they first encode, after this."""
    if cores.ENVIRONMENT not in os.environ:
        return
    threads = str(cores.share())
    os.environ.setdefault("FASTOKENS_BPE_THREADS", threads)  # fastokens
    os.environ.setdefault("RAYON_NUM_THREADS", threads)  # HF tokenizers (the guard's reference)


def main() -> None:
    size_tokenizer_threads()
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
