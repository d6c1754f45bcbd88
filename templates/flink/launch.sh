#!/usr/bin/env bash
# Run flat-tokens-beam on a Flink cluster through Beam's Flink job server (PortableRunner).
#
#   templates/flink/launch.sh build-image          build (and with PUSH=1 push) the SDK container image
#   templates/flink/launch.sh job-server           start Beam's Flink job server in front of FLINK_MASTER
#   templates/flink/launch.sh worker-pool          start an SDK worker pool from SDK_IMAGE (EXTERNAL; one per TaskManager host)
#   templates/flink/launch.sh run [options...]     submit `python -m pipeline.run` to the job server
#   templates/flink/launch.sh local [options...]   the closest equivalent that runs on one machine with no
#                                                  Flink and no Docker: Beam's Python job service + an
#                                                  EXTERNAL worker pool (what the project tests)
#   templates/flink/launch.sh stop                 stop the containers started by job-server / worker-pool
#   templates/flink/launch.sh flink-versions       the Flink versions the installed apache-beam has job servers for
#
# [options...] are pipeline.run's: --input ... --output ... --tokenizer ... [--num_shards N ...].
# Exit status is pipeline.run's: 0 committed, 1 the pipeline failed, 2 usage/configuration error.
# DRY_RUN=1 prints the commands instead of running them.
#
# Settings (environment variables, defaults in brackets):
#   BEAM_VERSION [2.77.0]   must equal the submitting Python's apache-beam
#   FLINK_VERSION [the newest 1.x that apache-beam publishes a job server for]  the cluster's Flink major.minor;
#                           one of FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS (see `flink-versions`)
#   SDK_IMAGE [flat-tokens-beam-sdk:$BEAM_VERSION]  the image built from templates/flink/Dockerfile;
#                           a registry path (e.g. us-docker.pkg.dev/P/R/flat-tokens-beam-sdk:2.77.0) for a real cluster
#   FLINK_MASTER [localhost:8081]   the JobManager's REST address
#   JOB_SERVER_JAR []       use beam-runners-flink-$FLINK_VERSION-job-server-$BEAM_VERSION.jar with `java -jar`
#                           instead of the docker image apache/beam_flink${FLINK_VERSION}_job_server:$BEAM_VERSION
#   JOB_HOST [localhost]  JOB_PORT [8099]  ARTIFACT_PORT [8098]  EXPANSION_PORT [8097]
#   ARTIFACTS_DIR [/tmp/beam-artifact-staging]  the job server's staging directory; TaskManagers read it back,
#                           so on a multi-host cluster use a shared location (a mounted volume, gs://...)
#   ENVIRONMENT_TYPE [DOCKER]  DOCKER: each TaskManager runs SDK_IMAGE containers (needs docker on the hosts);
#                              EXTERNAL: SDK workers come from a worker pool next to each TaskManager
#   WORKER_POOL [localhost:50000]  the pool's address as seen from a TaskManager (EXTERNAL)
#   PARALLELISM [16]        Flink parallelism of the job (= TaskManagers x slots is a good start)
#   SDK_WORKER_PARALLELISM [0]  SDK worker processes per TaskManager (0 = the runner picks; 1 per slot is typical)
#   PYTHON [python; for `local`: the repository's .venv/bin/python when present]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
BEAM_VERSION=${BEAM_VERSION:-2.77.0}
FLINK_VERSION=${FLINK_VERSION:-}
SDK_IMAGE=${SDK_IMAGE:-flat-tokens-beam-sdk:$BEAM_VERSION}
JOB_SERVER_IMAGE=${JOB_SERVER_IMAGE:-}
JOB_SERVER_JAR=${JOB_SERVER_JAR:-}
FLINK_MASTER=${FLINK_MASTER:-localhost:8081}
JOB_HOST=${JOB_HOST:-localhost}
JOB_PORT=${JOB_PORT:-8099}
ARTIFACT_PORT=${ARTIFACT_PORT:-8098}
EXPANSION_PORT=${EXPANSION_PORT:-8097}
ARTIFACTS_DIR=${ARTIFACTS_DIR:-/tmp/beam-artifact-staging}
ENVIRONMENT_TYPE=${ENVIRONMENT_TYPE:-DOCKER}
WORKER_POOL=${WORKER_POOL:-localhost:50000}
PARALLELISM=${PARALLELISM:-16}
SDK_WORKER_PARALLELISM=${SDK_WORKER_PARALLELISM:-0}
DRY_RUN=${DRY_RUN:-0}

# Prints the command (shell-quoted) when DRY_RUN=1, runs it otherwise.
run() {
    if [[ $DRY_RUN == 1 ]]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# The Python that has apache-beam: $PYTHON, else the repository's .venv, else python on PATH.
beam_python() {
    if [[ -n ${PYTHON:-} ]]; then echo "$PYTHON"
    elif [[ -x $REPO_ROOT/.venv/bin/python ]]; then echo "$REPO_ROOT/.venv/bin/python"
    else echo python
    fi
}

# Beam publishes a Flink job server (image and jar) for each Flink major.minor in the installed
# apache-beam's FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS. Prints that list on line 1 and the
# default on line 2: the newest 1.x (Beam's 2.x runners are recent and Flink 2 changes the
# cluster's configuration file; see README.md), or the newest of all when there is no 1.x.
published_flink_versions() {
    "$(beam_python)" - <<'EOF'
import logging
logging.disable(logging.WARNING)  # Beam's import-time noise
from apache_beam.options.pipeline_options import FlinkRunnerOptions
versions = list(FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS)
newest = lambda vs: max(vs, key=lambda v: tuple(int(n) for n in v.split(".")))
print(" ".join(versions))
print(newest([v for v in versions if v.startswith("1.")] or versions))
EOF
}

# Sets FLINK_VERSION (default: see above) and JOB_SERVER_IMAGE; exit 2 for a version without a job server.
choose_flink_version() {
    local out supported default
    if ! out=$(published_flink_versions); then
        echo "launch.sh: cannot read the Flink versions from apache-beam in $(beam_python); set PYTHON" >&2
        exit 2
    fi
    supported=$(sed -n 1p <<<"$out")
    default=$(sed -n 2p <<<"$out")
    FLINK_VERSION=${FLINK_VERSION:-$default}
    if [[ " $supported " != *" $FLINK_VERSION "* ]]; then
        echo "launch.sh: FLINK_VERSION=$FLINK_VERSION: apache-beam publishes Flink job servers only for" \
             "Flink $supported; use the one that equals the cluster's major.minor" >&2
        exit 2
    fi
    JOB_SERVER_IMAGE=${JOB_SERVER_IMAGE:-apache/beam_flink${FLINK_VERSION}_job_server:$BEAM_VERSION}
}

cmd_flink_versions() {
    local out
    out=$(published_flink_versions)
    echo "supported: $(sed -n 1p <<<"$out")"
    echo "default: $(sed -n 2p <<<"$out")"
}

cmd_build_image() {
    run docker build -f "$REPO_ROOT/templates/flink/Dockerfile" --build-arg "BEAM_VERSION=$BEAM_VERSION" \
        -t "$SDK_IMAGE" "$REPO_ROOT"
    if [[ ${PUSH:-0} == 1 ]]; then
        run docker push "$SDK_IMAGE"
    fi
}

cmd_job_server() {
    choose_flink_version
    # Staged artifacts are read back on the TaskManagers: with more than one host, ARTIFACTS_DIR
    # must be a location they can all read (a shared mount, or gs://... on GCP).
    local args=(--flink-master="$FLINK_MASTER" --job-host=0.0.0.0 --job-port="$JOB_PORT"
                --artifact-port="$ARTIFACT_PORT" --expansion-port="$EXPANSION_PORT"
                --artifacts-dir="$ARTIFACTS_DIR")
    if [[ -n $JOB_SERVER_JAR ]]; then
        run java -jar "$JOB_SERVER_JAR" "${args[@]}"
    else
        run docker run -d --rm --name flat-tokens-flink-job-server --network=host \
            "$JOB_SERVER_IMAGE" "${args[@]}"
    fi
}

cmd_worker_pool() {
    # One per TaskManager host, on the host network so that the TaskManager reaches it at
    # localhost:50000. Mount credentials or a shared filesystem here when the input/output need
    # them (e.g. -v /etc/gcp/key.json:/key.json:ro -e GOOGLE_APPLICATION_CREDENTIALS=/key.json).
    run docker run -d --rm --name flat-tokens-sdk-worker-pool --network=host \
        ${WORKER_POOL_DOCKER_ARGS:-} "$SDK_IMAGE" --worker_pool
}

cmd_stop() {
    run docker rm -f flat-tokens-flink-job-server flat-tokens-sdk-worker-pool
}

cmd_run() {
    local env_config
    case $ENVIRONMENT_TYPE in
        DOCKER) env_config=$SDK_IMAGE ;;
        EXTERNAL) env_config=$WORKER_POOL ;;
        *) echo "launch.sh: ENVIRONMENT_TYPE must be DOCKER or EXTERNAL, is $ENVIRONMENT_TYPE" >&2; exit 2 ;;
    esac
    local python=${PYTHON:-python}
    run "$python" -m pipeline.run \
        --runner=PortableRunner \
        --job_endpoint="$JOB_HOST:$JOB_PORT" \
        --environment_type="$ENVIRONMENT_TYPE" \
        --environment_config="$env_config" \
        --parallelism="$PARALLELISM" \
        --sdk_worker_parallelism="$SDK_WORKER_PARALLELISM" \
        "$@"
}

free_port() {
    "$1" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_for_port() {  # python port seconds
    "$1" - "$2" "$3" <<'EOF'
import socket, sys, time
port, deadline = int(sys.argv[1]), time.time() + float(sys.argv[2])
while time.time() < deadline:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"launch.sh: nothing listens on port {port}")
EOF
}

cmd_local() {
    local python=${PYTHON:-}
    if [[ -z $python ]]; then
        if [[ -x $REPO_ROOT/.venv/bin/python ]]; then python=$REPO_ROOT/.venv/bin/python; else python=python; fi
    fi
    python=$(command -v "$python")
    local job_port pool_port
    job_port=${LOCAL_JOB_PORT:-$(free_port "$python")}
    pool_port=${LOCAL_POOL_PORT:-$(free_port "$python")}
    # The worker pool starts each SDK worker with the `python` on PATH: put this interpreter's
    # directory first, or the job hangs. Workers import `pipeline`, `transforms` and `flat_tokens` from the checkout.
    local env_vars=(PATH="$(dirname "$python"):$PATH" PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}")
    if [[ $DRY_RUN == 1 ]]; then
        run env "${env_vars[@]}" "$python" -m apache_beam.runners.worker.worker_pool_main --service_port="$pool_port"
        run env "${env_vars[@]}" "$python" -m apache_beam.runners.portability.local_job_service_main --port="$job_port"
        run env "${env_vars[@]}" "$python" -m pipeline.run --runner=PortableRunner --job_endpoint="localhost:$job_port" \
            --environment_type=EXTERNAL --environment_config="localhost:$pool_port" "$@"
        return 0
    fi
    cd "$REPO_ROOT"
    local logdir
    logdir=$(mktemp -d "${TMPDIR:-/tmp}/flat-tokens-local-portable.XXXXXX")
    # Each service in its own session/process group, so that stopping it stops its workers too.
    env "${env_vars[@]}" setsid "$python" -m apache_beam.runners.worker.worker_pool_main \
        --service_port="$pool_port" >"$logdir/worker-pool.log" 2>&1 &
    local pool_pid=$!
    env "${env_vars[@]}" setsid "$python" -m apache_beam.runners.portability.local_job_service_main \
        --port="$job_port" >"$logdir/job-service.log" 2>&1 &
    local job_pid=$!
    # shellcheck disable=SC2064  # expand the pids now
    trap "kill -TERM -- -$pool_pid -$job_pid 2>/dev/null || true; wait $pool_pid $job_pid 2>/dev/null || true" EXIT
    wait_for_port "$python" "$pool_port" 60
    wait_for_port "$python" "$job_port" 60
    local rc=0
    env "${env_vars[@]}" "$python" -m pipeline.run --runner=PortableRunner --job_endpoint="localhost:$job_port" \
        --environment_type=EXTERNAL --environment_config="localhost:$pool_port" "$@" || rc=$?
    if [[ $rc != 0 ]]; then
        echo "launch.sh: pipeline.run exited $rc; service logs in $logdir" >&2
    else
        rm -rf "$logdir"
    fi
    return "$rc"
}

[[ $# -ge 1 ]] || usage
command=$1
shift
case $command in
    build-image) cmd_build_image "$@" ;;
    job-server) cmd_job_server "$@" ;;
    worker-pool) cmd_worker_pool "$@" ;;
    stop) cmd_stop "$@" ;;
    flink-versions) cmd_flink_versions "$@" ;;
    run) cmd_run "$@" ;;
    local) cmd_local "$@" ;;
    -h|--help|help) usage ;;
    *) echo "launch.sh: unknown command $command" >&2; usage ;;
esac
