"""PTransforms and DoFns of flat-tokens-beam, each over pure functions in the same package."""
