"""PyTorch datasets over a flat-tokens dataset: import this module where torch is installed
(this package does not depend on torch). The logic is flat_tokens/loaders.py's, torch-free.

    from torch.utils.data import DataLoader
    from flat_tokens.torch_data import PackedBatchDataset, SequenceDataset

    data = PackedBatchDataset(split, 2048, 32, seed=0, rank=rank, world_size=world_size)
    loader = DataLoader(data, batch_size=None, num_workers=2)    # whole batches: batch_size=None
    for inputs, targets in loader: ...                            # (32 / world_size, 2048) int32 tensors

With num_workers=K, worker j serves steps j, j+K, ... (reading only their windows: about 1/K
of the host's share for K = 1, 2, 4, 8) and the loader takes one batch from each worker in
turn, so it yields this host's rows of the global batches exactly (the ranks' rows together:
the single-host batches, whatever the world size). `state_dict()`/`load_state_dict()` follow
torchdata's StatefulDataLoader, which saves and restores them per worker; with a plain
DataLoader, resume with `start_step=` (the steps your checkpoint counted), on any number of
hosts.
"""
from __future__ import annotations

import torch.utils.data

from flat_tokens.loaders import PackedBatchStream, SequenceSource


class PackedBatchDataset(PackedBatchStream, torch.utils.data.IterableDataset):
    """An IterableDataset of whole packed batches (flat_tokens.loaders.PackedBatchStream): numpy
    arrays, which a DataLoader turns into tensors; a Batch named tuple with segments= or
    sources=."""

    def _worker_info(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)


class SequenceDataset(SequenceSource, torch.utils.data.Dataset):
    """A map-style Dataset of sequences (flat_tokens.loaders.SequenceSource): item i is sequence
    i's int32 ids; sequences differ in length, so give the DataLoader a collate_fn that pads
    or packs them."""
