"""CommitDataset: the last step. Checks that every chunk was written exactly once and that
every document is accounted for, then writes the provenance and the root group metadata."""
from collections import Counter

import apache_beam as beam

from transforms.read import mixture as mix
from transforms.tokenize import dedup_index
from transforms.tokenize.dedup_report import REPORT_ROWS, check_report_rows
from transforms.tokenize.lengths import EXTRA_SEQUENCES, LENGTH_COUNTS, TOO_SHORT
from transforms.write import layout as plan
from transforms.write import zarr_store as store
from transforms.write.zarr_store import SPLITS, StoreTarget, array_length


def dataset_stats(counts: dict, layout: dict) -> dict:
    """The `stats` attribute: every input line and every document accounted for."""
    stats = {
        "lines": counts.get("lines", 0),
        "documents": counts.get("documents", 0),
        "blank": counts.get("blank", 0),
        "rejected": counts.get("rejected", 0),
        "rejected_by_reason": {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("rejected:")},
        "empty": counts.get("empty", 0),
        "duplicates": counts.get("duplicates", 0),
    }
    # --min_tokens, --max_tokens: present when the job limits lengths (transforms/tokenize/lengths.py)
    stats.update({key: counts[key] for key in LENGTH_COUNTS if key in counts})
    if "near_duplicates" in counts:  # --dedup near
        stats["near_duplicates"] = counts["near_duplicates"]
        stats["near_dedup"] = near_dedup_stats(counts)
    index = dedup_index.index_stats(counts)
    if index is not None:  # --dedup exact or near: the dataset's dedup index
        stats["dedup_index"] = index
    for split in SPLITS:
        s = layout[split]
        stats[split] = {"sequences": s.sequences, "tokens": s.tokens, "max_token_id": max(s.max_token_id, 0)}
    return stats


def near_dedup_stats(counts: dict) -> dict:
    """--dedup near: the clusters found and the estimated share of wrong removals."""
    removed = counts.get("near_duplicates", 0)
    expected = counts.get("near_expected_false_positives_micro", 0) / 1e6
    return {
        "clusters": counts.get("near_clusters", 0),  # texts with near-copies, grouped; one kept of each
        "clustered_texts": counts.get("near_clustered_documents", 0),
        "removed": removed,
        "candidate_pairs": counts.get("near_candidate_pairs", 0),
        "verified_pairs": counts.get("near_verified_pairs", 0),  # at the threshold: near-copies
        "linked_pairs": counts.get("near_linked_pairs", 0),  # at threshold - 0.1: kept in one split
        "estimated_false_positive_rate": round(expected / removed, 6) if removed else 0.0,
        "unconverged_edges": counts.get("near_unconverged_edges", 0),
    }


def check_accounts(stats: dict, chunks_written: dict, target: StoreTarget, counts: dict | None = None,
                   mixture: mix.Mixture | None = None) -> None:
    """Raises when a document or a chunk is missing or doubled: the output stays uncommitted.
    Every document read is written (as one sequence, or as pieces: its extra sequences),
    empty, too short or a removed duplicate; with a mixture, every distinct train document
    is written as many times as its copies were counted."""
    if stats["lines"] != stats["documents"] + stats["blank"] + stats["rejected"]:
        raise RuntimeError(f"line accounting failed: {stats['lines']} lines read, but {stats['documents']} "
                           f"documents + {stats['blank']} blank + {stats['rejected']} rejected")
    if mixture is None:
        written = (stats["empty"] + stats["duplicates"] + stats.get("near_duplicates", 0) + stats.get(TOO_SHORT, 0)
                   + stats.get(dedup_index.AGAINST, 0)
                   + sum(stats[s]["sequences"] for s in SPLITS) - stats.get(EXTRA_SEQUENCES, 0))
        if written != stats["documents"]:
            raise RuntimeError(f"document accounting failed: {stats['documents']} documents read, but "
                               f"{written} written (less their extra pieces), empty, too short, duplicates or "
                               f"near-duplicates")
    else:
        check_mixture_accounts(stats, counts, mixture)
    for split in SPLITS:
        for name in target.arrays():
            length = array_length(name, stats[split]["tokens"], stats[split]["sequences"])
            expected = plan.block_count(length, target.write_block(name))
            got = chunks_written.get((split, name), 0)
            if got != expected:
                raise RuntimeError(f"{split}/{name}: {got} chunk writes for {expected} chunks; each chunk must "
                                   f"have exactly one writer. The output is left uncommitted.")


def check_mixture_accounts(stats: dict, counts: dict, mixture: mix.Mixture) -> None:
    """The per-source counts add up, and agree with the arrays' sizes (the layout)."""
    mix.check_source_accounts(mixture, counts)
    n = len(mixture.sources)
    per_source = {what: sum(counts.get(mix.source_key(i, what), 0) for i in range(n)) for what in mix.SOURCE_COUNTS}
    for split in SPLITS:
        for what in ("sequences", "tokens"):
            if per_source[f"{split}_{what}"] != stats[split][what]:
                raise RuntimeError(f"mixture accounting failed: the sources' {split} {what} add up to "
                                   f"{per_source[f'{split}_{what}']}, but the {split} split holds "
                                   f"{stats[split][what]}")
    near = sum(counts.get(mix.source_key(i, mix.NEAR_DUPLICATES), 0) for i in range(n))
    if near != stats.get(mix.NEAR_DUPLICATES, 0):
        raise RuntimeError(f"mixture accounting failed: the sources' near-duplicates add up to {near}, "
                           f"but the input has {stats.get(mix.NEAR_DUPLICATES, 0)}")
    against = sum(counts.get(mix.source_key(i, mix.DEDUP_AGAINST), 0) for i in range(n))
    if against != stats.get(mix.DEDUP_AGAINST, 0):
        raise RuntimeError(f"mixture accounting failed: the sources' texts held by earlier datasets add up to "
                           f"{against}, but the input has {stats.get(mix.DEDUP_AGAINST, 0)}")
    for what in (mix.DOCUMENTS, mix.EMPTY, mix.DUPLICATES, mix.TOO_SHORT, mix.EXTRA_SEQUENCES):
        if per_source[what] != stats.get(what, 0):
            raise RuntimeError(f"mixture accounting failed: the sources' {what} add up to {per_source[what]}, "
                               f"but the input has {stats[what]}")


def chunk_counts(receipts) -> dict:
    """Lists of (split, array, chunks written) receipts -> chunks written per (split, array)."""
    written = Counter()
    for listed in receipts:
        for split, name, chunks in listed:
            written[split, name] += chunks
    return dict(written)


class CommitFn(beam.DoFn):
    """Commits once every writer has reported: its side inputs are the layout, the summed
    counts and one list of chunk receipts per kind of writer. Then the staging area (`area`,
    transforms/staging.py) goes: a committed dataset is never resumed."""

    def __init__(self, target: StoreTarget, provenance: dict, mixture: mix.Mixture | None = None, area=None):
        self._target = target
        self._provenance = provenance
        self._mixture = mixture
        self._area = area

    def process(self, _, layout, counts, *receipts):
        yield self.commit(chunk_counts(receipts), layout, counts)

    def commit(self, chunks_written: dict, layout, counts) -> dict:
        stats = dataset_stats(counts, layout)
        if "near" in stats.get("dedup_index", {}) and "near_dedup" in self._provenance:
            dedup_index.near_index_stats(stats["dedup_index"], self._provenance["near_dedup"])
        if "dedup_against" in self._provenance:  # before the accounts: its removals are among the documents
            stats.update(dedup_index.against_stats(counts, self._provenance["dedup_against"]))
        check_accounts(stats, chunks_written, self._target, counts, self._mixture)
        if "dedup_report" in self._provenance:  # its rows are exactly the removed documents
            stats[REPORT_ROWS] = check_report_rows(stats, counts)
        root = {"format": "flat-tokens", "complete": True, "stats": stats, **self._provenance,
                "storage": self._target.describe()}
        if self._mixture is not None:
            root["mixture"] = mix.report(self._mixture, counts)
            stats["duplicates_by_source"] = {s["name"]: s[mix.DUPLICATES] for s in root["mixture"]["sources"]}
            if "near_duplicates" in stats:
                stats["near_duplicates_by_source"] = {s["name"]: s[mix.NEAR_DUPLICATES]
                                                      for s in root["mixture"]["sources"]}
        splits = {s: {"max_token_id": stats[s]["max_token_id"]} for s in SPLITS}
        store.commit(self._target, root, splits)
        if self._area is not None:
            self._area.remove()
        return stats


class CommitDataset(beam.PTransform):
    """(the writers' receipts, layout, line counts) -> commits the dataset; yields its stats.

    The receipts (a tuple of PCollections of (split, array, chunks written)) reach the
    commit as side inputs, list by list: summing them in a combine first cost the runner
    two more stages, for a few hundred small tuples."""

    def __init__(self, target: StoreTarget, provenance: dict, mixture: mix.Mixture | None = None, area=None):
        super().__init__()
        self._target = target
        self._provenance = provenance
        self._mixture = mixture
        self._area = area

    def expand(self, inputs):
        receipts, layout, counts = inputs
        return (
            layout.pipeline
            | "Once" >> beam.Impulse()
            | "Commit" >> beam.ParDo(CommitFn(self._target, self._provenance, self._mixture, self._area),
                                     beam.pvalue.AsSingleton(layout, default_value=plan.lay_out({}, SPLITS)),
                                     beam.pvalue.AsSingleton(counts),
                                     *[beam.pvalue.AsList(r) for r in receipts])
        )
