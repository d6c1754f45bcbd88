"""Deprecated alias of flat_tokens.loaders, for one release: the trainer's side moved to the
`flat_tokens` package (docs/design.md, "Packages"). Import flat_tokens.loaders instead."""
import sys
import warnings

import flat_tokens.loaders

warnings.warn("pipeline.loaders moved to flat_tokens.loaders; this alias goes in the next release", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = flat_tokens.loaders
