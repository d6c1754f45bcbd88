"""The shuffle's pure functions: a seeded permutation that depends only on document places."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms import shuffle_keys as keys
from transforms.shuffle import gather_segments


def test_hashes_depend_on_seed_file_and_offset_only():
    offsets = np.arange(0, 10_000, 37, dtype=np.uint64)
    a = keys.place_hashes(keys.file_salt(0, keys.ORDER, "0:a.jsonl"), offsets)
    assert np.array_equal(a, keys.place_hashes(keys.file_salt(0, keys.ORDER, "0:a.jsonl"), offsets))
    assert len(np.unique(a)) == len(a)
    for other in (keys.file_salt(1, keys.ORDER, "0:a.jsonl"), keys.file_salt(0, keys.ORDER, "0:b.jsonl"),
                  keys.file_salt(0, keys.SPLIT, "0:a.jsonl")):
        assert not np.array_equal(a, keys.place_hashes(other, offsets))


def test_order_is_uniform():
    """Ranks of consecutive offsets after sorting look like a random permutation."""
    n = 20_000
    offsets = np.arange(n, dtype=np.uint64) * np.uint64(100)
    h = keys.place_hashes(keys.file_salt(7, keys.ORDER, "0:x"), offsets)
    order = keys.shuffled_order(h, np.zeros(n, np.uint64), offsets)
    rho = np.corrcoef(np.arange(n), order)[0, 1]
    assert abs(rho) < 4 / np.sqrt(n)
    # Each of 16 hash-range shards receives about n/16 documents (chi-square, 15 dof).
    counts = np.bincount(keys.shard_of(h, 16), minlength=16)
    chi2 = ((counts - n / 16) ** 2 / (n / 16)).sum()
    assert chi2 < 40, counts


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), shards=st.integers(1, 50), seed=st.integers(0, 2**32))
def test_shards_are_hash_ranges_so_concatenation_is_the_global_order(n, shards, seed):
    offsets = np.arange(n, dtype=np.uint64)
    h = keys.place_hashes(keys.file_salt(seed, keys.ORDER, "0:f"), offsets)
    shard = keys.shard_of(h, shards)
    assert shard.min() >= 0 and shard.max() < shards
    salts = np.zeros(n, np.uint64)
    global_order = keys.shuffled_order(h, salts, offsets)
    by_shard = np.concatenate([idx[keys.shuffled_order(h[idx], salts[idx], offsets[idx])]
                               for s in range(shards) for idx in [np.flatnonzero(shard == s)]])
    assert np.array_equal(global_order, by_shard)


def test_below_fraction_takes_the_requested_fraction():
    h = keys.place_hashes(keys.file_salt(0, keys.SPLIT, "0:f"), np.arange(100_000, dtype=np.uint64))
    assert abs(keys.below_fraction(h, 0.1).mean() - 0.1) < 0.005
    assert not keys.below_fraction(h, 0.0).any()


@given(lengths=st.lists(st.integers(0, 200), max_size=30), block=st.sampled_from([1, 7, 1 << 22]), data=st.data())
def test_gather_segments_concatenates_documents_in_order(lengths, block, data):
    from transforms import shuffle
    shuffle._GATHER_BLOCK_TOKENS = block  # the vectorised path works in blocks of this many tokens
    lengths = np.array(lengths, dtype=np.int64)
    tokens = np.arange(int(lengths.sum()), dtype=np.uint32)
    order = np.array(data.draw(st.permutations(range(len(lengths)))), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    want = [int(t) for i in order for t in tokens[starts[i]:starts[i] + lengths[i]]]
    assert gather_segments(tokens, lengths, order).tolist() == want
