"""The memory the output's chunk and shard sizes make a writer hold, checked at launch.

A writer holds each write block whole: a zarr 2 chunk (padded to its full size, even the
last one) while it is encoded, several at once on its thread pool; with zarr 3 sharding, a
whole shard, and the shard's index (16 bytes per chunk, allocated for every chunk of the
shard whatever the data). These needs do not depend on the data, so a size the machine
cannot hold is refused before any input is read (exit 2), not found after hours of reading
(MemoryError), or by the kernel's OOM killer with no message at all (issue 27.7: a shard of
1e9 chunks grew to 23 GB).

The bound: half of this machine's memory (the cgroup limit when there is one), the rest
being the tokenizer's, the shuffle's and the runner's; and never more than MAX_BLOCK_BYTES
for one block, which a cluster's workers must hold too (a Dataflow worker has 3.75 GB per
vCPU by default).
"""
import os

from pipeline.options import FlatTokensOptions, OptionError

MAX_BLOCK_BYTES = 1 << 31  # 2 GiB: the largest chunk or shard one writer may hold
SHARD_INDEX_BYTES = 16  # per chunk of a shard: offset and length, uint64 each
# Bytes a block costs per byte of its values while it is written: the values, the padded or
# contiguous copy the codec reads, and the encoded object (at worst as large).
COPIES = 3
ITEMSIZE = {"tokens_chunk_size": 4, "seq_starts_chunk_size": 8}  # uint32 tokens, uint64 starts
ARRAY = {"tokens_chunk_size": "encoded_tokens", "seq_starts_chunk_size": "seq_starts"}


def machine_memory() -> int:
    """This machine's memory in bytes, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


def writes_at_once(zarr_format: int) -> int:
    """Blocks a writer holds at once: zarr 2 chunks are encoded on a pool of this many
    threads (transforms/write/chunk_writers.py); zarr 3 blocks are written one at a time."""
    return max(4, os.cpu_count() or 1) if zarr_format == 2 else 1


def block_need(o: FlatTokensOptions, option: str) -> tuple[int, int]:
    """(bytes one block of the array sized by `option` makes a writer hold, blocks at once)."""
    chunks = o.chunks_per_shard if o.zarr_format == 3 and o.chunks_per_shard else 1
    need = COPIES * getattr(o, option) * chunks * ITEMSIZE[option]
    if chunks > 1:
        need += SHARD_INDEX_BYTES * chunks
    return need, writes_at_once(o.zarr_format)


def check_write_memory(o: FlatTokensOptions, memory: int | None = None) -> None:
    """OptionError (exit 2) naming the option whose size a writer could not hold."""
    memory = machine_memory() if memory is None else memory
    budget = memory // 2
    for option in ("tokens_chunk_size", "seq_starts_chunk_size"):
        need, at_once = block_need(o, option)
        if need <= MAX_BLOCK_BYTES and need * at_once <= budget:
            continue
        sharded = o.zarr_format == 3 and o.chunks_per_shard
        what = (f"--{option} {getattr(o, option)} with --chunks_per_shard {o.chunks_per_shard}: a writer holds a "
                f"whole {ARRAY[option]} shard of {o.chunks_per_shard:,} chunks"
                if sharded else f"--{option} {getattr(o, option)}: a writer holds a whole {ARRAY[option]} chunk")
        held = f"{_size(need)} per block" + (f", {at_once} at once: {_size(need * at_once)}" if at_once > 1 else "")
        raise OptionError(f"{what} in memory ({held}), more than {_limit(need, at_once, budget)}; "
                          f"{_advice(o, option, budget)}")


def _limit(need: int, at_once: int, budget: int) -> str:
    if need > MAX_BLOCK_BYTES:
        return f"the {_size(MAX_BLOCK_BYTES)} a block may take (a cluster's workers must hold it too)"
    return f"half of this machine's {_size(budget * 2)} of memory"


def _advice(o: FlatTokensOptions, option: str, budget: int) -> str:
    """The largest size that fits, for the option that makes the block large."""
    _, at_once = block_need(o, option)
    cap = min(MAX_BLOCK_BYTES, budget // at_once)
    if o.zarr_format == 3 and o.chunks_per_shard:
        per_chunk = COPIES * getattr(o, option) * ITEMSIZE[option] + SHARD_INDEX_BYTES
        return f"use --chunks_per_shard {max(1, cap // per_chunk)} or fewer at this chunk size"
    return f"use --{option} {max(1, cap // (COPIES * ITEMSIZE[option]))} or smaller"


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"
