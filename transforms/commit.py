"""CommitDataset: the last step. Checks that every chunk was written exactly once and that
every document is accounted for, then writes the provenance and the root group metadata."""
from collections import Counter

import apache_beam as beam

from transforms import layout as plan
from transforms import zarr_store as store
from transforms.zarr_store import SEQ_STARTS, SPLITS, TOKENS, StoreTarget


class SumCounts(beam.CombineFn):
    """Dicts of counts -> their sum, key by key (line counts; chunk receipts)."""

    def create_accumulator(self):
        return Counter()

    def add_input(self, acc, counts):
        acc.update(counts)
        return acc

    def merge_accumulators(self, accs):
        total = Counter()
        for acc in accs:
            total.update(acc)
        return total

    def extract_output(self, acc):
        return dict(acc)


def dataset_stats(counts: dict, layout: dict) -> dict:
    """The `stats` attribute: every input line and every document accounted for."""
    stats = {
        "lines": counts.get("lines", 0),
        "documents": counts.get("documents", 0),
        "blank": counts.get("blank", 0),
        "rejected": counts.get("rejected", 0),
        "rejected_by_reason": {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("rejected:")},
        "empty": counts.get("empty", 0),
    }
    for split in SPLITS:
        s = layout[split]
        stats[split] = {"sequences": s.sequences, "tokens": s.tokens, "max_token_id": max(s.max_token_id, 0)}
    return stats


def check_accounts(stats: dict, chunks_written: dict, target: StoreTarget) -> None:
    """Raises when a document or a chunk is missing or doubled: the output stays uncommitted."""
    if stats["lines"] != stats["documents"] + stats["blank"] + stats["rejected"]:
        raise RuntimeError(f"line accounting failed: {stats['lines']} lines read, but {stats['documents']} "
                           f"documents + {stats['blank']} blank + {stats['rejected']} rejected")
    written = stats["empty"] + sum(stats[s]["sequences"] for s in SPLITS)
    if written != stats["documents"]:
        raise RuntimeError(f"document accounting failed: {stats['documents']} documents read, but "
                           f"{written} written or empty")
    for split in SPLITS:
        for name, length in ((TOKENS, stats[split]["tokens"]), (SEQ_STARTS, stats[split]["sequences"] + 1)):
            expected = plan.block_count(length, target.write_block(name))
            got = chunks_written.get((split, name), 0)
            if got != expected:
                raise RuntimeError(f"{split}/{name}: {got} chunk writes for {expected} chunks; each chunk must "
                                   f"have exactly one writer. The output is left uncommitted.")


class CommitFn(beam.DoFn):
    def __init__(self, target: StoreTarget, provenance: dict):
        self._target = target
        self._provenance = provenance

    def process(self, _, chunks_written, layout, counts):
        stats = dataset_stats(counts, layout)
        check_accounts(stats, chunks_written, self._target)
        root = {"format": "flat-tokens", "complete": True, "stats": stats, **self._provenance,
                "storage": self._target.describe()}
        splits = {s: {"max_token_id": stats[s]["max_token_id"]} for s in SPLITS}
        store.commit(self._target, root, splits)
        yield stats


class CommitDataset(beam.PTransform):
    """(chunk counts, layout side input, line counts) -> commits the dataset; yields its stats."""

    def __init__(self, target: StoreTarget, provenance: dict):
        super().__init__()
        self._target = target
        self._provenance = provenance

    def expand(self, inputs):
        chunks_written, layout, counts = inputs
        return (
            chunks_written.pipeline
            | "Once" >> beam.Impulse()
            | "Commit" >> beam.ParDo(CommitFn(self._target, self._provenance),
                                     beam.pvalue.AsSingleton(chunks_written),
                                     beam.pvalue.AsSingleton(layout, default_value=plan.lay_out({}, SPLITS)),
                                     beam.pvalue.AsSingleton(counts))
        )
