"""Deprecated alias of flat_tokens.blend, for one release: the trainer's side moved to the
`flat_tokens` package (docs/design.md, "Packages"). Import flat_tokens.blend instead."""
import sys
import warnings

import flat_tokens.blend

warnings.warn("pipeline.blend moved to flat_tokens.blend; this alias goes in the next release", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = flat_tokens.blend
