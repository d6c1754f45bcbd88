#!/usr/bin/env python3
"""What new memory costs this machine's kernel: writing into fresh page-cache pages, and
touching fresh anonymous memory, each against the same work on pages just freed.

    python benchmarks/bench_page_cost.py [--mb 1024] [--dir /tmp]

A standalone script (no project imports). The pipeline writes every staged id and every
output byte into new page-cache pages, which the raw limit never does; on a virtual machine
that hands freed memory back to its host, each such page costs a fault in the host on first
touch, and that time is charged to the writing process as system time (docs/performance.md,
"Performance III"). Prints one line per measurement: wall, user and system seconds, and
system seconds per GiB.
"""
import argparse
import mmap
import os
import resource
import tempfile
import time

BLOCK = 4 << 20


def measured(label: str, mb: int, work) -> None:
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    work()
    after = resource.getrusage(resource.RUSAGE_SELF)
    sys_s = after.ru_stime - before.ru_stime
    print(f"{label:<44} {mb:>6,} MiB  wall {time.perf_counter() - started:6.2f}  user "
          f"{after.ru_utime - before.ru_utime:5.2f}  sys {sys_s:6.2f}  sys/GiB {sys_s * 1024 / mb:5.2f}")


def write_file(path: str, mb: int, block: bytes) -> None:
    with open(path, "wb") as f:
        for _ in range(mb // (len(block) >> 20)):
            f.write(block)


def touch_anonymous(mb: int) -> None:
    region = mmap.mmap(-1, mb << 20)
    for offset in range(0, mb << 20, mmap.PAGESIZE):
        region[offset] = 1
    region.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="MiB per measurement (a multiple of 4)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files are written (removed after)")
    args = ap.parse_args()
    if args.mb < 4 or args.mb % 4:
        ap.error("--mb must be a positive multiple of 4")
    block = os.urandom(1 << 20) * (BLOCK >> 20)
    folder = tempfile.mkdtemp(prefix="bench-page-cost-", dir=args.dir)
    first, second, third = (os.path.join(folder, name) for name in ("a", "b", "c"))
    try:
        measured("write into a new file", args.mb, lambda: write_file(first, args.mb, block))
        measured("write into another new file", args.mb, lambda: write_file(second, args.mb, block))
        os.unlink(first)  # its pages are free now, and the next file takes them at once
        measured("write into a new file, after deleting one", args.mb, lambda: write_file(third, args.mb, block))
    finally:
        for path in (first, second, third):
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(folder)
    for attempt in ("first", "second", "third"):
        measured(f"touch fresh anonymous memory ({attempt} time)", args.mb, lambda: touch_anonymous(args.mb))


if __name__ == "__main__":
    main()
