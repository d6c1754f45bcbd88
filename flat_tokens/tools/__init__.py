"""The commands that read a dataset, in the reader-only install too: verify, inspect, report
(and the console script's reading half, cli)."""
