"""CreateOutput: the one step that claims the output, replaces what --overwrite allows, and
creates every array at its final shape before any writer starts."""
import apache_beam as beam

from transforms.write import ownership, rejected
from transforms.write import zarr_store as store
from transforms.write.zarr_store import SPLITS, StoreTarget


class CreateOutput(beam.DoFn):
    """Runs once: claims the output for this run and removes what it replaces (or refuses:
    see transforms/write/ownership.py), clears the replaced runs' rejected-line reports, and
    creates both splits' arrays at their final shapes.

    `expected_owner`: the (claim generation, run id, committed) the launcher found at the output."""

    def __init__(self, target: StoreTarget, overwrite: bool, rejected_url: str,
                 expected_owner: tuple = (0, "", False)):
        self._target = target
        self._overwrite = overwrite
        self._rejected_url = rejected_url
        self._expected_owner = tuple(expected_owner)

    def process(self, _, layout):
        replaced = store.prepare_output(self._target, self._overwrite, self._expected_owner)
        rejected.clear_reports(self._rejected_url, replaced, self._target.storage_options)
        t = self._target
        with ownership.fenced(t.url, t.run_id, "its arrays", t.storage_options):
            for split in SPLITS:
                store.create_split(t, split, layout[split].tokens, layout[split].sequences)
        yield True
