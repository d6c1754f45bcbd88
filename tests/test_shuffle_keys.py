"""The shuffle's pure functions: a seeded permutation that depends only on document places."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms import hashing
from transforms.segments import gather_segments, groups_of, take_documents


def test_hashes_depend_on_seed_file_and_offset_only():
    offsets = np.arange(0, 10_000, 37, dtype=np.uint64)
    a = hashing.place_hashes(hashing.file_salt(0, hashing.ORDER, "0:a.jsonl"), offsets)
    assert np.array_equal(a, hashing.place_hashes(hashing.file_salt(0, hashing.ORDER, "0:a.jsonl"), offsets))
    assert len(np.unique(a)) == len(a)
    for other in (hashing.file_salt(1, hashing.ORDER, "0:a.jsonl"), hashing.file_salt(0, hashing.ORDER, "0:b.jsonl"),
                  hashing.file_salt(0, hashing.SPLIT, "0:a.jsonl")):
        assert not np.array_equal(a, hashing.place_hashes(other, offsets))


def test_order_is_uniform():
    """Ranks of consecutive offsets after sorting look like a random permutation."""
    n = 20_000
    offsets = np.arange(n, dtype=np.uint64) * np.uint64(100)
    h = hashing.place_hashes(hashing.file_salt(7, hashing.ORDER, "0:x"), offsets)
    order = hashing.shuffled_order(h, np.zeros(n, np.uint64), offsets)
    rho = np.corrcoef(np.arange(n), order)[0, 1]
    assert abs(rho) < 4 / np.sqrt(n)
    # Each of 16 hash-range shards receives about n/16 documents (chi-square, 15 dof).
    counts = np.bincount(hashing.shard_of(h, 16), minlength=16)
    chi2 = ((counts - n / 16) ** 2 / (n / 16)).sum()
    assert chi2 < 40, counts


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), shards=st.integers(1, 50), seed=st.integers(0, 2**32))
def test_shards_are_hash_ranges_so_concatenation_is_the_global_order(n, shards, seed):
    offsets = np.arange(n, dtype=np.uint64)
    h = hashing.place_hashes(hashing.file_salt(seed, hashing.ORDER, "0:f"), offsets)
    shard = hashing.shard_of(h, shards)
    assert shard.min() >= 0 and shard.max() < shards
    salts = np.zeros(n, np.uint64)
    global_order = hashing.shuffled_order(h, salts, offsets)
    by_shard = np.concatenate([idx[hashing.shuffled_order(h[idx], salts[idx], offsets[idx])]
                               for s in range(shards) for idx in [np.flatnonzero(shard == s)]])
    assert np.array_equal(global_order, by_shard)


def test_below_fraction_takes_the_requested_fraction():
    h = hashing.place_hashes(hashing.file_salt(0, hashing.SPLIT, "0:f"), np.arange(100_000, dtype=np.uint64))
    assert abs(hashing.below_fraction(h, 0.1).mean() - 0.1) < 0.005
    assert not hashing.below_fraction(h, 0.0).any()


@given(lengths=st.lists(st.integers(0, 200), max_size=30), block=st.sampled_from([1, 7, 1 << 22]), data=st.data())
def test_gather_segments_concatenates_documents_in_order(lengths, block, data):
    lengths = np.array(lengths, dtype=np.int64)
    tokens = np.arange(int(lengths.sum()), dtype=np.uint32)
    order = np.array(data.draw(st.permutations(range(len(lengths)))), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    want = [int(t) for i in order for t in tokens[starts[i]:starts[i] + lengths[i]]]
    # `block`: the vectorised path (short documents) works in blocks of this many tokens
    assert gather_segments(tokens, lengths, order, block).tolist() == want


@given(spans=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=30),
       block=st.sampled_from([1, 7, 1 << 22]))
def test_take_documents_copies_any_spans_in_the_order_given(spans, block):
    """Spans may overlap and repeat (a mixture's copies of one document), in any order."""
    tokens = np.arange(400, dtype=np.uint16)
    spans = [(a, min(n, 400 - a)) for a, n in spans]
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    lengths = np.array([n for _, n in spans], dtype=np.int64)
    want = [t for a, n in spans for t in range(a, a + n)]
    got = take_documents(tokens, starts, lengths, block)
    assert got.tolist() == want and got.dtype == np.uint16


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=20), st.booleans()),
                        min_size=1, max_size=4),
       shards=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_shard_parts_carry_every_document_whole_and_sorted_shards_encode_start_bits(batches, shards, seed):
    """Batches -> parts (ids in their narrowest type, compressed) -> sorted shards. Batches
    whose ids need 32 bits meet narrower ones in one shard; every document arrives once,
    whole, with exactly one start bit, and shards are in the global shuffled order."""
    from transforms.records import TokenizedBatch
    from transforms.shuffle.shuffle_globally import sort_shard, split_and_shard
    rng = np.random.default_rng(seed)
    documents, parts = {}, {}
    for b, (lengths, wide) in enumerate(batches):
        lengths = np.array(lengths, dtype=np.int64)
        ids = rng.integers(0, 70_000 if wide else 300, int(lengths.sum())).astype(np.uint32)
        offsets = np.arange(lengths.size, dtype=np.uint64) * np.uint64(100)
        starts = np.cumsum(lengths) - lengths
        for o, a, n in zip(offsets.tolist(), starts.tolist(), lengths.tolist()):
            documents[(f"0:f{b}", o)] = ids[a:a + n].tolist()
        batch = TokenizedBatch(f"0:f{b}", "train", offsets, lengths, ids if wide else ids.astype(np.uint16), 0)
        for key, part in split_and_shard(batch, seed, 0.0, {"train": shards, "validation": 1}):
            assert part.ids_dtype == batch.ids.dtype.name
            assert part.max_token_id == max(max(documents[(batch.file_key, int(o))]) for o in part.offsets)
            parts.setdefault(key, []).append(part)
    received, hashes = [], []
    for key in sorted(parts):
        shard = sort_shard((key, parts[key]))
        tokens = np.asarray(shard.tokens)
        assert tokens.dtype == np.uint32 and tokens.size == shard.tokens.size
        starts = np.cumsum(shard.lengths) - shard.lengths
        assert np.flatnonzero(tokens & 1).tolist() == starts.tolist()
        received += [(tokens[a:a + n] >> 1).tolist() for a, n in zip(starts, shard.lengths)]
        hashes += sorted(int(h) for p in parts[key] for h in p.order_hashes)
    assert sorted(received) == sorted(documents.values())
    assert hashes == sorted(hashes)  # shards are consecutive hash ranges


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=30), gathered=st.booleans(), data=st.data())
def test_encoded_tokens_encode_any_range_as_the_whole_would_and_pickle_only_that_range(lengths, gathered, data):
    """The writer encodes a shard chunk by chunk (records.EncodedTokens): every contiguous
    range, and every range of a range, must hold exactly the flat-tokens encoding of those
    positions (2*id, +1 where a sequence starts), also after crossing a pickle; whether the
    ids lie end to end in one array or (`gathered`) scattered over several, as a shard's
    documents in the parts they came from."""
    import pickle

    from transforms.records import EncodedTokens
    ids = np.array(data.draw(st.lists(st.integers(0, 65_535), min_size=sum(lengths), max_size=sum(lengths))),
                   dtype=np.uint16)
    first_tokens = set(np.cumsum(lengths) - lengths)
    want = [2 * int(t) + (i in first_tokens) for i, t in enumerate(ids)]
    if gathered:  # each sequence in one of three arrays, amid other ids, in any order
        rng = np.random.default_rng(len(lengths))
        pieces = [[], [], []]
        source_of = rng.integers(0, 3, len(lengths))
        start_in_source = np.zeros(len(lengths), dtype=np.int64)
        for k in rng.permutation(len(lengths)):
            a, n, held = sum(lengths[:k]), lengths[k], pieces[source_of[k]]
            held.append(rng.integers(0, 65_535, rng.integers(0, 5)).astype(np.uint16))  # ids of no sequence here
            start_in_source[k] = sum(map(len, held))
            held.append(ids[a:a + n])
        sources = [np.concatenate(held) if held else np.empty(0, np.uint16) for held in pieces]
        whole = EncodedTokens.gathered(sources, source_of, start_in_source, np.array(lengths))
    else:
        whole = EncodedTokens.of(ids, np.array(lengths))
    assert whole.size == len(want) and np.asarray(whole).tolist() == want
    a = data.draw(st.integers(0, len(want)))
    b = data.draw(st.integers(a, len(want)))
    part = whole[a:b]
    assert np.asarray(part, dtype=np.uint32).tolist() == want[a:b]
    c = data.draw(st.integers(0, b - a))
    assert np.asarray(part[c:]).tolist() == want[a + c:b]
    shipped = pickle.loads(pickle.dumps(part))
    assert np.asarray(shipped).tolist() == want[a:b]
    assert np.asarray(shipped[c:]).tolist() == want[a + c:b]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), long=st.booleans())
def test_a_shard_of_long_documents_sorts_to_the_same_tokens_however_it_is_gathered(seed, long):
    """Shards of documents averaging GATHER_WHILE_WRITING_AVERAGE_LENGTH tokens or more are
    left in their parts and gathered chunk by chunk as they are written; the tokens must be
    those of the same documents gathered up front, in the same order."""
    from transforms.records import TokenizedBatch
    from transforms.shuffle import shuffle_globally as shuffle
    rng = np.random.default_rng(seed)
    parts = []
    for b in range(3):
        lengths = rng.integers(shuffle.GATHER_WHILE_WRITING_AVERAGE_LENGTH if long else 64, 3000, 4)
        ids = rng.integers(0, 50_000, int(lengths.sum())).astype(np.uint16)
        batch = TokenizedBatch(f"{b}:f{b}", "train", np.arange(4, dtype=np.uint64) * 10, lengths, ids, 0)
        parts += [p for _, p in shuffle.split_and_shard(batch, seed % 7, 0.0, {"train": 1, "validation": 1})]
    shard = shuffle.sort_shard((("train", 0), parts))
    hashes = np.concatenate([p.order_hashes for p in parts])
    order = np.argsort(hashes, kind="stable")
    documents = [p.ids()[a:a + n] for p in parts for a, n in zip(np.cumsum(p.lengths) - p.lengths, p.lengths)]
    want = np.concatenate([documents[i] for i in order]).astype(np.uint32) << 1
    want[np.cumsum(shard.lengths) - shard.lengths] |= 1
    assert np.array_equal(np.asarray(shard.tokens), want)
    chunk = 1000  # as the writer reads it: chunk by chunk
    assert np.array_equal(np.concatenate([np.asarray(shard.tokens[i:i + chunk])
                                          for i in range(0, shard.tokens.size, chunk)]), want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), unique=True, max_size=30), st.data())
def test_rows_of_finds_each_digest_in_any_order_even_when_first_halves_collide(table, data):
    """rows_of against a dictionary: digests drawn from a tiny range, so many share their
    first 64 bits; the table in digest order or shuffled; digests wanted present or absent."""
    digests = np.array(table, dtype=np.uint64).reshape(-1, 2)
    if data.draw(st.booleans()):
        digests = digests[np.lexsort((digests[:, 1], digests[:, 0]))]
    wanted = np.array(data.draw(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), max_size=40)),
                      dtype=np.uint64).reshape(-1, 2)
    where = {tuple(row): i for i, row in enumerate(digests.tolist())}
    assert hashing.rows_of(digests, wanted).tolist() == [where.get(tuple(w), -1) for w in wanted.tolist()]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 70_000), max_size=60), st.sampled_from([np.int64, np.uint32, np.int32]))
def test_groups_of_gives_each_keys_indices_in_order(keys, dtype):
    """Keys of 16 bits (sorted by radix) and wider or negative ones: each distinct key once,
    in increasing order, with the indices of its elements in their original order."""
    keys = np.array([k for k in keys if dtype != np.uint32 or k >= 0], dtype=dtype)
    expected = {}
    for i, k in enumerate(keys.tolist()):
        expected.setdefault(k, []).append(i)
    got = [(int(k), members.tolist()) for k, members in groups_of(keys)]
    assert got == sorted(expected.items())
