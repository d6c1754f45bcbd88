"""The pipeline graph, as one sentence per step:

    read the corpus -> tokenize it -> [drop duplicate texts] -> [limit document lengths] -> [weigh sources: count each
    source's train tokens, turn them into multipliers] -> shuffle it globally (making a
    mixture's copies) -> lay the shards out -> create the output -> report rejected lines
    -> check the rejected fraction -> write the flat-tokens arrays -> commit the dataset.

The bracketed steps run with --dedup (exact or near: near-copies are found inside the
dedup step, transforms/tokenize/near_dedup.py), --min_tokens or --max_tokens, and --mixture
only; without them the graph is the plain one. With --dedup, the kept texts' digests are also
written as the dataset's dedup index (with near, each text's band keys and sketch too:
transforms/tokenize/near_index.py), and --dedup_against joins earlier datasets' indexes into
the dedup step (transforms/tokenize/dedup_index.py). Each step comes from the stage package named
in its import, in the order of the sentence (the map: docs/design.md).

`build_pipeline` only wires transforms; pipeline/plan.py turns options into the JobPlan it
wires (listing files and loading the tokenizer there, so bad options fail before any
worker starts). With a staging area (pipeline/resume.py, transforms/staging.py) the same
sentence also keeps its work there: each input unit read and tokenized, each shard and
shared chunk written; what an earlier attempt of the job kept is replayed instead of redone.
"""
import apache_beam as beam

from transforms.read import ReadCorpus
from transforms.tokenize import TokenizeBatches
from transforms.tokenize import DropDuplicates
from transforms.tokenize import LimitLengths
from transforms.shuffle import WeighSources
from transforms.shuffle import ShuffleGlobally
from transforms.write import LayOutShards
from transforms.write import CreateOutput
from transforms.write import WriteRejectedLines
from transforms.write import CheckRejectedFraction
from transforms.write import WriteFlatTokens
from transforms.write import CommitDataset

from pipeline.plan import JobPlan
from transforms.counts import SumCounts
from transforms.progress import show_counts
from transforms.read.corpus import Corpus
from transforms.records import TokenizedBatch
from transforms.staging import StagingArea
from transforms.shuffle.shuffle_globally import count_copies
from transforms.shuffle.weigh_sources import count_source_documents
from transforms.tokenize.dedup_index import WriteIndexShard, read_earlier
from transforms.tokenize.near_index import read_earlier_near
from transforms.tokenize.dedup_report import WriteDedupReport, earlier_key
from transforms.tokenize.staged import ReplayStagedUnits, TokenizeAndStage
from transforms.tokenize.shingle_sets import ExactShingles
from transforms.write.finished import SIZES, ReplayFinishedShards


def build_pipeline(p: beam.Pipeline, plan: JobPlan):
    """Wires the job; returns the PCollection of the committed dataset's stats."""
    so = plan.target.storage_options
    singleton = beam.pvalue.AsSingleton
    resume = plan.resume
    area = resume.area if resume else None
    ranges, row_groups = plan.read_ranges(), plan.row_groups
    if resume:
        ranges, row_groups = resume.unread(ranges), resume.unread(row_groups)
    corpus = p | "ReadCorpus" >> ReadCorpus(
        ranges, row_groups, plan.text_key,
        batch_documents=plan.batch_documents, storage_options=so, progress_dir=plan.progress_dir, staging=area)
    digests = plan.dedup_shards is not None
    signatures = plan.near[0] if plan.near else None
    # Worker processes of a machine share their near features in a file; one process keeps them in memory.
    memo_dir = plan.spill_dir if plan.local_processes > 1 else None
    tokenize = (TokenizeAndStage(plan.tokenizer, area, so, plan.progress_dir, digests, signatures, memo_dir) if area
                else TokenizeBatches(plan.tokenizer, so, plan.progress_dir, digests, signatures, memo_dir))
    tokenized = corpus.documents | "Tokenize" >> beam.ParDo(tokenize).with_output_types(TokenizedBatch)
    if resume and resume.units:
        staged = p | "ReplayStagedUnits" >> ReplayStagedUnits(area, resume.units, plan.progress_dir)
        tokenized = (tokenized, staged.batches) | "WithStagedBatches" >> beam.Flatten()
        corpus = Corpus(corpus.documents, *(
            (getattr(corpus, tag), staged[tag]) | f"WithStaged_{tag}" >> beam.Flatten()
            for tag in ("rejected", "line_counts", "counts")))
    counted = [corpus.counts, tokenized | "CountEmpty" >> beam.Map(lambda b: {"empty": b.empty})]
    batches = tokenized
    distinct = None
    if plan.dedup_shards is not None:
        earlier = None
        if plan.dedup_against:  # one element per earlier index file: read where it is keyed, never gathered
            earlier = (p | "EarlierIndexFiles" >> beam.Create(plan.earlier_index)
                       | "SpreadIndexFiles" >> beam.Reshuffle()
                       | "ReadEarlierIndexes" >> beam.FlatMap(read_earlier, plan.seed, plan.dedup_shards, so))
        earlier_near = None
        if plan.dedup_against and plan.near:  # their near files, with their exact files: keyed by band shard
            earlier_near = (p | "EarlierNearFiles" >> beam.Create(plan.earlier_near)
                            | "SpreadNearFiles" >> beam.Reshuffle()
                            | "ReadEarlierNear" >> beam.FlatMap(read_earlier_near, plan.dedup_shards, so))
        distinct = tokenized | "DropDuplicates" >> DropDuplicates(
            plan.seed, plan.validation_fraction, plan.dedup_shards,
            plan.source_of_input if plan.mixture is not None else plan.record_sources, plan.near, plan.spill_dir,
            report=plan.dedup_report is not None, earlier=earlier, earlier_near=earlier_near,
            shingles=ExactShingles(plan.near[0], plan.tokenizer, so) if plan.near else None)
        batches = distinct.batches
        counted.append(distinct.counts)
    if plan.length_limits.active():
        limited = batches | "LimitLengths" >> LimitLengths(
            plan.length_limits, plan.source_of_input if plan.mixture is not None else None)
        batches = limited.batches
        counted.append(limited.counts)
    sampling = None
    if plan.mixture is not None:
        sampling, source_counts = batches | "WeighSources" >> WeighSources(
            plan.mixture, plan.seed, plan.validation_fraction, plan.source_of_input)
        counted += [tokenized | "CountSourceDocuments" >> beam.Map(count_source_documents, plan.source_of_input),
                    source_counts]
    shards, sizes = batches | "ShuffleGlobally" >> ShuffleGlobally(
        plan.seed, plan.validation_fraction, plan.num_shards, sampling, plan.source_of_input, plan.spill_dir,
        plan.record_sources, resume.finished if resume else frozenset())
    written = None
    if resume and resume.shards:
        written = p | "ReplayFinishedShards" >> ReplayFinishedShards(area, resume.shards)
        sizes = (sizes, written[SIZES]) | "WithFinishedShards" >> beam.Flatten()
    if sampling is not None:
        counted.append(batches | "CountCopies" >> beam.Map(
            count_copies, plan.seed, plan.validation_fraction, plan.source_of_input, sampling))
    # Combines without defaults and one Impulse per "once": a CombineGlobally's default adds
    # five transforms and a Create four, which Beam builds, translates and runs even for
    # tiny inputs. Counts are never empty (every input range reports its counts); an input
    # without documents has no shard sizes, and lays out no shards.
    layout = sizes | "LayOutShards" >> beam.CombineGlobally(LayOutShards()).without_defaults()
    layout_view = singleton(layout, default_value=LayOutShards.no_shards())
    counts = (
        tuple(counted)
        | "GatherCounts" >> beam.Flatten()
        | "ShowCounts" >> beam.Map(show_counts)  # Beam counters: what a cluster shows while it runs
        | "SumCounts" >> beam.CombineGlobally(SumCounts()).without_defaults()
    )
    created = (
        p
        | "Once" >> beam.Impulse()
        | "CreateOutput" >> beam.ParDo(
            CreateOutput(plan.target, plan.overwrite, plan.rejected_url, plan.expected_owner, area,
                         keep_arrays=bool(resume and resume.keep_arrays),
                         resumable=plan.take_unfinished, also_ours=plan.also_ours,
                         rewrite=resume.rewrite if resume else ()), layout_view))
    if distinct is not None and distinct.report is not None:  # written once the output is ours, counted at commit
        counts_of_report = distinct.report | "ReportDuplicates" >> WriteDedupReport(
            plan.dedup_report, plan.target.run_id, plan.dedup_shards,
            {f.key: f.url for f in plan.files} | {earlier_key(i): url for i, url in enumerate(plan.dedup_against)},
            singleton(created), so)
        counts = ((counts, counts_of_report) | "WithReportCounts" >> beam.Flatten()
                  | "SumReportCounts" >> beam.CombineGlobally(SumCounts()).without_defaults())
    if distinct is not None:  # the dataset's dedup index: written once the output is ours, counted at commit
        counts_of_index = distinct.index | "WriteDedupIndex" >> beam.ParDo(
            WriteIndexShard(plan.target.url, plan.seed, plan.dedup_shards, so), singleton(created))
        counts = ((counts, counts_of_index) | "WithIndexCounts" >> beam.Flatten()
                  | "SumIndexCounts" >> beam.CombineGlobally(SumCounts()).without_defaults())
    reports = corpus.rejected | "ReportRejectedLines" >> WriteRejectedLines(
        plan.rejected_url, beam.pvalue.AsList(corpus.line_counts), singleton(created), so, plan.target.run_id)
    ready = counts | "CheckRejectedFraction" >> beam.ParDo(
        CheckRejectedFraction(plan.max_rejected_fraction, plan.rejected_url),
        beam.pvalue.AsList(reports), singleton(created))
    receipts = shards | "WriteFlatTokens" >> WriteFlatTokens(
        plan.target, layout_view, singleton(ready), area, written, resume.chunks if resume else frozenset(),
        plan.spill_dir)
    # The commit removes the staging area: with --no_staging it holds the command's record only.
    return (receipts, layout, counts) | "CommitDataset" >> CommitDataset(
        plan.target, plan.provenance, plan.mixture, area or StagingArea(plan.target.url, so))
