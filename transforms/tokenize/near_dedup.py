"""FindNearDuplicates (--dedup near): signed documents -> for every text linked to another,
whether it is kept or removed, and the split of its whole cluster.

    key every signed document by its dedup shard -> merge each text's copies into one node
    -> key every node by its band hashes -> pairs of nodes that share a band (candidates)
    -> fetch both nodes of each pair -> keep the pairs whose signatures agree enough
    -> connected components of the kept pairs, in rounds -> in each component, the texts
    kept and its split -> decisions, keyed by dedup shard (dedup.DropDuplicates applies them
    in the group where it merges each text's copies)

Nodes. A node is a distinct text (its copies merged, as exact dedup merges them), numbered
`dedup shard << 32 | row` in its shard's node table (rows in digest order): ids are small,
unique and a pure function of the input. Documents without a signature (fewer words than the
shingle size) are not nodes. On local runs a node part names rows of its batch's signature
file (staged beside the batch, or in the spill directory) rather than carrying 512 bytes per
copy through the runner; NodeTables writes the node tables to the spill directory (a node
names its signature's row in such a file) and KeyByBand each band part's hashes: the runner
carries node ids, and VerifyPairs reads a candidate pair's two nodes from the tables (every
worker process of a local run reads the same disk; other runners fetch both nodes through
it). There, too, the steps after VerifyPairs run on one worker, over the whole graph at once
(decide_at_once): the same functions, given every edge as one group, instead of 16 stages.

Candidates. The nodes that share a band hash (of their densified signatures: minhash.py)
are candidate pairs, each with each; a band shared by more than HUBS nodes pairs each with
the HUBS smallest only, so candidates grow linearly with a band's members. Both nodes of a
pair are fetched from their node tables, once per pair whichever bands found it.

Verification. A pair is a near-copy when its signatures agree on at least ceil((threshold -
margin) * m) of the m bins filled in either (minhash.agreement: the one-permutation estimate
of their Jaccard similarity; the margin, VERIFY_Z standard deviations of that estimate at the
threshold, keeps the pairs just above the threshold: verification_margin); an integer test
(the margin rounded to 6 decimals first), the same everywhere. Exact Jaccard would need both documents' shingles at the pair, a second shuffle
of the corpus's tokens. A pair at threshold - LINK_MARGIN or more, or a near-copy, is
*linked*: its texts go to one split, so a near-copy that the estimate put just below the
threshold (and that is therefore kept) still cannot land across train and validation.

Components. Large-star and small-star steps alternate (Kiveris et al., "Connected Components
in MapReduce and Beyond", SoCC 2014), each a group-by of edge arrays keyed by node shard:
every step keeps each component connected, and they converge to stars, each node pointing at
its component's smallest node. ROUNDS rounds run (the graph is fixed when the job is built);
then every node is checked: one with two parents, or with a parent and children, is not
converged yet, and the edges at such nodes (normally none) are finished by union-find on one
worker, whose memory is that of those edges only; the counts say how many there were.

Kept texts and split. Each linked component meets whole at its smallest node's shard. Its
texts are taken best rank first, and one is removed when it is a near-copy of a text already
kept (keep_greedily), so every removed text names a kept text it was verified against. The
rank (the
earliest input on the command line or in the mixture, then the fewest capitals, then the
fewest whitespace anomalies (copy_defects.py: the original over its all-caps or re-spaced
variant), then the longest in tokens, then the smallest content digest: nothing that depends
on the number of shards or the runner). The component's split is validation when any copy of any member was read from a
validation input, else, when any copy was read from an input split by --validation_fraction,
the seeded content hash of its first member decides (as it decides alone for a text without
near-copies), else train.

Every step works on arrays of many nodes or edges at once, never element by element.
"""
import dataclasses
import hashlib
import json
import math
import os
from collections import defaultdict
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from flat_tokens.format.checksums import Sum, seal, unseal
from transforms import hashing
from transforms.local_files import LocalFile, mapped, write_whole
from transforms.read.inputs import input_index
from transforms.records import (BandPart, Edges, NearDecisions, NodePart, Nodes, TokenizedBatch, VerifiedPairs,
                               signature_rows)
from transforms.segments import groups_of
from transforms.tokenize import minhash, near_index
from transforms.write_behind import WritesBehindWithSpillDir

TRAIN, AUTO, VALIDATION = 0, 1, 2  # a text's vote for its split: the largest of its copies' wins
ROUNDS = 4  # rounds of large-star + small-star before the convergence check
HUBS = 16  # nodes sharing a band: all pairs up to this many, then pairs with the first HUBS only
COUNTS = "counts"
NODES = "nodes"
NEAR = "near"
LINK_MARGIN = 0.1  # pairs this far below the threshold still put their texts in one split
STARS, RESIDUAL = "stars", "residual"
HELD = "held"  # --dedup_against: texts that are near-copies of earlier datasets' (near_index.py)
# The count dicts' keys (summed by the job's SumCounts; the commit reports them).
CANDIDATE_PAIRS = "near_candidate_pairs"
VERIFIED_PAIRS = "near_verified_pairs"
LINKED_PAIRS = "near_linked_pairs"
CLUSTERS = "near_clusters"
CLUSTERED = "near_clustered_documents"
FALSE_POSITIVES_MICRO = "near_expected_false_positives_micro"  # expected count, in millionths
UNCONVERGED_EDGES = "near_unconverged_edges"
FALSE_POSITIVE_MARGIN = 0.1  # a removed text "has no near-copy" below threshold - this

_LENGTH_BITS = 40
_DEFECT_BITS = 12  # copy_defects: 4 bits of capitals, 8 of whitespace anomalies
_INPUT_BITS = 64 - _DEFECT_BITS - _LENGTH_BITS
_ROW_BITS = 32
_ROW_MASK = np.uint64((1 << _ROW_BITS) - 1)


def vote_of(split: str) -> int:
    return {"train": TRAIN, "auto": AUTO, "validation": VALIDATION}[split]


def rank_of(file_key: str, lengths: np.ndarray, defects: np.ndarray | None = None) -> np.ndarray:
    """uint64 ranks of a batch's documents (the kept text of a cluster has the smallest): the
    input index (inputs from 4,095 on rank alike), then the fewest capitals, then the fewest
    whitespace anomalies (copy_defects), then the longest in tokens."""
    longest_first = (1 << _LENGTH_BITS) - 1 - np.minimum(lengths, (1 << _LENGTH_BITS) - 1).astype(np.uint64)
    index = min(input_index(file_key), (1 << _INPUT_BITS) - 1)
    rank = (np.uint64(index) << np.uint64(_DEFECT_BITS + _LENGTH_BITS)) | longest_first
    if defects is not None:
        rank |= (defects.astype(np.uint64) & np.uint64((1 << _DEFECT_BITS) - 1)) << np.uint64(_LENGTH_BITS)
    return rank


def shard_of_node(ids: np.ndarray) -> np.ndarray:
    return (ids >> np.uint64(_ROW_BITS)).astype(np.int64)


def _sorted_unique(*columns: np.ndarray) -> np.ndarray:
    """Indices of the distinct rows of `columns` (uint64 each), sorted by the first column, then
    the second, ..."""
    if columns[0].size == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort(columns[::-1])
    first = np.ones(order.size, dtype=bool)
    first[1:] = np.any(np.stack([c[order][1:] != c[order][:-1] for c in columns]), axis=0)
    return order[first]


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal (sorted) keys starts."""
    if keys.size == 0:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))


# ---------------------------------------------------------------------------------------------
# nodes

class KeyNodes(WritesBehindWithSpillDir, beam.DoFn):
    """TokenizedBatch -> (dedup shard, NodePart) for the signed documents of the batch. With a
    spill directory (local runs: transforms/shuffle/spill.py has the why), the parts name rows
    of a file of the batch's signatures: the one staged beside the batch (a local staging
    area), else one written to the spill directory, on a thread."""

    WRITER_NAME = "flat-tokens-signatures"

    def __init__(self, seed: int, num_shards: int, spill_dir: str | None = None):
        self._seed = seed
        self._num_shards = num_shards
        self._spill_dir = spill_dir

    def process(self, batch: TokenizedBatch):
        signed = np.flatnonzero(minhash.signed(batch.signatures))
        if signed.size == 0:
            return
        digests, signatures = batch.digests[signed], batch.signatures[signed]
        ranks = rank_of(batch.file_key, batch.lengths[signed],
                        None if batch.defects is None else batch.defects[signed])
        votes = np.full(signed.size, vote_of(batch.split), dtype=np.int8)
        file = None
        if self._writer and batch.signatures_file:  # staged beside the batch (transforms/staging.py): named as it is
            file, rows = batch.signatures_file, signed
        elif self._writer:
            signatures = np.ascontiguousarray(signatures)
            file, rows = LocalFile.of(os.path.join(self._spill_dir, signature_file_name(batch.file_key,
                                                                                        int(batch.offsets[0]))),
                                      signatures), None
            self._writer.submit(write_whole, file.path, signatures)
        for shard, members in groups_of(hashing.content_shards(digests, self._seed, self._num_shards)):
            keys = (digests[members], ranks[members], votes[members])
            if file is None:
                yield int(shard), NodePart(*keys, signatures=signatures[members])
            else:
                yield int(shard), NodePart(*keys, signature_file=file,
                                           rows=(members if rows is None else rows[members]).astype(np.uint32),
                                           hashes=signatures.shape[1])


def signature_file_name(file_key: str, first_offset: int) -> str:
    """The signature file of the batch that starts at byte `first_offset` of input `file_key`:
    a pure function of the batch, so a retried bundle writes the same bytes to the same name."""
    return f"{hashlib.blake2b(file_key.encode('utf-8'), digest_size=8).hexdigest()}-{first_offset:016x}.signatures"


def node_table(keyed_parts, spill_dir: str | None = None):
    """(shard, NodeParts) -> (shard, Nodes: one per distinct text, in digest order), with the
    smallest rank and the largest vote of its copies. With a spill directory (local runs), the
    table is written there first (write_table), each node naming its signature's row in the
    signature file of its part, so a candidate pair's nodes are there before any band part
    that finds it."""
    shard, parts = keyed_parts
    parts = list(parts)
    digests = np.concatenate([p.digests for p in parts])
    ranks = np.concatenate([p.ranks for p in parts])
    order = np.lexsort((ranks, digests[:, 1], digests[:, 0]))
    starts = np.flatnonzero(np.concatenate([[True], np.any(digests[order][1:] != digests[order][:-1], axis=1)]))
    first = order[starts]  # each text's copy of the smallest rank
    # Only those copies' signatures are read: one signature file mapped at a time.
    part_of = np.repeat(np.arange(len(parts)), [p.ranks.size for p in parts])
    offset = np.cumsum([p.ranks.size for p in parts]) - [p.ranks.size for p in parts]
    signatures = np.empty((first.size, parts[0].hashes or parts[0].signatures.shape[1]), dtype=np.uint16)
    for part, chosen in groups_of(part_of[first]):
        signatures[chosen] = parts[part].signatures_of(first[chosen] - offset[part])
    votes = np.maximum.reduceat(np.concatenate([p.votes for p in parts])[order], starts)
    ids = (np.uint64(shard) << np.uint64(_ROW_BITS)) | np.arange(first.size, dtype=np.uint64)
    table = Nodes(ids, digests[first], ranks[first], votes, signatures)
    if spill_dir is not None:
        files = sorted({p.signature_file for p in parts})
        number = {f: i for i, f in enumerate(files)}
        file_of_part = np.array([number[p.signature_file] for p in parts], dtype=np.uint32)
        rows_in_file = np.concatenate([p.rows for p in parts])
        write_table(spill_dir, shard, table, (files, file_of_part[part_of[first]], rows_in_file[first]))
    yield shard, table


def node_table_file(spill_dir: str, shard: int) -> str:
    """Where a local run keeps dedup shard `shard`'s node table (write_table)."""
    return os.path.join(spill_dir, f"nodes-{shard:06d}.table")


_TABLE_ROW = np.dtype([("id", "<u8"), ("digest", "<u8", (2,)), ("rank", "<u8"), ("vote", "i1"), ("pad", "u1", (3,)),
                       ("file", "<u4"), ("row", "<u4"), ("pad2", "u1", (4,))])


def write_table(spill_dir: str, shard: int, table: Nodes, sources: tuple | None = None) -> None:
    """A node table as rows of a file in the spill directory, row i its node i (local runs: the
    nodes of candidate pairs are read from there, not carried through the runner). A row names
    its node's signature, row `row` of signature file `file`, rather than holding it (512
    bytes a node, all of them written again): `sources` is (the signature files, LocalFiles,
    each node's file in them, its row there); None writes the table's signatures to a file of
    its own. Beside the table, sealed, `.files` lists the signature files and the table's Sum."""
    if sources is None:
        own = write_whole(node_table_file(spill_dir, shard) + ".signatures", np.ascontiguousarray(table.signatures))
        sources = ([own], np.zeros(table.ids.size, np.uint32), np.arange(table.ids.size, dtype=np.uint32))
    files, file_of, row_in_file = sources
    rows = np.zeros(table.ids.size, dtype=_TABLE_ROW)
    rows["id"], rows["digest"], rows["rank"], rows["vote"], rows["file"], rows["row"] = \
        table.ids, table.digests, table.ranks, table.votes, file_of, row_in_file
    written = write_whole(node_table_file(spill_dir, shard), rows)
    listing = {"table": written.sum.to_json(), "files": [[f.path, *f.sum.to_json()] for f in files]}
    write_whole(node_table_file(spill_dir, shard) + ".files", seal(json.dumps(listing).encode()))


def _table_files(path: str) -> tuple[LocalFile, list[LocalFile]]:
    """A node table at `path` and the signature files it names, as its sealed `.files` lists them."""
    with open(path + ".files", "rb") as f:  # FileNotFoundError names the path
        listing = json.loads(bytes(unseal(f.read(), f"node table listing {path}.files")))
    return (LocalFile(path, Sum.from_json(listing["table"])),
            [LocalFile(name, Sum(int(size), int(crc))) for name, size, crc in listing["files"]])


def read_nodes(spill_dir: str, ids: np.ndarray, hashes: int) -> Nodes:
    """The nodes `ids`, in that order, from their tables' files and the signature files they
    name (write_table), each checked against the Sum written with it."""
    out = np.empty(ids.size, dtype=_TABLE_ROW)
    signatures = np.empty((ids.size, hashes), dtype=np.uint16)
    for shard, members in groups_of(shard_of_node(ids)):
        table_file, files = _table_files(node_table_file(spill_dir, int(shard)))
        table = mapped(table_file, _TABLE_ROW, kind="node table")
        wanted = (ids[members] & _ROW_MASK).astype(np.int64)
        if wanted.size and wanted.max() >= table.size:
            raise RuntimeError(f"near-duplicate graph: a pair names a node its table {table_file.path} does not hold")
        out[members] = found = table[wanted]
        for file, at in groups_of(found["file"]):
            if file >= len(files):
                raise RuntimeError(f"near-duplicate graph: node table {table_file.path} names a signature file it "
                                   f"does not list")
            signatures[members[at]] = signature_rows(files[int(file)], hashes, found["row"][at])
    if not np.array_equal(out["id"], ids):
        raise RuntimeError("near-duplicate graph: a pair names a node its shard's table does not hold")
    return Nodes(out["id"], out["digest"], out["rank"], out["vote"], signatures)


# ---------------------------------------------------------------------------------------------
# candidates

def key_by_band(keyed_table, bands: int, rows: int, num_shards: int, against: bool = False,
                spill_dir: str | None = None):
    """(shard, node table) -> (band shard, BandPart) for each band shard its nodes' bands hit;
    tagged `keys`: (shard, near_index.NearKeys) of its nodes, the dedup index's near part, and
    with `against` (--dedup_against) tagged `bands`: (band shard, near_index.BandEntries).
    One densification of the signatures serves both. With a spill directory (local runs),
    each band part's hashes are written there (node_table wrote the table there before)."""
    shard, table = keyed_table
    dense = minhash.densified(table.signatures)
    hashes = minhash.hash_bands(dense, bands, rows).ravel()
    nodes, order_keys = np.repeat(table.ids, bands), np.repeat(table.digests[:, 0], bands)
    for band_shard, members in groups_of(hashing.shard_of(hashes, num_shards)):
        part = BandPart.of(hashes[members], nodes[members], order_keys[members])
        if spill_dir is not None:  # the runner carries the part's nodes only, not 8 bytes per node and band
            file = write_whole(os.path.join(spill_dir, f"bands-{shard:06d}-{int(band_shard):06d}.hashes"),
                               np.ascontiguousarray(part.hashes))
            part = dataclasses.replace(part, hashes=None, hashes_file=file)
        yield int(band_shard), part
    for tag, keyed in near_index.table_keys(shard, table, dense, num_shards, against):
        yield beam.pvalue.TaggedOutput(tag, keyed)


def candidate_pairs(keyed_parts):
    """(band shard, BandParts) -> requests for both nodes of each candidate pair (_candidates):
    (dedup shard of the node, Edges(a, b, b_side)), a < b."""
    a, b = _candidates(keyed_parts)
    for side, ends in ((False, a), (True, b)):
        for shard, members in groups_of(shard_of_node(ends)):
            yield int(shard), Edges(a[members], b[members], np.full(members.size, side))


def candidate_pairs_by_bucket(keyed_parts, num_shards: int):
    """(band shard, BandParts) -> (pair bucket, Edges(a, b)): the candidate pairs (_candidates),
    for verify_local_pairs (local runs, whose nodes are in the spill directory)."""
    a, b = _candidates(keyed_parts)
    for bucket, members in groups_of(_pair_buckets(a, b, num_shards)):
        yield int(bucket), Edges(a[members], b[members])


def _candidates(keyed_parts) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), a < b, distinct: the candidate pairs of a band shard's parts. The nodes sharing
    a band hash are paired each with each, up to HUBS of them; beyond, each of the others with
    the HUBS first by content digest (not by node id: which pairs are compared must not
    depend on the shard count)."""
    _, parts = keyed_parts
    parts = list(parts)
    hashes = np.concatenate([p.band_hashes() for p in parts])
    maybe = _maybe_shared(hashes)
    order = maybe[np.argsort(hashes[maybe])]  # not stable (2x faster): the order within a run is set below, by value
    hashes = hashes[order]
    nodes = np.concatenate([p.entry_nodes() for p in parts])[order]
    starts = _run_starts(hashes)
    run_size = np.diff(np.append(starts, hashes.size))
    # Members of runs of two or more in digest order, ties by node id.
    shared = np.repeat(run_size > 1, run_size)
    if shared.any():
        keys = np.concatenate([p.entry_order_keys() for p in parts])[order]
        within = np.flatnonzero(shared)
        nodes[within] = nodes[within][np.lexsort((nodes[within], keys[within], hashes[within]))]
    # The j-th node of a run is paired with the min(j, HUBS) nodes before it.
    position = np.arange(hashes.size) - np.repeat(starts, run_size)
    partners = np.minimum(position, HUBS)
    first = np.cumsum(partners) - partners
    a = nodes[np.repeat(np.repeat(starts, run_size), partners)
              + np.arange(int(partners.sum())) - np.repeat(first, partners)]
    b = np.repeat(nodes, partners)
    a, b = np.minimum(a, b), np.maximum(a, b)
    unique = _sorted_unique(a, b)
    return a[unique], b[unique]


def _maybe_shared(hashes: np.ndarray) -> np.ndarray:
    """Indices of the hashes whose low bits another of them has: every hash met twice or more,
    and a few met once (about a third). Most band hashes are met once and pair with nothing;
    one count by low bits drops most of them before the sort (sorting every hash cost
    two thirds of finding the candidates)."""
    if hashes.size < 2:
        return np.empty(0, dtype=np.int64)
    bits = min(int(hashes.size - 1).bit_length() + 1, 30)
    low = (hashes & np.uint64((1 << bits) - 1)).astype(np.intp)
    return np.flatnonzero(np.bincount(low, minlength=1 << bits)[low] > 1)


def _pair_buckets(a: np.ndarray, b: np.ndarray, num_shards: int) -> np.ndarray:
    return hashing.shard_of(hashing.splitmix64(hashing.splitmix64(a) ^ b), num_shards)


def attach_nodes(keyed, num_shards: int):
    """(dedup shard, {tables, requests}) -> (pair bucket, Edges(a, b, b_side, the node asked for))."""
    _, grouped = keyed
    requests = list(grouped["requests"])
    if not requests:
        return
    (table,) = list(grouped["tables"])
    a = np.concatenate([r.a for r in requests])
    b = np.concatenate([r.b for r in requests])
    b_side = np.concatenate([r.b_side for r in requests])
    # A pair that shares several bands is asked for by each band shard that found it: once is enough.
    once = _sorted_unique(a, b, b_side.astype(np.uint64))
    a, b, b_side = a[once], b[once], b_side[once]
    wanted = np.where(b_side, b, a)
    nodes = table.take((wanted & _ROW_MASK).astype(np.int64))
    if not np.array_equal(nodes.ids, wanted):
        raise RuntimeError("near-duplicate graph: a pair names a node its shard's table does not hold")
    for bucket, members in groups_of(_pair_buckets(a, b, num_shards)):
        yield int(bucket), Edges(a[members], b[members], b_side[members], nodes.take(members))


def verify_pairs(keyed_halves, threshold: float):
    """(pair bucket, halves) -> the pairs whose signatures agree on at least the threshold's
    share of bins less LINK_MARGIN (linked: one split), both ways: (node shard, Edges(node,
    neighbour)), for the components; tagged `near`: those at the threshold itself (near-copies),
    (shard of a, Edges(a, b)); tagged `nodes`: (node shard, Nodes) of the linked pairs' nodes,
    once each; tagged `counts`: pairs checked and near-copies found."""
    _, halves = keyed_halves
    halves = list(halves)
    a = np.concatenate([h.a for h in halves])
    b = np.concatenate([h.b for h in halves])
    b_side = np.concatenate([h.b_side for h in halves])
    nodes = Nodes.concatenate([h.nodes for h in halves])
    # Each pair's two halves, a's then b's (attach_nodes sent each once).
    kept = np.lexsort((b_side, b, a))
    a_half, b_half = kept[0::2], kept[1::2]
    if (a_half.size != b_half.size or not np.array_equal(a[a_half], a[b_half])
            or not np.array_equal(b[a_half], b[b_half]) or b_side[a_half].any() or not b_side[b_half].all()):
        raise RuntimeError("near-duplicate graph: a candidate pair arrived without both of its nodes")
    yield from _verified(a[a_half], b[a_half], nodes.take(a_half), nodes.take(b_half), threshold)


def verify_local_pairs(keyed_pairs, threshold: float, spill_dir: str, hashes: int):
    """(pair bucket, Edges(a, b)) -> (0, VerifiedPairs): the linked pairs among them, and which
    are near-copies, their nodes read from their tables in the spill directory (local runs:
    decide_at_once takes the pairs of every bucket, under one key); tagged `counts`: as
    verify_pairs'."""
    _, parts = keyed_pairs
    a, b = _edges_of(parts)  # a pair found in several band shards: once
    near, linked = pair_links(read_nodes(spill_dir, a, hashes), read_nodes(spill_dir, b, hashes), threshold)
    yield 0, VerifiedPairs(a[linked], b[linked], near[linked])
    yield beam.pvalue.TaggedOutput(COUNTS, _pair_counts(near, linked))


def pair_links(first: Nodes, second: Nodes, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(near-copy, linked) for each pair of nodes (first[i], second[i]), by their signatures'
    agreement. Every near-copy is linked: its texts meet in one component, though its margin
    may exceed LINK_MARGIN (--near_hashes 64: VERIFY_Z deviations of a 64-bin estimate reach
    0.125)."""
    same, filled = minhash.agreement(first.signatures, second.signatures)
    near = same >= needed_agreement(threshold - verification_margin(threshold, filled, first.signatures.shape[1]),
                                    filled)
    return near, near | (same >= needed_agreement(max(threshold - LINK_MARGIN, 0.0), filled))


def _pair_counts(near: np.ndarray, linked: np.ndarray) -> dict:
    return {CANDIDATE_PAIRS: int(near.size), VERIFIED_PAIRS: int(np.count_nonzero(near)),
            LINKED_PAIRS: int(np.count_nonzero(linked))}


def _verified(a: np.ndarray, b: np.ndarray, first: Nodes, second: Nodes, threshold: float):
    """verify_pairs' outputs for the distinct candidate pairs (a, b) and their nodes."""
    near, linked = pair_links(first, second, threshold)
    yield from _keyed_by_node(a[linked], b[linked])
    yield from _keyed_by_node(b[linked], a[linked])
    for shard, members in groups_of(shard_of_node(a[near])):
        yield beam.pvalue.TaggedOutput(NEAR, (int(shard), Edges(a[near][members], b[near][members])))
    if linked.any():
        both = Nodes.concatenate([first.take(linked), second.take(linked)])
        once = both.take(_sorted_unique(both.ids))
        for shard, members in groups_of(shard_of_node(once.ids)):
            yield beam.pvalue.TaggedOutput(NODES, (int(shard), once.take(members)))
    yield beam.pvalue.TaggedOutput(COUNTS, _pair_counts(near, linked))


VERIFY_Z = 2.0  # standard deviations of the estimate below the threshold that a near-copy may lie


def verification_margin(threshold: float, filled: np.ndarray, k: int) -> np.ndarray:
    """How far below the threshold a pair's estimate may be and the pair still be a near-copy:
    VERIFY_Z standard deviations of the estimate for a pair at the threshold, so that pairs
    just above it are not lost to the estimate's noise (without it, recall was 0.85-0.95 for
    pairs of Jaccard 0.80-0.85). The estimate samples `filled` bins of the union's s
    shingles without replacement: sd = sqrt(t (1 - t) / m * (1 - m / s)), s estimated from
    the m filled of k bins (s = -k ln(1 - m / k); all filled: s is large, no correction).
    Measured on the sample's planted pairs (docs/dedup.md): recall 0.995-1.0 for Jaccard
    0.80-0.85, and 0-0.4% of pairs of Jaccard 0.6-0.7 taken."""
    m = np.maximum(np.asarray(filled, dtype=np.float64), 1)
    s = np.where(m >= k, np.inf, -k * np.log1p(-np.minimum(m, k - 0.5) / k))
    margin = VERIFY_Z * np.sqrt(threshold * (1 - threshold) / m * np.maximum(0.0, 1 - m / s))
    return np.round(margin, 6)  # a last-bit difference of another libm cannot move a pair


def needed_agreement(threshold, filled: np.ndarray) -> np.ndarray:
    """Bins two signatures must share, of the `filled` bins of either, for an estimated
    similarity of at least `threshold`: ceil(threshold * filled), at least 1, rounded so that
    a threshold given in decimal is not pushed up by its binary rounding."""
    return np.maximum(np.ceil(np.round(threshold * np.asarray(filled, dtype=np.float64), 9)), 1).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# connected components

def _edges_of(parts) -> tuple[np.ndarray, np.ndarray]:
    parts = list(parts)
    src = np.concatenate([p.a for p in parts])
    dst = np.concatenate([p.b for p in parts])
    kept = _sorted_unique(src, dst)
    return src[kept], dst[kept]


def _keyed_by_node(src: np.ndarray, dst: np.ndarray):
    for shard, members in groups_of(shard_of_node(src)):
        yield int(shard), Edges(src[members], dst[members])


def large_star(keyed_parts):
    """(node shard, Edges(u, neighbour) both ways) -> each larger neighbour v of u linked to the
    smallest of u's neighbourhood m: (shard of v, Edges(v, m)), v > m."""
    _, parts = keyed_parts
    src, dst = _edges_of(parts)
    starts = _run_starts(src)
    smallest = np.minimum(src[starts], dst[starts])  # dst is sorted within each u
    m = np.repeat(smallest, np.diff(np.append(starts, src.size)))
    larger = dst > src
    yield from _keyed_by_node(dst[larger], m[larger])


def small_star(keyed_parts):
    """(node shard, Edges(u, smaller neighbour)) -> u and each of its smaller neighbours linked
    to the smallest of them m, both ways: (node shard, Edges(x, m)) and (.., Edges(m, x))."""
    _, parts = keyed_parts
    src, dst = _edges_of(parts)
    starts = _run_starts(src)
    m = np.repeat(dst[starts], np.diff(np.append(starts, src.size)))
    x = np.concatenate([dst[dst != m], src[starts]])
    to = np.concatenate([m[dst != m], dst[starts]])
    yield from _keyed_by_node(x, to)
    yield from _keyed_by_node(to, x)


def star_edges(keyed_parts):
    """The last small star's output (both ways) -> (child, parent) edges with child > parent,
    keyed by the shard of each end, tagged by which end it is (b_side: the key is the parent's)."""
    _, parts = keyed_parts
    src, dst = _edges_of(parts)
    child = src > dst
    c, p = src[child], dst[child]
    for shard, members in groups_of(shard_of_node(c)):
        yield int(shard), Edges(c[members], p[members], np.zeros(members.size, dtype=bool))
    for shard, members in groups_of(shard_of_node(p)):
        yield int(shard), Edges(c[members], p[members], np.ones(members.size, dtype=bool))


def check_stars(keyed_parts):
    """(node shard, the (child, parent) edges at its nodes) -> `stars`: the edges of children
    that have one parent and no children, keyed by the parent's shard; `residual`: every edge
    at a node that has two parents, or a parent and children (not converged yet)."""
    shard, parts = keyed_parts
    parts = list(parts)
    c = np.concatenate([p.a for p in parts])
    p = np.concatenate([q.b for q in parts])
    about_parent = np.concatenate([q.b_side for q in parts])
    mine = np.where(about_parent, p, c)  # the node of this shard each edge is about
    kept = _sorted_unique(c, p, about_parent.astype(np.uint64))
    c, p, about_parent, mine = c[kept], p[kept], about_parent[kept], mine[kept]
    children_of = np.unique(p[about_parent])  # nodes of this shard that have children
    as_child = ~about_parent
    parents = np.unique(c[as_child], return_counts=True)
    two_parents = parents[0][parents[1] > 1]
    unconverged = np.union1d(two_parents, np.intersect1d(children_of, c[as_child]))
    residual = np.isin(mine, unconverged)
    if residual.any():
        yield beam.pvalue.TaggedOutput(RESIDUAL, (0, Edges(c[residual], p[residual])))
    star = as_child & ~residual
    for shard_, members in groups_of(shard_of_node(p[star])):
        yield beam.pvalue.TaggedOutput(STARS, (int(shard_), Edges(c[star][members], p[star][members])))


def components(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, the smallest node of each one's component) of an edge list, by union-find:
    minimum labels propagated along edges, then pointer jumping, until nothing changes."""
    nodes, index = np.unique(np.concatenate([src, dst]), return_inverse=True)
    u, v = index[:src.size], index[src.size:]
    label = np.arange(nodes.size)
    while True:
        before = label.copy()
        np.minimum.at(label, u, label[v])
        np.minimum.at(label, v, label[u])
        label = label[label]
        if np.array_equal(label, before):
            return nodes, nodes[label]


def finish_residual(keyed_parts):
    """(one key, the unconverged edges) -> (node shard, Edges(node, its root)) for each of their
    nodes but the roots, and the count of those edges."""
    _, parts = keyed_parts
    src, dst = _edges_of(parts)
    if src.size == 0:
        return
    nodes, roots = components(src, dst)
    moved = nodes != roots
    yield from _keyed_by_node(nodes[moved], roots[moved])
    yield beam.pvalue.TaggedOutput(COUNTS, {UNCONVERGED_EDGES: int(src.size)})


def relabel(keyed):
    """(node shard, {stars: (child, parent) keyed by the parent, roots: (node, root)}) ->
    (shard of the child, Edges(child, its component's smallest node)) for every child."""
    _, grouped = keyed
    stars, roots = list(grouped[STARS]), list(grouped["roots"])
    root_of, root = (_edges_of(roots) if roots else (np.empty(0, np.uint64), np.empty(0, np.uint64)))
    yield from _keyed_by_node(root_of, root)
    if stars:
        c, p = _edges_of(stars)
        at = np.searchsorted(root_of, p)
        found = at < root_of.size
        found[found] = root_of[at[found]] == p[found]
        p = p.copy()
        p[found] = root[at[found]]
        yield from _keyed_by_node(c, p)


def label_nodes(keyed):
    """(node shard, {edges: (child, root), nodes: Nodes, near: near-copy pairs (a, b), held:
    HeldNear}) -> (shard of the root, Edges(root, node, nodes=the node)) for each node (a node
    with no parent is a root); tagged `near`: (shard of the root, Edges(a, b)) for each pair;
    tagged `held`: (shard of the root, node ids) of the nodes earlier datasets hold."""
    _, grouped = keyed
    nodes = list(grouped[NODES])
    if not nodes:
        return
    nodes = Nodes.concatenate(nodes)
    nodes = nodes.take(_sorted_unique(nodes.ids))  # a node of pairs checked in several buckets
    edges = list(grouped["edges"])
    root = nodes.ids.copy()
    if edges:
        c, p = _edges_of(edges)  # a child may be reported twice (a star edge and the residual's); same root
        at = np.searchsorted(c, nodes.ids)
        found = at < c.size
        found[found] = c[at[found]] == nodes.ids[found]
        root[found] = p[at[found]]
    for shard, members in groups_of(shard_of_node(root)):
        yield int(shard), Edges(root[members], nodes.ids[members], None, nodes.take(members))
    held = list(grouped.get(HELD, ()))
    if held:
        of_mine = np.isin(nodes.ids, np.concatenate([h.ids for h in held]))
        for shard, members in groups_of(shard_of_node(root[of_mine])):
            yield beam.pvalue.TaggedOutput(HELD, (int(shard), nodes.ids[of_mine][members]))
    pairs = list(grouped[NEAR])
    if pairs:
        a, b = _edges_of(pairs)
        root_of_a = root[np.searchsorted(nodes.ids, a)]  # a is one of this shard's nodes
        for shard, members in groups_of(shard_of_node(root_of_a)):
            yield beam.pvalue.TaggedOutput(NEAR, (int(shard), Edges(a[members], b[members])))


def choose_kept(keyed, threshold: float, seed: int, validation_fraction: float):
    """(root shard, {members: the nodes of the linked components rooted there, near: their
    near-copy pairs}) -> (dedup shard, NearDecisions) for every member: the texts that are
    near-copies of a better-ranked kept text are removed (keep_greedily), each naming that
    text and their estimated similarity; every member of a linked component gets its split. Tagged `counts`: clusters, their members, expected
    false positives."""
    _, grouped = keyed
    parts = list(grouped["members"])
    if not parts:
        return
    roots = np.concatenate([p.a for p in parts])
    members = Nodes.concatenate([p.nodes for p in parts])
    # Linked components sorted by root, each one's members by rank.
    order = np.lexsort((members.digests[:, 1], members.digests[:, 0], members.ranks, roots))
    roots, members = roots[order], members.take(order)
    starts = _run_starts(roots)
    sizes = np.diff(np.append(starts, roots.size))
    votes = np.maximum.reduceat(members.votes, starts)
    splits = (votes == VALIDATION).astype(np.int8)
    auto = votes == AUTO
    if auto.any():  # the content hash of the component's first text decides, as for a text alone
        split_hashes = hashing.content_hashes(hashing.content_salt(seed, hashing.SPLIT),
                                              members.digests[starts][auto])
        splits[auto] = hashing.below_fraction(split_hashes, validation_fraction)
    pairs = list(grouped[NEAR])
    held = list(grouped.get(HELD, ()))
    held = np.isin(members.ids, np.concatenate(held)) if held else None
    kept_of = keep_greedily(members, *(_edges_of(pairs) if pairs else (np.empty(0, np.uint64),) * 2), held)
    removed = kept_of != np.arange(kept_of.size)
    cluster_split = np.repeat(splits, sizes)
    same, filled = minhash.agreement(members.signatures, members.signatures[kept_of])
    similarity = (same / np.maximum(filled, 1)).astype(np.float32)
    for shard, chosen in groups_of(shard_of_node(members.ids)):
        yield int(shard), NearDecisions(members.digests[chosen], removed[chosen], cluster_split[chosen],
                                        members.digests[kept_of[chosen]], similarity[chosen])
    same, filled = same[removed], filled[removed]
    clusters = int(np.unique(kept_of[removed]).size)
    yield beam.pvalue.TaggedOutput(COUNTS, {CLUSTERS: clusters, CLUSTERED: int(np.count_nonzero(removed)) + clusters,
                                            FALSE_POSITIVES_MICRO: expected_false_positives(same, filled, threshold)})


def keep_greedily(members: Nodes, a: np.ndarray, b: np.ndarray, held: np.ndarray | None = None) -> np.ndarray:
    """For each of `members` (sorted by rank), the index of the member kept for it: itself when
    it is kept. Members are taken best rank first; one is removed when it is a near-copy (a
    pair (a, b)) of a member already kept, and matched to the best-ranked such member; else it
    is kept. So every removed text is a verified near-copy of the kept text it names (merging
    whole components of the pairs instead removed the far end of chains: A ~ B ~ C with A and
    C at Jaccard 0.64), and the choice is the same on any runner and shard count.

    `held` (--dedup_against): members that earlier datasets hold as near-copies, removed by
    that: they are not kept, so a member that is a near-copy of them only is kept (its own
    near-copies of earlier texts are found the same way), and their own entry stays theirs."""
    kept_of = np.arange(members.ids.size)
    if a.size == 0:
        return kept_of
    by_id = np.argsort(members.ids)
    ends = by_id[np.searchsorted(members.ids[by_id], np.concatenate([a, b]))]  # positions = rank order
    first, second = ends[:a.size], ends[a.size:]
    better, worse = np.minimum(first, second), np.maximum(first, second)
    order = np.lexsort((better, worse))  # each worse member's better partners, best first
    better, worse = better[order], worse[order]
    starts = _run_starts(worse)
    stops = np.append(starts[1:], worse.size)
    kept = np.ones(kept_of.size, dtype=bool) if held is None else ~held
    for member, lo, hi in zip(worse[starts].tolist(), starts.tolist(), stops.tolist()):
        if not kept[member]:
            continue  # held by an earlier dataset
        partners = better[lo:hi]
        taken = np.flatnonzero(kept[partners])
        if taken.size:
            kept[member] = False
            kept_of[member] = partners[taken[0]]
    return kept_of


def expected_false_positives(same: np.ndarray, filled: np.ndarray, threshold: float) -> int:
    """The expected number (in millionths) of removed texts whose Jaccard similarity to the
    text kept for them lies below threshold - FALSE_POSITIVE_MARGIN, given their signatures'
    agreement (`same` of `filled` bins): a normal approximation of the estimate, standard
    deviation sqrt(J (1 - J) / filled)."""
    if same.size == 0:
        return 0
    filled = np.maximum(filled, 1)
    similar = same / filled
    sd = np.sqrt(np.maximum(similar * (1 - similar), 1 / filled) / filled)
    z = (threshold - FALSE_POSITIVE_MARGIN - similar) / (sd * math.sqrt(2))
    below = 0.5 * (1 + np.array([math.erf(v) for v in z.tolist()]))
    return int(np.round(below * 1e6).astype(np.int64).sum())


# ---------------------------------------------------------------------------------------------
# local runs: the graph after verification, on one worker at once

def decide_at_once(keyed, threshold: float, seed: int, validation_fraction: float, rounds: int, spill_dir: str,
                   hashes: int):
    """(0, VerifiedPairs of every pair bucket), or (0, {pairs: those, held: HeldNear}) ->
    what the steps from the components to choose_kept give: (dedup shard, NearDecisions),
    tagged `counts`. Local runs: one worker takes the whole graph, its nodes read from their
    tables in the spill directory (the runner holds every group in memory anyway), instead
    of 16 more stages of a few milliseconds' work each.

    The steps are the very functions the other runners run by shard (_at_once): each
    decides node by node, from the edges at the node, and each node's edges are all in its
    shard's group, so one group of every edge gives what the shards give, counts included
    (near_unconverged_edges after the same `rounds`)."""
    _, grouped = keyed
    pairs, held = (list(grouped["pairs"]), list(grouped[HELD])) if isinstance(grouped, dict) else (list(grouped), [])
    a = np.concatenate([p.a for p in pairs]) if pairs else np.empty(0, np.uint64)
    if a.size == 0:
        return
    b = np.concatenate([p.b for p in pairs])
    near = np.concatenate([p.near for p in pairs])
    edges = [Edges(a, b), Edges(b, a)]  # as VerifyPairs sends them on to the components elsewhere
    for _ in range(rounds):
        edges, _ = _at_once(large_star, edges)
        edges, _ = _at_once(small_star, edges)
    _, checked = _at_once(check_stars, _at_once(star_edges, edges)[0])  # its outputs are all tagged
    roots, finished = _at_once(finish_residual, checked[RESIDUAL])
    for count in finished[COUNTS]:
        yield beam.pvalue.TaggedOutput(COUNTS, count)
    labels, _ = _at_once(relabel, {STARS: checked[STARS], "roots": roots})
    nodes = read_nodes(spill_dir, np.unique(np.concatenate([a, b])), hashes)
    members, labelled = _at_once(label_nodes, {"edges": labels, NODES: [nodes], NEAR: [Edges(a[near], b[near])],
                                               HELD: held})
    yield from choose_kept((0, {"members": members, NEAR: labelled[NEAR], HELD: labelled[HELD]}), threshold, seed,
                           validation_fraction)


def _under_one_key(keyed):
    return 0, keyed[1]


def _at_once(step, grouped) -> tuple[list, dict]:
    """(the values of `step`'s main output, {tag: values of that output}) for all of `grouped`
    given as one group; a step given nothing is not run, as a runner runs no group without
    elements. Counts are dicts, unkeyed."""
    main, tagged = [], defaultdict(list)
    if any(grouped.values()) if isinstance(grouped, dict) else grouped:
        for out in step((0, grouped)):
            if isinstance(out, beam.pvalue.TaggedOutput):
                tagged[out.tag].append(out.value if out.tag == COUNTS else out.value[1])
            else:
                main.append(out[1])
    return main, tagged


# ---------------------------------------------------------------------------------------------

class NearFound(NamedTuple):
    decisions: beam.PCollection  # (dedup shard, NearDecisions)
    counts: beam.PCollection  # count dicts
    keys: beam.PCollection  # (dedup shard, near_index.NearKeys): the dedup index's near part
    held: beam.PCollection | None  # --dedup_against: (dedup shard, near_index.HeldNear)


class FindNearDuplicates(beam.PTransform):
    """TokenizedBatches with digests and signatures -> NearFound: (dedup shard, NearDecisions),
    count dicts, the near keys of the index, and, with `earlier` (--dedup_against: (band
    shard, near_index.BandEntries) of the earlier datasets' texts), the texts that are
    near-copies of earlier ones; those are removed by that, and taken as not kept when their
    clusters choose what to keep (keep_greedily)."""

    def __init__(self, settings: minhash.MinHashSettings, threshold: float, seed: int,
                 validation_fraction: float, num_shards: int, spill_dir: str | None = None, rounds: int = ROUNDS,
                 earlier=None):
        super().__init__()
        self._earlier = earlier
        self._spill_dir = spill_dir
        self._settings = settings
        self._threshold = threshold
        self._seed = seed
        self._validation_fraction = validation_fraction
        self._shards = num_shards
        self._rounds = rounds

    def expand(self, batches):
        s, n = self._settings, self._shards
        tables = (
            batches
            | "KeyNodes" >> beam.ParDo(KeyNodes(self._seed, n, self._spill_dir)).with_output_types(tuple[int, NodePart])
            | "GroupCopies" >> beam.GroupByKey()
            | "NodeTables" >> beam.FlatMap(node_table, self._spill_dir).with_output_types(tuple[int, Nodes])
        )
        keyed = tables | "KeyByBand" >> beam.FlatMap(key_by_band, s.bands, s.rows, n, self._earlier is not None,
                                                     self._spill_dir) \
            .with_outputs(near_index.KEYS, near_index.BANDS, main="parts")
        held = None
        if self._earlier is not None:
            needed = near_index.needed_bits(self._threshold, s.hashes, VERIFY_Z)
            held = (
                {"new": keyed[near_index.BANDS], "earlier": self._earlier}
                | "JoinEarlierBands" >> beam.CoGroupByKey()
                | "MatchEarlier" >> beam.FlatMap(
                    near_index.match_earlier, needed, near_index.sketch_bits(s.hashes))
            )
        bands = keyed.parts | "GroupByBand" >> beam.GroupByKey()
        # Local runs read both nodes of a pair from the spill directory and decide the graph at once.
        decide = self._decide_at_once if self._spill_dir is not None else self._decide_by_shard
        decisions, counts = decide(bands, tables, held)
        return NearFound(decisions, counts, keyed[near_index.KEYS], held)

    def _decide_at_once(self, bands, _, held):
        s, n = self._settings, self._shards
        verified = (
            bands
            | "CandidatePairs" >> beam.FlatMap(candidate_pairs_by_bucket, n).with_output_types(tuple[int, Edges])
            | "GroupPairs" >> beam.GroupByKey()
            | "VerifyPairs" >> beam.FlatMap(verify_local_pairs, self._threshold, self._spill_dir, s.hashes)
            .with_outputs(COUNTS, main="pairs")
        )
        if held is None:
            graph = verified.pairs | "GatherGraph" >> beam.GroupByKey()
        else:
            graph = ({"pairs": verified.pairs, HELD: held | "KeyHeldAtOnce" >> beam.Map(_under_one_key)}
                     | "GatherGraph" >> beam.CoGroupByKey())
        chosen = graph | "DecideAtOnce" >> beam.FlatMap(
            decide_at_once, self._threshold, self._seed, self._validation_fraction, self._rounds, self._spill_dir,
            s.hashes).with_outputs(COUNTS, main="decisions")
        return chosen.decisions, (verified[COUNTS], chosen[COUNTS]) | "NearCounts" >> beam.Flatten()

    def _decide_by_shard(self, bands, tables, held):
        requests = bands | "CandidatePairs" >> beam.FlatMap(candidate_pairs).with_output_types(tuple[int, Edges])
        verified = (
            {"tables": tables, "requests": requests}
            | "FetchNodes" >> beam.CoGroupByKey()
            | "AttachNodes" >> beam.FlatMap(attach_nodes, self._shards).with_output_types(tuple[int, Edges])
            | "GroupPairs" >> beam.GroupByKey()
            | "VerifyPairs" >> beam.FlatMap(verify_pairs, self._threshold)
            .with_outputs(NEAR, NODES, COUNTS, main="edges")
        )
        edges = verified.edges
        for r in range(self._rounds):
            edges = (
                edges
                | f"GroupLargeStar{r}" >> beam.GroupByKey()
                | f"LargeStar{r}" >> beam.FlatMap(large_star).with_output_types(tuple[int, Edges])
                | f"GroupSmallStar{r}" >> beam.GroupByKey()
                | f"SmallStar{r}" >> beam.FlatMap(small_star).with_output_types(tuple[int, Edges])
            )
        checked = (
            edges
            | "GroupStars" >> beam.GroupByKey()
            | "StarEdges" >> beam.FlatMap(star_edges).with_output_types(tuple[int, Edges])
            | "GroupConvergence" >> beam.GroupByKey()
            | "CheckConvergence" >> beam.FlatMap(check_stars).with_outputs(STARS, RESIDUAL)
        )
        finished = (
            checked[RESIDUAL]
            | "GroupUnconverged" >> beam.GroupByKey()
            | "FinishUnconverged" >> beam.FlatMap(finish_residual).with_outputs(COUNTS, main="roots")
        )
        labels = (
            {STARS: checked[STARS], "roots": finished.roots}
            | "JoinRoots" >> beam.CoGroupByKey()
            | "Relabel" >> beam.FlatMap(relabel).with_output_types(tuple[int, Edges])
        )
        joined = {"edges": labels, NODES: verified[NODES], NEAR: verified[NEAR]}
        if held is not None:
            joined[HELD] = held
        members = (
            joined
            | "JoinMembers" >> beam.CoGroupByKey()
            | "LabelMembers" >> beam.FlatMap(label_nodes).with_outputs(NEAR, HELD, main="members")
        )
        components_of = {"members": members.members, NEAR: members[NEAR]}
        if held is not None:
            components_of[HELD] = members[HELD]
        chosen = (
            components_of
            | "GroupComponents" >> beam.CoGroupByKey()
            | "ChooseKept" >> beam.FlatMap(choose_kept, self._threshold, self._seed, self._validation_fraction)
            .with_outputs(COUNTS, main="decisions")
        )
        return chosen.decisions, (verified[COUNTS], finished[COUNTS], chosen[COUNTS]) | "NearCounts" >> beam.Flatten()
