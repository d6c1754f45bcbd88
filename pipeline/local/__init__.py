"""Running the job on one machine: the worker processes of a local run (forked_workers,
worker, worker_guard), how many (parallelism), their memory (allocator, write_memory), where
they run (environment) and their temporary directories (scratch)."""
