"""A head start for the launcher: its tokenizer starts loading before Beam is imported
(and two process settings made before numpy and Beam are: see head_start).

Importing Beam takes ~0.8 s of one core and parsing a GPT-2 tokenizer.json ~0.5 s more
(fastokens, then HF tokenizers for the guard), which releases the GIL: started first, on
a background thread, the parsing overlaps the imports. Nothing depends on it: the run
asks the same per-process cache (transforms.tokenize.backends), which waits for a load
in progress or does it itself, and reports any error as usual.
"""
import gc
import os
import sys

from pipeline.local import allocator


def head_start(argv: list[str]) -> None:
    """What a `run` command line does first, before numpy or Beam is imported: one BLAS
    thread, the tokenizer loading on a thread, and the collector off until the graph is
    built (pipeline.run._run turns it back on). An address-space limit too small to run
    ends the process here, with one line and exit 2, before native code can abort it."""
    problem = allocator.address_space_shortfall()
    if problem and not {"-h", "--help", "--version"} & set(argv):
        print(f"flat-tokens: error: {problem}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(2)
    no_blas_threads()
    quiet_grpc()
    tokenizer_from_argv(argv)  # loads while Beam is imported
    gc.disable()


def no_blas_threads() -> None:
    """For the command line only, before numpy is imported: one BLAS thread, unless the
    user chose otherwise. numpy's OpenBLAS starts a thread per core when numpy is imported,
    and they spin a while for work that never comes: the pipeline never calls BLAS. perf put
    ~1% of a 250 MB run's CPU in `blas_thread_server`, taken from the imports it raced."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def quiet_grpc() -> None:
    """For the command line only, before gRPC is imported (here and, through the environment,
    in the runner's worker processes): gRPC's own log shows errors only, unless the user chose
    otherwise. Stopped by Ctrl-C, a worker's gRPC logged an INFO line about the closed
    connection ("Got goaway [2] ...") above the one line the command promises."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _last_value(argv: list[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def tokenizer_from_argv(argv: list[str]):
    """Starts loading the --tokenizer of a command line when it is a local file; returns
    the loading thread, or None."""
    spec = _last_value(argv, "--tokenizer")
    if not spec or not os.path.isfile(spec):
        return None
    try:
        with open(spec, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    from transforms.tokenize import backends as tokenizer_backends
    return tokenizer_backends.prefetch(text, _last_value(argv, "--tokenizer_backend") or tokenizer_backends.AUTO,
                                       "--split_special_tokens" in argv)
