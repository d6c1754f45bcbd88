"""The multi_processing workers of a local run, forked from the launcher instead of started
as new interpreters.

Beam's multi_processing mode starts each SDK worker as a new Python process: each imports
Beam, numpy, zarr and this package again, and loads the tokenizer again (fastokens, and
HF tokenizers for the guard), ~1.5-3 s of CPU per worker before its first element, and for
N workers N times (docs/performance.md, "Performance IV"). A worker forked from the
launcher has all of it already, in pages it shares copy-on-write, and starts in
milliseconds. It is the same SDK harness (pipeline/local/worker.py): it connects to the runner's
control endpoint, and elements, state and side inputs cross the runner over gRPC as before.

A process must not fork once gRPC runs threads in it: their locks may be held, and the
child would miss the threads. So when the runner is about to start (before its gRPC
server exists) the launcher forks one process, the fork server, which only waits on a pipe;
each worker the runner asks for is forked by the server, from the state the launcher was in:
modules imported, tokenizer loaded, every object frozen out of the garbage collector's
sight (`gc.freeze`, so that collections do not touch, and copy, those pages).

What a worker shares with the launcher is only what the launcher held before the run: DoFns
come from the job's graph as in any worker, and nothing a stage does in one worker reaches
another. (The per-process tokenizer cache is inherited: the same tokenizer, checked by
sha256 as the DoFn asks for it.) Fresh interpreters in mount namespaces of their own, where
nothing the launcher held can reach a worker, are still tested (tests/test_cluster.py).

Linux only; `FLAT_TOKENS_FORK_WORKERS=0` starts Beam's way instead (pipeline/local/worker.py).
"""
import gc
import json
import logging
import os
import signal
import sys
import threading
import time

from apache_beam.portability import python_urns
from apache_beam.portability.api import endpoints_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from google.protobuf import json_format, text_format

from pipeline import logs
from pipeline.local import worker

URN = "flat-tokens:env:forked_python_worker:v1"
SWITCH = "FLAT_TOKENS_FORK_WORKERS"  # "0": start workers as new interpreters, Beam's way
# How long the launcher waits, once the run ended, for its workers to exit before it stops them.
STOP_SECONDS = 60

_server = None  # the ForkServer of the run in progress: one per launcher, set by `serving`


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork") and os.environ.get(SWITCH, "1") != "0"


class ForkServer:
    """A process forked from the launcher that forks workers on request: one JSON line (the
    worker's environment variables) in, one line (its pid) out. Closing the request pipe
    tells it to wait for every worker and exit."""

    def __init__(self):
        requests_r, self._requests = os.pipe()
        self._replies, replies_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # or the workers would write it again when they flush theirs
            stream.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the server
            # What the launcher holds stays out of the collector's sight in the server and its
            # workers: a collection writes to every object it traverses, which would copy
            # the pages shared with the launcher. (Linking the lists is O(1).)
            gc.freeze()
            os.close(self._requests)
            os.close(self._replies)
            _serve(requests_r, replies_w)  # never returns
        os.close(requests_r)
        os.close(replies_w)
        self._replies_file = os.fdopen(self._replies, "rb")
        self._lock = threading.Lock()
        self.workers: list[int] = []
        self.status: int | None = None

    def fork_worker(self, environment: dict) -> int:
        with self._lock:
            try:
                os.write(self._requests, json.dumps(environment).encode() + b"\n")
                reply = self._replies_file.readline()
            except OSError:
                reply = b""
            if not reply:
                raise RuntimeError("the process that forks the workers (the fork server) has ended")
            self.workers.append(int(reply))
            return self.workers[-1]

    def close(self, timeout: float = STOP_SECONDS) -> int:
        """Tells the server to wait for its workers and exit; waits for it (their CPU time is
        then counted in this process's children's). Workers that outlive `timeout` (the runner
        closed their connections: they should be gone) are stopped."""
        if self.status is not None:
            return self.status
        os.close(self._requests)
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                for worker in self.workers + [self.pid]:
                    try:
                        os.kill(worker, signal.SIGKILL)
                    except OSError:
                        pass
                _, status = os.waitpid(self.pid, 0)
                break
            time.sleep(0.01)
        self._replies_file.close()
        self.status = os.waitstatus_to_exitcode(status)
        return self.status


def _serve(requests_fd: int, replies_fd: int) -> None:
    """The fork server's loop. It exits (never returns) when the launcher closes the pipe or
    ends, after every worker it forked has exited; its status is the first failed worker's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    workers = []
    code = 0
    try:
        with os.fdopen(requests_fd, "rb") as requests:
            for line in requests:
                environment = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os.close(replies_fd)
                    requests.close()
                    _run_worker(environment)  # never returns
                workers.append(pid)
                os.write(replies_fd, b"%d\n" % pid)
        for pid in workers:
            _, status = os.waitpid(pid, 0)
            code = code or os.waitstatus_to_exitcode(status)
    except BaseException:  # noqa: BLE001 - a server never returns into the launcher's code
        code = code or 70
    finally:
        os._exit(code if 0 <= code < 256 else 1)


def _run_worker(environment: dict) -> None:
    """A forked worker: Beam's SDK harness until the runner closes its connection."""
    code = 0
    try:
        os.environ.update(environment)
        # HF tokenizers warns on stderr, in a process forked after it used its threads,
        # that it will use none: the guard's reference needs none in a worker.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        worker.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - worker.main logged it; the runner sees the lost worker
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.__stderr__):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


@worker_handlers.WorkerHandler.register_environment(URN, bytes)
class ForkedWorkerHandler(worker_handlers.GrpcWorkerHandler):
    """The runner's side of one forked worker: what Beam's SubprocessSdkWorkerHandler does for
    a worker it starts with a command, without a command. The worker gets no logging endpoint:
    it logs to stderr itself (pipeline/local/worker.py), and a failed bundle's error reaches the
    runner in the bundle's response."""

    def __init__(self, payload, state, provision_info, grpc_server):
        super().__init__(state, provision_info, grpc_server)
        self._environment = {k: v for k, v in json.loads(payload.decode() or "{}").items()}
        self.pid = None

    def start_worker(self):
        if _server is None:
            raise RuntimeError("flat-tokens: a forked worker was asked for outside pipeline.run's FnApiRunner")
        control = endpoints_pb2.ApiServiceDescriptor(url=self.control_address)
        self.pid = _server.fork_worker({
            **self._environment,
            "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(control),
            "PIPELINE_OPTIONS": json_format.MessageToJson(self.provision_info.provision_info.pipeline_options),
            "WORKER_ID": self.worker_id})

    def stop_worker(self):
        pass  # it exits when the runner closes its control connection; ForkServer.close waits for it


def fork_instead_of_starting(pipeline_proto, environment: dict) -> bool:
    """Makes the job's subprocess environments that run Beam's SDK harness as Beam's
    multi_processing mode starts it forked ones, whose workers get `environment` as well;
    True if there was one. A command of the user's (--environment_type, --environment_config)
    is left as it is: it may start its workers where the launcher's memory must not reach."""
    found = False
    for env in pipeline_proto.components.environments.values():
        if env.urn == python_urns.SUBPROCESS_SDK and env.payload.decode().endswith(worker.BEAM_WORKER):
            env.urn = URN
            env.payload = json.dumps(environment).encode()
            found = True
    return found


class serving:
    """`with serving(pipeline_proto, environment):` around a run: the fork server exists while
    it lasts if the job has forked workers (fork_instead_of_starting), and is closed, its
    workers waited for, at the end."""

    def __init__(self, pipeline_proto, environment: dict):
        self._wanted = fork_instead_of_starting(pipeline_proto, environment)

    def __enter__(self):
        global _server
        if self._wanted:
            _server = ForkServer()
        return self

    def __exit__(self, *exc):
        global _server
        server, _server = _server, None
        if server is not None:
            status = server.close()
            if status:
                logs.log().debug("forked workers: the fork server exited with %s", status)
