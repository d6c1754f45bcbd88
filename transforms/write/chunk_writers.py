"""WriteFlatTokens: sorted shards -> one zarr group, every chunk written by exactly one owner.

    lay out shards  ->  create arrays  ->  write owned chunks  ->  merge shared chunks

Shard sizes are combined globally into offsets (a prefix sum over shards, in shard order),
which every writer receives as a side input, together with the proof that the arrays were
created at their final shapes. A writer writes the chunks lying wholly inside its region
in one write, and hands the pieces of chunks it shares with a neighbour to a merge step
keyed by chunk, which writes each of them once. Two writers never touch one chunk: zarr
chunks are read-modify-written, so sharing one would silently lose data.

Every write puts the same bytes at the same place whenever it runs, so Beam may retry
any bundle. Each write reports how many chunks it wrote; the commit checks the total.
"""
from concurrent.futures import ThreadPoolExecutor, wait

import apache_beam as beam
import numpy as np

from transforms import cores
from transforms.progress import counter, show_written
from transforms.records import SortedShard
from transforms.shuffle.spill import fragment_values, spill_fragment
from transforms.write import layout as plan
from transforms.write import ownership
from transforms.write import zarr_store as store
from transforms.write.zarr_store import SEQ_SOURCES, SEQ_STARTS, SPLITS, TOKENS, StoreTarget, array_length


# The counter of chunks (write blocks: shard objects with zarr 3 sharding) written, as the
# commit counts them.
CHUNKS_WRITTEN = "chunks_written"


class _ArrayCache:
    """Opens each output array's writer once per worker; arrays are opened lazily because
    side inputs (which prove the arrays exist) are not available in DoFn.setup(). Writers
    share one thread pool, which encodes and stores chunks in parallel: four threads (an
    object store's latency is hidden behind them), or one per core of this process's share
    of the machine (transforms/cores.py) where that is more. close() (teardown) waits for
    the writes in flight and stops the pool for good: a writer opened before it refuses
    further writes, as a bundle torn down under its feet must; get() after close() opens new
    writers on a new pool."""

    def __init__(self, target: StoreTarget):
        self._target = target
        self._writers = {}
        self._pool = None

    def get(self, split: str, name: str):
        if (split, name) not in self._writers:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max(4, cores.share()), thread_name_prefix="flat-tokens-write")
            t = self._target
            try:
                writer = store.array_writer(self._target, split, name, self._pool)
            except FileNotFoundError:  # the array's metadata is gone: whose doing, if anyone's?
                ownership.check_owner(t.url, t.run_id, t.storage_options, doing=f"opening {split}/{name}")
                raise ownership.objects_vanished(t.url, t.run_id, f"the metadata of {split}/{name}, which it created",
                                                 f"opening {split}/{name}") from None
            # Checked after the writer noted its array's identity: so that identity is of the
            # array this run owned, not of one a run that took the output over made since.
            ownership.check_owner(t.url, t.run_id, t.storage_options, doing=f"opening {split}/{name}")
            self._writers[split, name] = writer
        return self._writers[split, name]

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
        self._pool = None
        self._writers = {}


def write_region(put, start: int, values, block: int, length: int, split: str, name: str):
    """Writes (with `put(start, values)`) the whole blocks of [start, start+len(values)) this
    writer owns; yields the rest as fragments (key, (start, values)) for the merge step, and
    receipts."""
    region = plan.plan_region(start, start + values.size, block, length)
    if region.direct:
        a, b = region.direct
        put(a, values[a - start:b - start])
        yield "receipt", (split, name, plan.block_count(b, block) - a // block)
    for index, a, b in region.fragments:
        yield "fragment", ((split, name, index), (a, np.asarray(values[a - start:b - start])))


class WriteOwnedChunks(beam.DoFn):
    """SortedShard -> writes its whole chunks; emits shared pieces (tag `fragments`) and
    receipts (main output: (split, array, chunks written)).

    A shard's chunks are encoded and stored on a thread pool while the next shard is sorted:
    `process` waits only for the previous shard's writes, and `finish_bundle` for the last,
    so no bundle succeeds (and no receipt reaches the commit) before its chunks have landed
    and the claim was confirmed after them. With a staging area (`area`), the shard's record
    is staged once its chunks landed, before the claim is confirmed, for a rerun to replay
    (transforms/write/finished.py)."""

    FRAGMENTS = "fragments"

    def __init__(self, target: StoreTarget, area=None):
        self._target = target
        self._area = area  # transforms.staging.StagingArea, or None
        self._arrays = None
        self._pending = None  # (what, futures, lease, record) of the shard being written

    def setup(self):
        self._arrays = _ArrayCache(self._target)

    def teardown(self):
        # The pool first: it stops taking writes and waits for those in flight, so the claim
        # is confirmed (and the lease given back) only after the last chunk has landed, even
        # when a bundle of this instance is still running on another thread.
        if self._arrays:
            self._arrays.close()
        self._settle_pending(failed_bundle=True)

    def start_bundle(self):
        self._settle_pending(failed_bundle=True)

    def process(self, shard: SortedShard, layout, ready):
        self._settle_pending()  # one shard in flight: memory stays bounded, errors surface here
        split = layout[shard.split]
        token_offset, seq_offset, n_tokens, n_seqs = split.shards[shard.shard]
        if (n_tokens, n_seqs) != (shard.tokens.size, shard.lengths.size):
            raise RuntimeError(f"{shard.split} shard {shard.shard} holds {shard.tokens.size} tokens in "
                               f"{shard.lengths.size} sequences, but was laid out as {n_tokens} in {n_seqs}: "
                               f"the input changed while the job ran, or a stage is not deterministic")
        starts = (np.cumsum(shard.lengths) - shard.lengths).astype(np.uint64) + np.uint64(token_offset)
        pieces = ((TOKENS, token_offset, shard.tokens, split.tokens),
                  (SEQ_STARTS, seq_offset, starts, split.sequences + 1))
        if self._target.record_sources:  # the sources of the shard's sequences, laid out like their starts
            pieces += ((SEQ_SOURCES, seq_offset, shard.sources, split.sequences),)
        show_written(shard.split, int(shard.lengths.size), int(shard.tokens.size))
        what = f"{shard.split} shard {shard.shard}'s chunks"
        t = self._target
        lease = ownership.begin_write(t.url, t.run_id, what, t.storage_options)
        futures = []  # tracked before the first write starts, so that even a failure midway is settled
        record = {"split": shard.split, "shard": shard.shard, "tokens": n_tokens, "sequences": n_seqs,
                  "max_token_id": split.max_token_id, "receipts": [], "fragments": []}
        self._pending = (what, futures, lease, record)
        for out in self._write(shard.split, pieces, lease, futures):
            if isinstance(out, beam.pvalue.TaggedOutput):
                record["fragments"].append(out.value)
            else:
                record["receipts"].append(out[1:])
            yield out

    def finish_bundle(self):
        self._settle_pending()

    def _settle_pending(self, failed_bundle: bool = False):
        """Waits for the shard in flight, then confirms the claim and gives its lease back:
        even when a write failed, or its bundle did (`failed_bundle`: its writes still ran),
        since part of it may have landed after a takeover. Then raises the first failed
        write of a live bundle."""
        if self._pending is None:
            return
        what, futures, lease, record = self._pending
        self._pending = None
        wait(futures)
        t = self._target
        try:
            # The shard's record, once every chunk landed, inside the lease: a run taking the
            # output over waits for it before it forgets the records of the chunks it deletes.
            if self._area is not None and not failed_bundle and all(f.exception() is None for f in futures):
                fragments = record.pop("fragments")
                # What landed, for a rerun to check before it trusts these chunks.
                record["objects"] = [[key, *summed.to_json()] for key, summed in (f.result() for f in futures)]
                self._area.put_shard(record["split"], record["shard"], record, fragments, lease)
        finally:
            ownership.confirm_written(t.url, t.run_id, what, t.storage_options, lease)
        if not failed_bundle:
            for written in futures:
                written.result()

    def _write(self, split, pieces, lease, futures: list | None = None):
        """Writes the pieces' owned chunks: before returning, or (given `futures`) on the
        pool, adding each chunk's future to `futures`. The caller holds `lease` (it checked
        the claim) and confirms the writes once they have landed."""
        t = self._target
        for name, start, values, length in pieces:
            array = self._arrays.get(split, name)
            if futures is None:
                put = lambda a, v, array=array: array.write(a, v, lease)  # noqa: E731
            else:
                put = lambda a, v, array=array: futures.extend(array.submit(a, v, lease))  # noqa: E731
            for kind, item in write_region(put, start, values, t.write_block(name), length, split, name):
                if kind == "receipt":
                    counter(CHUNKS_WRITTEN).inc(item[2])
                    yield item
                else:
                    yield beam.pvalue.TaggedOutput(self.FRAGMENTS, item)


class WriteEndMarkers(WriteOwnedChunks):
    """Writes each split's last seq_starts entry (= its token count), which no shard owns."""

    def process(self, _, layout, ready):
        t = self._target
        for split in SPLITS:
            total = layout[split]
            marker = np.array([total.tokens], dtype=np.uint64)
            with ownership.fenced(t.url, t.run_id, f"{split}'s end marker", t.storage_options) as lease:
                written = list(self._write(split, ((SEQ_STARTS, total.sequences, marker, total.sequences + 1),),
                                           lease))
            yield from written


class WriteSharedChunks(beam.DoFn):
    """(chunk key, fragments) -> assembles the chunk and writes it once. With a staging area,
    a landed chunk is recorded, and one an earlier attempt of the job recorded (`written`) is
    not written again."""

    def __init__(self, target: StoreTarget, area=None, written: frozenset = frozenset()):
        self._target = target
        self._area = area  # transforms.staging.StagingArea, or None
        self._written = written  # (split, array, chunk index) of recorded chunks
        self._arrays = None

    def setup(self):
        self._arrays = _ArrayCache(self._target)

    def process(self, keyed, layout, ready):
        (split, name, index), fragments = keyed
        length = array_length(name, layout[split].tokens, layout[split].sequences)
        a, b = plan.block_span(index, self._target.write_block(name), length)
        fragments = sorted(((start, fragment_values(values)) for start, values in fragments), key=lambda f: f[0])
        position = a
        for start, values in fragments:
            if start != position:
                raise RuntimeError(f"{split}/{name} chunk {index}: pieces leave a gap or overlap at "
                                   f"{position} (next piece starts at {start}); refusing to write a "
                                   f"chunk that would lose or duplicate data")
            position += values.size
        if position != b:
            raise RuntimeError(f"{split}/{name} chunk {index}: pieces cover [{a}, {position}), expected [{a}, {b})")
        if (split, name, index) not in self._written:
            t = self._target
            with ownership.fenced(t.url, t.run_id, f"{split}/{name} chunk {index}", t.storage_options) as lease:
                written = self._arrays.get(split, name).write(a, np.concatenate([v for _, v in fragments]), lease)
                if self._area is not None:  # in the lease, as a shard's record; with what landed
                    self._area.put_chunk(split, name, index, written, lease)
            counter(CHUNKS_WRITTEN).inc()
        yield split, name, 1

    def teardown(self):
        if self._arrays:
            self._arrays.close()


class WriteFlatTokens(beam.PTransform):
    """SortedShards -> the receipts of every chunk written: a tuple of PCollections of
    (split, array, chunks written), one per kind of writer (CommitDataset sums them).

    `layout` (the LayOutShards result) and `ready` (true once the arrays exist and the input
    passed its checks) are singleton side inputs. With a staging area, written shards and
    shared chunks are recorded there; `replayed` (ReplayFinishedShards' outputs) adds the
    receipts and fragments of the shards an earlier attempt wrote, and `written` names the
    shared chunks it wrote."""

    def __init__(self, target: StoreTarget, layout, ready, area=None, replayed=None, written: frozenset = frozenset(),
                 spill_dir: str | None = None):
        super().__init__()
        self._target = target
        self._layout = layout
        self._ready = ready
        self._area = area
        self._replayed = replayed
        self._written = written
        self._spill_dir = spill_dir  # local runs: fragments wait there (transforms/shuffle/spill.py)

    def expand(self, shards):
        layout, ready = self._layout, self._ready
        owned = shards | "WriteOwnedChunks" >> beam.ParDo(
            WriteOwnedChunks(self._target, self._area), layout, ready).with_outputs(
                WriteOwnedChunks.FRAGMENTS, main="receipts")
        markers = (
            shards.pipeline
            | "Once" >> beam.Impulse()
            | "WriteEndMarkers" >> beam.ParDo(WriteEndMarkers(self._target), layout, ready)
            .with_outputs(WriteOwnedChunks.FRAGMENTS, main="receipts"))
        fragments = {"Owned": owned.fragments, "Markers": markers.fragments}
        receipts = (owned.receipts, markers.receipts)
        if self._replayed is not None:
            fragments["Replayed"] = self._replayed.fragments
            receipts += (self._replayed.receipts,)
        if self._spill_dir:
            # Spilled where they are made, so that the step fuses with their writer: after the
            # Flatten, the in-process runner would first hold every fragment's tokens in memory.
            fragments = {name: pieces | f"Spill{name}Fragments" >> beam.Map(spill_fragment, self._spill_dir)
                         for name, pieces in fragments.items()}
        shared = (
            tuple(fragments.values())
            | "GatherFragments" >> beam.Flatten()
            | "GroupByChunk" >> beam.GroupByKey()
            | "WriteSharedChunks" >> beam.ParDo(
                WriteSharedChunks(self._target, self._area, self._written), layout, ready))
        return (*receipts, shared)
