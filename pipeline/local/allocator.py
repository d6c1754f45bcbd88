"""Letting a local run reuse the memory it frees instead of faulting in fresh pages.

The in-process runner copies every shuffled byte several times (pickling, its data
channel, the grouping buffer, unpickling), each time into a new buffer of megabytes.
glibc's malloc serves large buffers with their own mmap() and gives the pages back to the
kernel when they are freed, so every copy pays a page fault per 4 KiB page: on these
machines an unpickle of 40 MB ran at 1.3 GB/s that way, and at 8.4 GB/s once freed memory
stayed in the heap. On the 250 MB benchmark the pipeline spent 2.1-2.5 s in the kernel
instead of 1.3-1.5 s, and took ~1 s longer (docs/performance.md).

The cost is that memory freed during the run is kept for reuse rather than returned, so
the peak resident size can rise a little (1.51 -> 1.62 GB when measured).
"""
import ctypes
import os

try:
    import resource
except ImportError:  # not on Windows
    resource = None

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1 << 30  # buffers below 1 GiB come from the heap, and go back to it
TRIM_THRESHOLD = (1 << 31) - 1  # keep up to 2 GiB of free heap instead of returning it

# The same settings for the processes this one starts (multi_processing workers), which
# read them from the environment when their C library starts.
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


def keep_freed_memory_for_reuse() -> bool:
    """Applies the thresholds to this process and its future children; False where the C
    library is not glibc (macOS, musl), or where the user set either variable: both are
    then left as they are."""
    if any(name in os.environ for name in ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1):
        return False
    os.environ.update(ENVIRONMENT)
    return True


# The address space a run needs at the least: measured, the bundled sample on 2 cores ran with
# `ulimit -v` 1.1 GB and failed below (Python: "can't start new thread"; under ~0.6 GB the
# tokenizer's Rust code aborts the process, "memory allocation of N bytes failed").
MIN_ADDRESS_SPACE = 1 << 30


def address_space_shortfall() -> str | None:
    """Why this process's address-space limit (`ulimit -v`) is too small to run, or None.

    Native code (tokenizers, fastokens) aborts the whole process when an allocation fails,
    with a Rust backtrace: a limit known to be too small is said in one line first."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= MIN_ADDRESS_SPACE:
        return None
    return (f"the address-space limit (ulimit -v) is {soft >> 20:,} MiB, below the {MIN_ADDRESS_SPACE >> 20:,} MiB "
            f"a run needs at the least (more with more cores: every thread reserves address space); raise it, "
            f"e.g. ulimit -v unlimited")
