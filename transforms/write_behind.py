"""Writing a batch's file on a thread while the bundle goes on with the next batch.

On these machines writing into new page-cache pages costs ~2.4 s of system time per GiB
(benchmarks/bench_page_cost.py); on the thread that reads and tokenizes it left a core idle.
One write is in flight at a time, so at most two batches' data are held; the DoFn that
owns a WriteBehind waits for the last write before its bundle ends, so nothing downstream
reads a file that has not landed, and a failed write fails the bundle.
"""
from concurrent.futures import Future, ThreadPoolExecutor


class WriteBehind:
    """A one-thread writer for a DoFn: made in setup(), closed in teardown()."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._last: Future | None = None

    def submit(self, write, *args) -> Future:
        """Waits for the write in flight (raising its error), then starts `write(*args)`."""
        self.wait()
        self._last = self._pool.submit(write, *args)
        return self._last

    def wait(self) -> None:
        """Waits for the write in flight, raising its error."""
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def forget(self) -> None:
        """A new bundle: a failed bundle's write in flight is not its to wait for."""
        self._last = None

    def close(self) -> None:
        self._pool.shutdown()
