"""What data loaders need from the reader, with neither torch nor jax: a packed-batch stream
that DataLoader workers split among themselves, with state for resuming, and a map-style
source of sequences. flat_tokens/torch_data.py and flat_tokens/jax_data.py are the thin framework
layers on top (docs/training.md shows both in use).

    from flat_tokens.loaders import PackedBatchStream, SequenceSource

    stream = PackedBatchStream(split, 2048, 32, seed=0, rank=rank, world_size=world_size)
    for inputs, targets in stream: ...                 # host `rank`'s packed_batches, as is
    stream.batches(worker=1, num_workers=2)            # steps 1, 3, 5, ... of it: one worker's part
    state = stream.state_dict(); stream.load_state_dict(state)

A DataLoader with `num_workers=K` iterates a copy of the dataset in each worker and takes one
item from each worker in turn (worker 0, 1, ..., K-1, 0, ...). So worker j serving the steps
j, j+K, j+2K, ... of the host's stream makes the loader's output exactly that stream, batch
by batch; every item is a whole batch (use `batch_size=None`). A worker reads only the windows
of its steps: the order deals each lane piece's windows to the steps by phase (bit-reversed
step % 8, flat_tokens/batch_order.py), so for K = 1, 2, 4 or 8 a worker's steps take a contiguous
1/K of every piece, and the K workers read the host's share about once in all (measured: 2
ranks x 2 workers, 0.25 of the split each). A blend's workers still read most of the host's
share each (the splits' lanes advance by the blend's choices, not by step).

State follows torchdata's StatefulDataLoader convention: `state_dict()` is this copy's
position (the next step it serves), `load_state_dict(state)` sets it before iteration, and a
StatefulDataLoader keeps one state per worker. A state saved in one process (no workers)
resumes under any number of workers; a worker's state resumes that worker, under the same
number of workers. The step is the global batch's, so a state (or `start_step=k`) resumes on
any number of hosts: each host loads it with its own rank and world size.
"""
from __future__ import annotations

import operator
from collections.abc import Iterator

import numpy as np

from flat_tokens.blend import Blend
from flat_tokens.batch_order import host_rows
from flat_tokens.reader import BLOCK_TOKENS, BUFFER_BLOCKS, FlatTokensSplit, checked_count, window_length

STATE_VERSION = 1


class PackedBatchStream:
    """Host `rank`'s packed batches of a split (FlatTokensSplit.packed_batches) or of a Blend
    (Blend.packed_batches; its seed is the blend's, and it is endless), as an iterable with
    state that data loader workers split by step. Pickles (by the split's URL)."""

    def __init__(self, data: FlatTokensSplit | Blend, length: int, batch_size: int, *, seed: int = 0,
                 start_step: int = 0, epochs: int | None = None, rank: int = 0, world_size: int = 1,
                 segments: bool = False, sources: bool = False, block_tokens: int = BLOCK_TOKENS,
                 buffer_blocks: int = BUFFER_BLOCKS):
        if isinstance(data, Blend) and (seed != 0 or epochs is not None):
            raise ValueError("a Blend has its own seed (Blend(..., seed=)) and no epochs: pass neither")
        if not isinstance(data, (Blend, FlatTokensSplit)):
            raise TypeError(f"data must be a FlatTokensSplit or a Blend, got {type(data).__name__}")
        self.data = data
        self.length, self.batch_size = window_length(length), checked_count(batch_size, "batch_size")
        self.lanes = host_rows(self.batch_size, rank, world_size)  # this host's rows of every global batch
        self.rank, self.world_size, self.rows = operator.index(rank), operator.index(world_size), len(self.lanes)
        self.seed, self.epochs = seed, epochs
        self.options = {"segments": bool(segments), "sources": bool(sources), "block_tokens": block_tokens,
                        "buffer_blocks": buffer_blocks}
        self._batches(checked_count(start_step, "start_step", 0), 1)  # checks every argument now, reads nothing
        self._next = start_step  # the next step this copy serves
        self._worker: tuple[int, int] | None = None  # (worker, num_workers) once iterated as one

    def _batches(self, first: int, every: int) -> Iterator:
        """Steps first, first + every, ... of this host's stream (a generator: reads when iterated)."""
        o = self.options
        if isinstance(self.data, Blend):
            orders = self.data._orders(self.length, self.batch_size, o["block_tokens"], o["buffer_blocks"])
            if len(self.data.splits) >= 1 << 16 and o["sources"]:
                raise ValueError("sources are uint16: at most 65,535 splits")
            return self.data._batches(orders, self.length, self.lanes, first, o["segments"], o["sources"], every)
        if o["sources"]:
            self.data._need_sources()
        epochs = None if self.epochs is None else checked_count(self.epochs, "epochs", 0)
        order = self.data._batch_order(self.length, self.batch_size, self.seed, o["block_tokens"], o["buffer_blocks"])
        return self.data._packed_batches(order, self.length, self.lanes, first, epochs, o["segments"], o["sources"],
                                         every)

    def batches(self, worker: int = 0, num_workers: int = 1) -> Iterator:
        """The batches data loader worker `worker` of `num_workers` serves: from where this copy
        stands (start_step or a loaded state), every num_workers-th step of the host's stream,
        this worker's first. Interleaved worker by worker, they are the host's stream."""
        num_workers = checked_count(num_workers, "num_workers")
        worker = checked_count(worker, "worker", 0)
        if worker >= num_workers:
            raise ValueError(f"worker must be in [0, num_workers) = [0, {num_workers}), got {worker}")
        if self._worker is None or self._worker == (0, 1):
            first = self._next + worker  # a fresh copy, or one position for the whole stream
        elif self._worker == (worker, num_workers):
            first = self._next  # this worker's own next step
        else:
            raise ValueError(f"this state is worker {self._worker[0]}'s of {self._worker[1]}; it resumes that "
                             f"worker only (or resume every worker with start_step)")
        self._worker = (worker, num_workers)
        return self._served(first, num_workers)

    def _served(self, first: int, every: int) -> Iterator:
        step = first
        for batch in self._batches(first, every):
            step += every
            self._next = step  # before the yield: a state taken with this batch in hand resumes after it
            yield batch

    def _worker_info(self) -> tuple[int, int]:
        """(worker, num_workers) of the process iterating: no workers here; torch_data asks torch."""
        return 0, 1

    def __iter__(self) -> Iterator:
        return self.batches(*self._worker_info())

    def state_dict(self) -> dict:
        """This copy's position: the next step it serves (and, after it served as a worker,
        which one), with the arguments that make the stream, to refuse another stream's state."""
        worker, num_workers = self._worker or (0, 1)
        return {"version": STATE_VERSION, "next_step": self._next, "worker": worker, "num_workers": num_workers,
                "stream": self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Resumes at a state_dict() (before iterating): ValueError for another stream's state."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a PackedBatchStream state: {state!r}"[:300])
        if state["stream"] != self._identity():
            theirs, mine = state["stream"], self._identity()
            diff = {k: (theirs.get(k), mine.get(k)) for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k)}
            raise ValueError(f"this state is another stream's: (saved, now) differ in {diff}")
        self._next = operator.index(state["next_step"])
        self._worker = (operator.index(state["worker"]), operator.index(state["num_workers"]))

    def _identity(self) -> dict:
        data = self.data
        if isinstance(data, Blend):
            what = {"blend": [f"{s.url}:{s.split}" for s in data.splits], "weights": data.weights, "seed": data.seed}
        else:
            what = {"split": f"{data.url}:{data.split}", "seed": self.seed, "epochs": self.epochs}
        # Not rank or world_size: the step is the global batch's, so a state resumes on any
        # number of hosts (every host loads the state of one of them, or its own).
        return {**what, "length": self.length, "batch_size": self.batch_size, **self.options}

    def __repr__(self) -> str:
        return (f"PackedBatchStream({self.data!r}, {self.length}, {self.batch_size}, rank {self.rank} of "
                f"{self.world_size}, next step {self._next})")


class SequenceSource:
    """Map-style access to a split's sequences for a loader that samples them itself (a torch
    DataLoader's sampler, Grain's RandomAccessDataSource protocol): ``source[i]`` is sequence
    i's token ids (int32), optionally cut to `max_length`. Each access is two reads (a chunk
    decompressed for each), so this suits fine-tuning sets; packed pretraining reads through
    PackedBatchStream. Pickles (by the split's URL)."""

    def __init__(self, split: FlatTokensSplit, max_length: int | None = None):
        self.split = split
        self.max_length = None if max_length is None else checked_count(max_length, "max_length")

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i) -> np.ndarray:
        ids = self.split.sequence(i)
        return ids if self.max_length is None else ids[:self.max_length]

    def __repr__(self) -> str:
        return f"SequenceSource({self.split!r}, max_length {self.max_length})"
