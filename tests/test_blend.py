"""Train-time blending (flat_tokens.blend) of splits of two datasets written by the real pipeline."""
import pickle
import shutil

import numpy as np
import pytest
import zarr

from flat_tokens.blend import Blend, source_seed
from flat_tokens.reader import Batch, open_dataset
from tests.helpers import SAMPLE, run_pipeline

LENGTH = 256
SIZES = {"block_tokens": 4 * LENGTH, "buffer_blocks": 3}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """The sample's two files as two datasets; the blend takes both train splits and one
    validation split (few windows: it runs out, and restarts, many times)."""
    root = tmp_path_factory.mktemp("blend")
    out = {}
    for name in ("corpus-1", "corpus-2"):
        out[name] = root / f"{name}.zarr"
        run_pipeline("--input", SAMPLE / f"{name}.jsonl", "--output", out[name], "--tokenizer", "bytes",
                     "--validation_fraction", "0.05", "--tokens_chunk_size", "4096")
    one, two = open_dataset(str(out["corpus-1"])), open_dataset(str(out["corpus-2"]))
    return [one["train"], two["train"], one["validation"]]


def reference_choices(weights, positions):
    """Megatron's rule, written here from its description: position p goes to the split whose
    count lags weight * max(p, 1) most, ties to the first."""
    total = sum(weights)
    w = [x / total for x in weights]
    counts, out = [0] * len(w), []
    for p in range(positions):
        lags = [w[i] * max(p, 1) - counts[i] for i in range(len(w))]
        best = lags.index(max(lags))
        counts[best] += 1
        out.append(best)
    return out


def rows(batches):
    return np.concatenate([b.targets for b in batches]), np.concatenate([b.sources[:, 0] for b in batches])


@pytest.mark.slow
def test_windows_follow_the_weights_in_every_lane_and_batch(splits):
    """Row j of batch k takes the split Megatron's rule chooses at position k + j: each row's
    (lane's) windows, and each batch's rows, hold every split's share."""
    weights, batch, steps = [5, 3, 2], 16, 30
    blend = Blend(splits, weights, seed=4)
    batches = [b for _, b in zip(range(steps), blend.packed_batches(LENGTH, batch, sources=True, **SIZES))]
    assert all(isinstance(b, Batch) and b.targets.shape == (batch, LENGTH) for b in batches)
    reference = reference_choices(weights, steps + batch)
    chosen = np.array([b.sources[:, 0] for b in batches])  # (step, row)
    assert chosen.tolist() == [reference[k:k + batch] for k in range(steps)]
    share = np.array(weights) / 10
    for j in range(batch):  # every prefix of every lane: within a few windows of each weight's share
        counts = np.cumsum(np.eye(3, dtype=np.int64)[chosen[:, j]], axis=0)
        assert np.abs(counts - np.arange(1, steps + 1)[:, None] * share).max() < 3
    per_batch = np.array([np.bincount(row, minlength=3) for row in chosen])
    assert np.abs(per_batch - batch * share).max() < 3  # and every batch
    assert blend.counts(steps + batch) == np.bincount(reference, minlength=3).tolist()
    assert (batches[0].sources == batches[0].sources[:, :1]).all()  # a row's tokens share its split


def test_each_split_gives_its_own_stream_restarting_its_epochs(splits):
    """Lane j's windows from split i are split i's own lane j (row j of its packed_batches with
    the split's seed), in order, epoch after epoch."""
    batch, steps = 16, 30
    blend = Blend(splits, [5, 3, 2], seed=4)
    batches = [b for _, b in zip(range(steps), blend.packed_batches(LENGTH, batch, sources=True, **SIZES))]
    targets = np.stack([b.targets for b in batches])  # (step, row, LENGTH)
    chosen = np.array([b.sources[:, 0] for b in batches])
    for i, split in enumerate(splits):
        stream = split.packed_batches(LENGTH, batch, seed=source_seed(4, i), **SIZES)
        own = [b[1] for _, b in zip(range(steps), stream)]
        for j in range(batch):
            mine = targets[chosen[:, j] == i, j]
            assert np.array_equal(mine, np.array([t[j] for t in own[:len(mine)]]).reshape(mine.shape))
    small = splits[2].num_windows(LENGTH) // batch  # the validation split's windows per lane and epoch
    assert (chosen == 2).sum(axis=0).max() > small  # a lane ran out of it, and restarted its epoch


def test_resume_ranks_and_pickling(splits):
    blend = Blend(splits, [1, 1, 0.5], seed=7)
    full = [b for _, b in zip(range(12), blend.packed_batches(LENGTH, 8, sources=True, **SIZES))]
    copy = pickle.loads(pickle.dumps(blend))
    for k in (1, 5, 11):
        inputs, targets = next(copy.packed_batches(LENGTH, 8, start_step=k, **SIZES))
        assert np.array_equal(inputs, full[k][0]) and np.array_equal(targets, full[k][1])

    # Hosts: host r serves rows [2r, 2r + 2) of the same global batches, and resumes by step.
    hosts = [blend.packed_batches(LENGTH, 8, rank=r, world_size=4, segments=True, sources=True, **SIZES)
             for r in range(4)]
    got = [[next(host) for _ in range(12)] for host in hosts]
    assert all(b.segment_ids.shape == (2, LENGTH) for g in got for b in g)
    for k in range(12):
        assert np.array_equal(np.concatenate([got[r][k].targets for r in range(4)]), full[k].targets)
        assert np.array_equal(np.concatenate([got[r][k].sources for r in range(4)]), full[k].sources)
    for r in range(4):
        again = next(copy.packed_batches(LENGTH, 8, start_step=9, rank=r, world_size=4, sources=True, **SIZES))
        assert np.array_equal(again.targets, got[r][9].targets)


def test_a_blend_refuses_bad_arguments(splits):
    for weights, error in (([1, 2], ValueError), ([1, 0, 1], ValueError), ([1, -1, 1], ValueError),
                           ([1, float("nan"), 1], ValueError), ([1, "x", 1], TypeError)):
        with pytest.raises(error):
            Blend(splits, weights)
    with pytest.raises(ValueError, match="no full window"):
        Blend(splits, [1, 1, 1]).packed_batches(10**7, 2)
    with pytest.raises(ValueError, match="divisible"):
        Blend(splits, [1, 1, 1]).packed_batches(LENGTH, 6, world_size=4)


def test_huge_weights_normalise_without_overflow(splits):
    blend = Blend(splits, [1e308, 1e308, 1e307])  # their sum overflows to inf
    assert blend.weights == pytest.approx([10 / 21, 10 / 21, 1 / 21])
    assert blend.counts(21) == [10, 10, 1]
    assert Blend(splits, [5e-324, 5e-324, 1e-323]).weights == pytest.approx([0.25, 0.25, 0.5])  # and tiny ones


@pytest.mark.slow
def test_splits_of_two_tokenizers_are_refused_unless_allowed(splits, tmp_path):
    """Each dataset records its tokenizer's sha256 (provenance); a blend of different ones is a
    ValueError naming both, unless allow_mixed_tokenizers=True."""
    sha = splits[0].attrs["tokenizer"]["sha256"]
    assert len(sha) == 64 and {s.attrs["tokenizer"]["sha256"] for s in splits} == {sha}  # all bytes
    out = tmp_path / "bpe.zarr"
    run_pipeline("--input", SAMPLE / "corpus-1.jsonl", "--output", out, "--tokenizer", SAMPLE / "tokenizer.json",
                 "--validation_fraction", "0")
    bpe = open_dataset(str(out))["train"]
    assert bpe.attrs["tokenizer"]["sha256"] != sha
    with pytest.raises(ValueError) as refused:
        Blend([splits[0], bpe], [1, 1])
    message = str(refused.value)
    assert all(part in message for part in (sha, bpe.attrs["tokenizer"]["sha256"], str(out), splits[0].url,
                                            "allow_mixed_tokenizers=True"))
    blend = Blend([splits[0], bpe], [1, 1], allow_mixed_tokenizers=True)
    assert next(blend.packed_batches(LENGTH, 4))[1].shape == (4, LENGTH)
    foreign = tmp_path / "foreign.zarr"  # a flat-tokens dataset another tool wrote: no tokenizer recorded
    shutil.copytree(splits[0].url, foreign)
    root = zarr.open_group(str(foreign), mode="r+")
    # (nor a manifest: issue 37's is this tool's)
    root.attrs.put({k: v for k, v in root.attrs.items() if k not in ("tokenizer", "manifest")} | {"tokenizer": None})
    (foreign / "flat-tokens-manifest.json").unlink()
    with pytest.raises(ValueError, match="records no tokenizer"):
        Blend([splits[0], open_dataset(str(foreign))["train"]], [1, 1])
