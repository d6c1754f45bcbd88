"""Offset and ownership planning: pieces tile the array, every block has one writer."""
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.write.layout import block_count, block_span, lay_out, plan_region, prefix_offsets


def regions_from_sizes(sizes):
    offsets = prefix_offsets([(n, 0) for n in sizes])
    return [(start, start + n) for (start, _), n in zip(offsets, sizes)]


@settings(max_examples=500, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=0, max_size=25), block=st.integers(1, 17),
       end_marker=st.booleans())
def test_pieces_tile_the_array_and_each_block_has_one_owner(sizes, block, end_marker):
    if end_marker:  # seq_starts: one more element, owned by the end-marker writer
        sizes = sizes + [1]
    length = sum(sizes)
    covered = Counter()
    direct_owners = Counter()
    fragment_blocks = set()
    for start, stop in regions_from_sizes(sizes):
        plan = plan_region(start, stop, block, length)
        if plan.direct:
            a, b = plan.direct
            assert a % block == 0 and (b % block == 0 or b == length)
            assert start <= a < b <= stop
            for i in range(a // block, block_count(b, block)):
                direct_owners[i] += 1
            covered.update(range(a, b))
        for index, a, b in plan.fragments:
            lo, hi = block_span(index, block, length)
            assert lo <= a < b <= hi and start <= a and b <= stop
            fragment_blocks.add(index)
            covered.update(range(a, b))
    # Every element is placed exactly once: no gap, no overlap.
    assert covered == Counter(range(length))
    # A block is written either directly by one writer or by the merge step, never both.
    assert all(n == 1 for n in direct_owners.values())
    assert not set(direct_owners) & fragment_blocks
    assert set(direct_owners) | fragment_blocks == set(range(block_count(length, block)))


@given(start=st.integers(0, 100), size=st.integers(0, 100), block=st.integers(1, 20))
def test_a_region_never_shares_a_whole_block_it_covers(start, size, block):
    length = start + size + 7
    plan = plan_region(start, start + size, block, length)
    for index, a, b in plan.fragments:
        lo, hi = block_span(index, block, length)
        # a fragment is never a whole block that the region covers alone
        assert not (a == lo and b == hi and start <= lo and hi <= start + size)


def test_lay_out_orders_shards_and_sums():
    sizes = {("train", 3): (5, 2, 9), ("train", 0): (4, 1, 7), ("validation", 1): (1, 1, 2)}
    layout = lay_out(sizes, ("train", "validation"))
    assert layout["train"].shards == {0: (0, 0, 4, 1), 3: (4, 1, 5, 2)}
    assert (layout["train"].tokens, layout["train"].sequences, layout["train"].max_token_id) == (9, 3, 9)
    assert layout["validation"].shards == {1: (0, 0, 1, 1)}
    empty = lay_out({}, ("train", "validation"))
    assert (empty["train"].tokens, empty["train"].sequences, empty["train"].max_token_id) == (0, 0, -1)
