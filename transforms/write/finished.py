"""ReplayFinishedShards: the shards an earlier attempt of the same job wrote, replayed from
their records in the staging area (transforms/staging.py) instead of being shuffled, sorted
and written again.

A shard's record is staged by WriteOwnedChunks once the shard's owned chunks have landed and
the claim was confirmed after them: its size, its receipts, and the fragments of the chunks it
shares with its neighbours. Replaying it gives the layout the shard's size, the commit its
receipts, and the merge step its fragments, exactly as writing it did; the shuffle drops the
shard's documents (ShuffleGlobally's `finished`). Shared chunks that landed are recorded too,
and WriteSharedChunks does not write them again (it still checks that their fragments tile).
"""
import apache_beam as beam

from flat_tokens.format.checksums import Damaged
from transforms.records import ShardSize
from transforms.write.chunk_writers import WriteOwnedChunks

SIZES = "sizes"


class ReplayShardFn(beam.DoFn):
    """A shard record's name -> its receipts (main output), fragments and size (tagged)."""

    def __init__(self, area):
        self._area = area  # transforms.staging.StagingArea

    def process(self, name: str):
        try:
            record, fragments = self._area.read_shard(self._area.job_key, name)
        except (FileNotFoundError, Damaged) as e:  # the launcher checked it: changed since
            what = f"{e.filename or e} is gone" if isinstance(e, FileNotFoundError) else str(e)
            raise RuntimeError(f"shard record {name}: {what}: the staging area changed after the run was "
                               f"launched; rerun the same command: it writes this shard again") from None
        split = record["split"]
        for array, chunks in record["receipts"]:
            yield split, array, chunks
        for fragment in fragments:
            yield beam.pvalue.TaggedOutput(WriteOwnedChunks.FRAGMENTS, fragment)
        # The split's largest id stands for the shard's: the layout takes the maximum, and both
        # belong to the same job.
        yield beam.pvalue.TaggedOutput(SIZES, ShardSize(split, record["shard"], record["tokens"],
                                                        record["sequences"], record["max_token_id"]))


class ReplayFinishedShards(beam.PTransform):
    """Shard record names -> a DoOutputsTuple: `receipts` ((split, array, chunks)), `fragments`
    (as WriteOwnedChunks emits them) and `sizes` (ShardSize, one per shard)."""

    def __init__(self, area, records: list[str]):
        super().__init__()
        self._area = area
        self._records = records

    def expand(self, pbegin):
        return (
            pbegin
            | "ListFinishedShards" >> beam.Create(self._records)
            | "ReplayShards" >> beam.ParDo(ReplayShardFn(self._area))
            .with_outputs(WriteOwnedChunks.FRAGMENTS, SIZES, main="receipts")
        )
