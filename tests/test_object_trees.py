"""Deleting and sizing a dataset's tree of objects page by page (flat_tokens/format/object_trees.py),
on the GCS emulator and on local disk: everything under the directory goes, nothing beside
it, across several listing pages."""
import os

import pytest
from fsspec.implementations.local import LocalFileSystem

from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from flat_tokens.format.object_trees import remove_tree, tree_size

KEYS = [f"train/encoded_tokens/{i}" for i in range(23)] + ["train/.zattrs", "train/seq_starts/0", "train/seq_starts/.zarray"]
BESIDE = ["train2/encoded_tokens/0", "train.json", ".zattrs", "validation/seq_starts/0"]


def test_a_gcs_tree_is_removed_page_by_page_and_nothing_beside_it(gcs):
    base = f"{BUCKET}/trees/out.zarr"
    gcs.fs.pipe({f"{base}/{k}": k.encode() for k in KEYS + BESIDE})
    assert tree_size(gcs.fs, f"{base}/train", page=7) == sum(len(k) for k in KEYS)
    remove_tree(gcs.fs, f"{base}/train", page=7)  # four pages of names
    gcs.fs.invalidate_cache()
    assert sorted(p[len(base) + 1:] for p in gcs.fs.find(base)) == sorted(BESIDE)
    with pytest.raises(FileNotFoundError):
        remove_tree(gcs.fs, f"{base}/train", page=7)


def test_the_size_of_a_tree_is_what_fsspec_counts(gcs, tmp_path):
    base = f"{BUCKET}/trees/sized.zarr"
    gcs.fs.pipe({f"{base}/{k}": k.encode() * 3 for k in KEYS + BESIDE})
    gcs.fs.invalidate_cache()
    assert tree_size(gcs.fs, base, page=5) == gcs.fs.du(base) == 3 * sum(len(k) for k in KEYS + BESIDE)
    local = LocalFileSystem()
    for k in KEYS + BESIDE:
        os.makedirs(tmp_path / os.path.dirname(k), exist_ok=True)
        (tmp_path / k).write_bytes(k.encode() * 3)
    assert tree_size(local, str(tmp_path)) == local.du(str(tmp_path)) == 3 * sum(len(k) for k in KEYS + BESIDE)
    remove_tree(local, str(tmp_path / "train"))
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(BESIDE)
