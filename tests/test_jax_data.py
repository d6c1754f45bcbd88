"""flat_tokens.jax_data with real jax (only where jax is installed: the package does not depend on
it), on four CPU devices: global batches as jax.Arrays whose rows are split over the devices,
equal to packed_batches' batches, and resumed by start_step."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

from flat_tokens.reader import open_dataset  # noqa: E402
from tests.helpers import REPO, run_pipeline  # noqa: E402


PROGRAM = """
import json, sys
import jax
from flat_tokens.jax_data import device_batches
from flat_tokens.reader import FlatTokensSplit
train = FlatTokensSplit(sys.argv[1])
batches = device_batches(train, 128, 8, seed=3, start_step=int(sys.argv[2]), segments=True,
                         block_tokens=512, buffer_blocks=3)
out = []
for _, batch in zip(range(3), batches):
    targets = batch["targets"]
    out.append({"fields": sorted(batch), "shape": list(targets.shape), "dtype": str(targets.dtype),
                "devices": len(targets.sharding.device_set),
                "shards": sorted([s.index[0].start or 0, list(s.data.shape)] for s in targets.addressable_shards),
                "targets": targets.tolist(), "positions": batch["positions"].tolist()})
print(json.dumps({"devices": jax.device_count(), "batches": out}))
"""


def test_global_batches_sharded_over_four_devices(tmp_path, corpus):
    out = tmp_path / "bytes.zarr"
    run_pipeline("--input", f"{corpus}/*.jsonl", "--output", out, "--tokenizer", "bytes", "--validation_fraction", "0.1",
                 "--tokens_chunk_size", "4096")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    train = open_dataset(str(out))["train"]
    want = [next(train.packed_batches(128, 8, seed=3, start_step=k, segments=True, block_tokens=512,
                                      buffer_blocks=3)) for k in range(2, 7)]
    for start, expected in ((2, want[:3]), (4, want[2:5])):  # resumed by start_step
        proc = subprocess.run([sys.executable, "-c", PROGRAM, str(out), str(start)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout)
        assert got["devices"] == 4
        for batch, w in zip(got["batches"], expected, strict=True):
            assert batch["fields"] == ["inputs", "positions", "segment_ids", "targets"]
            assert batch["shape"] == [8, 128] and batch["dtype"] == "int32" and batch["devices"] == 4
            assert batch["shards"] == [[0, [2, 128]], [2, [2, 128]], [4, [2, 128]], [6, [2, 128]]]  # rows over devices
            assert np.array_equal(batch["targets"], w.targets) and np.array_equal(batch["positions"], w.positions)
