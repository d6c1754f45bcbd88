"""Counts travel through the data as dicts (a retried bundle's counts are never added twice,
as they would be through metrics), and are summed by one global combine."""
from collections import Counter

import apache_beam as beam


class SumCounts(beam.CombineFn):
    """Dicts of counts -> their sum, key by key."""

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
