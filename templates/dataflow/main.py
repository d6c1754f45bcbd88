"""Dataflow Flex Template launcher: the file that FLEX_TEMPLATE_PYTHON_PY_FILE names.

The Flex Template launcher runs `python main.py --name=value ...`, one `--name=value` per
template parameter (see metadata.json) plus Dataflow's own pipeline options (--runner,
--project, --region, --temp_location, --setup_file, --sdk_container_image, ...). This file
adapts that calling convention to `pipeline.run.main()` and returns its exit code:

* a boolean option of FlatTokensOptions (`--overwrite`) arrives as `--overwrite=true` or
  `--overwrite=false`; argparse's store_true flags accept neither, so `true` becomes the bare
  flag and `false` drops it (any other value is passed on and fails as a usage error, exit 2);
* an option of FlatTokensOptions given with an empty value (`--validation_input=`, what a
  console form sends for an optional field left blank) is dropped, i.e. left at its default.

Everything else passes through unchanged. Exit codes are those of pipeline.run: 0 success,
1 the pipeline failed, 2 usage/configuration error (including: the output exists and is not
empty and overwrite is not true).

It runs unchanged on any runner, e.g. locally:
    python templates/dataflow/main.py --input=pipeline/sample/corpus-1.jsonl \
        --tokenizer=pipeline/sample/tokenizer.json --output=/tmp/x.zarr --overwrite=true
"""
import argparse
import logging
import sys
from pathlib import Path

# From a source checkout (tests, local tries) the repository root is two levels up; in the
# template image the package is pip-installed and this path does not exist.
_PARENTS = Path(__file__).resolve().parents
if len(_PARENTS) > 2 and (_PARENTS[2] / "pipeline" / "run.py").is_file() and str(_PARENTS[2]) not in sys.path:
    sys.path.insert(0, str(_PARENTS[2]))

TRUE = ("true", "1", "yes")
FALSE = ("false", "0", "no")


def _job_actions() -> list[argparse.Action]:
    from pipeline.options import FlatTokensOptions

    parser = argparse.ArgumentParser(add_help=False)
    FlatTokensOptions._add_argparse_args(parser)
    return [a for a in parser._actions if a.option_strings]


def template_argv(argv: list[str]) -> list[str]:
    """Template-style `--name=value` arguments -> what pipeline.run.main() parses."""
    actions = _job_actions()
    flags = {s for a in actions if isinstance(a, argparse._StoreTrueAction) for s in a.option_strings}
    job_options = {s for a in actions for s in a.option_strings}
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name in flags:
            if value.strip().lower() in TRUE:
                out.append(name)
                continue
            if value.strip().lower() in FALSE or not value.strip():
                continue
        elif eq and name in job_options and not value:
            continue
        out.append(arg)
    return out


def main(argv=None) -> int:
    from pipeline import run

    argv = list(sys.argv[1:] if argv is None else argv)
    return run.main(template_argv(argv))


if __name__ == "__main__":
    # INFO: on Dataflow the launcher's log (job id, console URL, our errors) is what the
    # user sees when a launch fails.
    logging.getLogger().setLevel(logging.INFO)
    sys.exit(main())
