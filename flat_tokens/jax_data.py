"""Packed batches as jax.Arrays sharded over devices: import this module where jax is
installed (this package does not depend on jax). The logic is flat_tokens/loaders.py's.

    from flat_tokens.jax_data import device_batches

    for batch in device_batches(split, 2048, 32, seed=0, start_step=step):
        batch["inputs"], batch["targets"]       # global (32, 2048) int32 jax.Arrays, rows over devices

Each process (jax.process_index() of jax.process_count(), the reader's rank and world size)
reads its own share of every epoch and serves its batch_size / process_count rows of the
global batch, which jax.make_array_from_process_local_data places on its local devices:
together, one global array per field, split by rows over every device of the mesh (a 1-D
"data" mesh of all devices unless a sharding is given). The global batches do not depend on
the process count: resume with start_step= on any number of processes that divides
batch_size.
"""
from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flat_tokens.blend import Blend
from flat_tokens.loaders import PackedBatchStream
from flat_tokens.reader import FlatTokensSplit

FIELDS = ("inputs", "targets", "segment_ids", "positions", "sources")


def data_sharding() -> NamedSharding:
    """Rows over every device: a 1-D mesh named "data" of jax.devices()."""
    return NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))


def device_batches(data: FlatTokensSplit | Blend, length: int, batch_size: int, *, sharding=None,
                   **kwargs) -> Iterator[dict]:
    """Global batches of `batch_size` rows as dicts of jax.Arrays (inputs, targets, and
    segment_ids/positions/sources when asked for), this process's rows from its own share
    (kwargs as for flat_tokens.loaders.PackedBatchStream, rank and world_size from jax). Every
    batch is full (an epoch is num_windows // batch_size steps); a short one would be dropped."""
    sharding = sharding or data_sharding()
    stream = PackedBatchStream(data, length, batch_size, rank=jax.process_index(),
                               world_size=jax.process_count(), **kwargs)
    for batch in stream:
        fields = batch._asdict() if hasattr(batch, "_asdict") else dict(zip(FIELDS, batch))
        if fields["targets"].shape[0] != stream.rows:
            return
        yield {name: jax.make_array_from_process_local_data(sharding, np.asarray(value), (batch_size, length))
               for name, value in fields.items() if value is not None}
