"""CreateOutput: the one step that claims the output, replaces what --overwrite allows, and
creates every array at its final shape before any writer starts; or, resuming an unfinished
output of the same job, keeps the arrays and the chunks already written."""
import apache_beam as beam

from transforms.write import ownership, rejected
from transforms.write import zarr_store as store
from transforms.write.zarr_store import SPLITS, StoreTarget


class OutputChanged(RuntimeError):
    """What the launcher planned to reuse at the output is no longer there."""


class CreateOutput(beam.DoFn):
    """Runs once: claims the output for this run and removes what it replaces (or refuses:
    see transforms/write/ownership.py), clears the replaced runs' rejected-line reports, and
    creates both splits' arrays at their final shapes.

    `expected_owner`: the (claim generation, run id, committed) the launcher found at the
    output; `resumable`: it found no committed dataset there, so an unfinished output may be
    taken. `area` (transforms.staging.StagingArea): where written chunks are recorded for a
    rerun. `keep_arrays`: the launcher found arrays of this very job there
    (transforms/staging.py, `arrays.json`); they and their chunks stay, and the records of
    those chunks count. Else the records are forgotten before anything is deleted, and the new
    arrays are marked as this job's once created. `also_ours`: top-level files this run
    writes at the output itself (its --summary_json), which a replaced dataset may hold.
    `rewrite`: chunk objects (paths under the output) of kept arrays that the launcher found
    damaged (pipeline/resume.py): deleted here, fenced, as this run's own, so that the writers
    create them again."""

    def __init__(self, target: StoreTarget, overwrite: bool, rejected_url: str,
                 expected_owner: tuple = (0, "", False), area=None, keep_arrays: bool = False,
                 resumable: bool = False, also_ours: tuple = (), rewrite: tuple = ()):
        self._target = target
        self._also_ours = tuple(also_ours)
        self._resumable = resumable
        self._overwrite = overwrite
        self._rejected_url = rejected_url
        self._expected_owner = tuple(expected_owner)
        self._area = area
        self._keep_arrays = keep_arrays
        self._rewrite = tuple(rewrite)

    def process(self, _, layout):
        t, area = self._target, self._area
        before_removing = None
        if self._keep_arrays:
            before_removing = self._check_still_this_jobs
        elif area is not None:
            before_removing = area.forget_arrays
        replaced = store.prepare_output(t, self._overwrite, self._expected_owner, keep_splits=self._keep_arrays,
                                        before_removing=before_removing, resumable=self._resumable,
                                        also_ours=self._also_ours)
        rejected.clear_reports(self._rejected_url, replaced, t.storage_options)
        with ownership.fenced(t.url, t.run_id, "its arrays", t.storage_options):
            for split in SPLITS:
                make = store.keep_split if self._keep_arrays else store.create_split
                make(t, split, layout[split].tokens, layout[split].sequences)
            if area is not None and not self._keep_arrays:
                area.mark_arrays()
        yield True

    def _check_still_this_jobs(self):
        """The arrays the launcher planned to keep are still this job's, and no other run may have
        written into them (a conflict record): checked with the claim held, before deleting."""
        t = self._target
        found = self._area.arrays_key()
        conflicts = ownership.conflicts(t.url, t.storage_options)
        if found != self._area.job_key or conflicts:
            why = f"conflict records {ownership.listing(conflicts)}" if conflicts else "another job's arrays"
            raise OutputChanged(f"--output {t.url}: the launcher planned to resume the chunks written there, but it "
                                f"now holds {why}; nothing was deleted. Rerun to start from what is there now")
        if self._rewrite:
            # Writes are create-only: a damaged chunk goes before its shard writes it again.
            fs, path = store.filesystem(t.url, t.storage_options)
            with ownership.fenced(t.url, t.run_id, f"the deletion of {len(self._rewrite)} damaged chunks",
                                  t.storage_options):
                for relative in self._rewrite:
                    try:
                        fs.rm(f"{path.rstrip('/')}/{relative}")
                    except FileNotFoundError:  # gone already (a retry of this step, or it was missing)
                        pass
