"""Deprecated alias of flat_tokens.reader, for one release: the trainer's side moved to the
`flat_tokens` package (docs/design.md, "Packages"). Import flat_tokens.reader instead."""
import sys
import warnings

import flat_tokens.reader

warnings.warn("pipeline.reader moved to flat_tokens.reader; this alias goes in the next release", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = flat_tokens.reader
