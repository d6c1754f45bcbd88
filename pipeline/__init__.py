"""flat-tokens-beam: options, the pipeline graph and the entry points (run, verify)."""

__version__ = "0.1.0"
VERSION = f"flat-tokens-beam {__version__}"  # what --version prints
