"""Deprecated alias of flat_tokens.torch_data, for one release: the trainer's side moved to the
`flat_tokens` package (docs/design.md, "Packages"). Import flat_tokens.torch_data instead."""
import sys
import warnings

import flat_tokens.torch_data

warnings.warn("pipeline.torch_data moved to flat_tokens.torch_data; this alias goes in the next release", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = flat_tokens.torch_data
