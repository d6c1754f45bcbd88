"""Where the SDK workers run, and whether they see the launcher's disk.

The launcher can hand workers a local directory (the shuffle's spill files, progress files)
only when every worker sees its disk. That is decided from how the workers are started,
not from the runner's name alone: the default runner may start them in other mount
namespaces, containers or machines when --environment_type asks it to (docs/design.md,
"Who sees which disk").
"""
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions

from pipeline.options import OptionError

# Runners whose workers, unless told otherwise, are threads of the launcher or subprocesses
# Beam starts beside it (--direct_running_mode multi_processing).
LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner"}
SUBPROCESS = "beam:env:harness_subprocess_python:v1"  # Beam's python_urns.SUBPROCESS_SDK


def workers_see_launcher_disk(options: PipelineOptions) -> bool:
    """True only on a local runner whose workers the launcher starts itself, in its own
    process or beside it. Workers started by a command of the user's (--environment_type on
    the default runner), an EXTERNAL pool, and Dataflow's or Flink's workers may share
    nothing with the launcher but the storage of the inputs and the output."""
    if options.view_as(StandardOptions).runner not in LOCAL_RUNNERS:
        return False
    return worker_environment(options) is None


def worker_environment(options: PipelineOptions, report_dir: str | None = None):
    """The environment the default runner starts its SDK workers in when --environment_type
    asks for one (SUBPROCESS with a command in --environment_config, say), else None:
    in-process, or Beam's own multi_processing workers. OptionError for a kind of
    environment the default runner cannot start. With `report_dir`, a SUBPROCESS command is
    started under pipeline/local/worker_guard.py, which reports a worker that ends with an error
    there (the runner itself would wait for it forever)."""
    if options.view_as(StandardOptions).runner not in (None, "DirectRunner"):
        return None  # another runner reads --environment_type itself, or ignores it
    portable = options.view_as(PortableOptions)
    kind = portable.environment_type
    if not kind:
        return None
    from apache_beam.portability import common_urns
    from apache_beam.transforms.environments import Environment

    startable = {SUBPROCESS, common_urns.environments.EXTERNAL.urn, common_urns.environments.DOCKER.urn}
    named = getattr(common_urns.environments, kind, None) if kind.isupper() else None
    if (kind if kind.startswith("beam:env:") else named.urn if named else None) not in startable:
        raise OptionError(f"--environment_type {kind}: the default runner cannot start workers that way; it "
                          f"starts them with {SUBPROCESS} (a command that starts one worker, in "
                          f"--environment_config), EXTERNAL (a worker pool) or DOCKER. PROCESS and LOOPBACK "
                          f"are for --runner=PortableRunner")
    environment = Environment.from_options(portable)
    if report_dir is not None and hasattr(environment, "command_string"):  # SubprocessSDKEnvironment
        from pipeline.local import worker_guard
        environment.command_string = worker_guard.wrap(environment.command_string, report_dir)
    return environment
