"""flat-tokens-beam: options, the pipeline graph and the entry points (run, verify)."""

__version__ = "0.1.0"
