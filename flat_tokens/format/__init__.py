"""The flat-tokens format's contract, imported by the pipeline that writes a dataset and by
every reader of one, so the two agree by construction (docs/design.md, docs/integrity.md).

What a dataset is: its names and layout (own_names, chunk_objects, object_trees), what each
object's bytes must be (checksums, chunk_checksums, array_metadata, manifest), the dedup
index and report files beside it (index_files, report_files), and how its objects are read
back from a store (storage_faults, gcs). It imports neither Beam nor the job nor the reader.
"""
