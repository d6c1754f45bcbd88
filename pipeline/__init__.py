"""flat-tokens-beam's job: options, the pipeline graph and the entry points (run, export).

The trainer's side (reader, Blend, verify, inspect, report) is the `flat_tokens` package."""

from flat_tokens import VERSION, __version__  # noqa: F401 (one version for both packages)
