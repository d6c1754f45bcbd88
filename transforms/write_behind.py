"""Writing a batch's file on a thread while the bundle goes on with the next batch.

On these machines writing into new page-cache pages costs ~2.4 s of system time per GiB
(benchmarks/bench_page_cost.py); on the thread that reads and tokenizes it left a core idle.
One write is in flight at a time, so at most two batches' data are held; the DoFn that
owns a WriteBehind waits for the last write before its bundle ends, so nothing downstream
reads a file that has not landed, and a failed write fails the bundle. (The tokenizer's
guard runs its comparisons the same way: transforms/tokenize/tokenizer.py.)

The thread is started by the first write and stopped by close(), which the DoFn calls in
teardown(); a write after close() starts a thread again. Beam may call teardown() on an
instance whose bundle is still running on another thread (docs/design.md, "DoFn lifecycle"):
such a bundle's writes still land, or fail as writes, never with "cannot schedule new
futures after shutdown"."""
import threading
from concurrent.futures import Future, ThreadPoolExecutor


class WriteBehind:
    """A one-thread writer for a DoFn: made in setup(), closed in teardown(), usable again
    after close()."""

    def __init__(self, name: str):
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # close() may run on another thread than the bundle's
        self._last: Future | None = None

    def submit(self, write, *args) -> Future:
        """Waits for the write in flight (raising its error), then starts `write(*args)`."""
        self.wait()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name)
            submitted = self._last = self._pool.submit(write, *args)
        return submitted

    def wait(self) -> None:
        """Waits for the write in flight, raising its error."""
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def forget(self) -> None:
        """A new bundle: a failed bundle's write in flight is not its to wait for."""
        self._last = None

    def close(self) -> None:
        """Stops the thread once the write in flight has landed (its error is the bundle's)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()


class WritesBehindWithSpillDir:
    """Mixed into a DoFn (before beam.DoFn) that writes its files on a WriteBehind when it
    has a spill directory (`self._spill_dir`, set in its __init__; local runs only): the
    writer is made in setup(), forgets a failed bundle's write at the next bundle's start,
    is waited for at each bundle's finish (nothing downstream reads a file that has not
    landed) and closed in teardown(). `WRITER_NAME` names its thread."""

    WRITER_NAME = "flat-tokens-write"
    _spill_dir: str | None = None
    _writer: WriteBehind | None = None

    def setup(self):
        self._writer = WriteBehind(self.WRITER_NAME) if self._spill_dir else None

    def start_bundle(self):
        if self._writer:
            self._writer.forget()

    def finish_bundle(self):
        if self._writer:
            self._writer.wait()

    def teardown(self):
        if self._writer:
            self._writer.close()
