"""Deprecated alias of flat_tokens.jax_data, for one release: the trainer's side moved to the
`flat_tokens` package (docs/design.md, "Packages"). Import flat_tokens.jax_data instead."""
import sys
import warnings

import flat_tokens.jax_data

warnings.warn("pipeline.jax_data moved to flat_tokens.jax_data; this alias goes in the next release", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = flat_tokens.jax_data
