"""WeighSources (--mixture only): every source's distinct train tokens, summed over the whole
input, become the multipliers that tell the shuffle how many copies of each document to make.

The multipliers need every batch counted, so they are a global combine feeding a singleton
side input, computed exactly (transforms.read.mixture.sampling_plan): the same mixture file
and seed give the same bytes on any runner."""
import apache_beam as beam

from transforms.counts import SumCounts
from transforms.read import mixture as mix
from transforms.read.inputs import input_index
from transforms.records import TokenizedBatch
from transforms.shuffle.shuffle_globally import count_available


def count_source_documents(batch: TokenizedBatch, source_of_input: list[int]) -> dict:
    """The documents a batch read, and how many were empty, credited to its mixture source."""
    source = source_of_input[input_index(batch.file_key)]
    return {mix.source_key(source, mix.DOCUMENTS): int(batch.offsets.size) + batch.empty,
            mix.source_key(source, mix.EMPTY): batch.empty}


def multipliers(counts: dict, mixture: mix.Mixture) -> list[mix.SourceSampling]:
    return mix.sampling_plan(mixture, mix.train_tokens_of(mixture, counts))[1]


class WeighSources(beam.PTransform):
    """Batches -> (the sampling plan as a singleton side input, the counts it came from).

    Sums each source's distinct train tokens over the whole input (a global combine) and
    turns them into multipliers (transforms.read.mixture.sampling_plan), inside the graph."""

    def __init__(self, mixture: mix.Mixture, seed: int, validation_fraction: float, source_of_input: list[int]):
        super().__init__()
        self._mixture = mixture
        self._args = (seed, validation_fraction, source_of_input)

    def expand(self, batches):
        available = batches | "CountAvailable" >> beam.Map(count_available, *self._args)
        plan = (
            available
            | "SumAvailable" >> beam.CombineGlobally(SumCounts())
            | "Multipliers" >> beam.Map(multipliers, self._mixture))
        return beam.pvalue.AsSingleton(plan), available
