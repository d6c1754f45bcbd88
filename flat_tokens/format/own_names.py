"""The exact names this tool writes for itself beside a dataset's own entries.

At an output's top level a run writes, besides the root metadata and the splits: its claim
`.flat-tokens-run.<generation>`, leases `.flat-tokens-writing.<run id>.<uuid>`, conflict
records `.flat-tokens-conflict.<run id>` (transforms/write/ownership.py), the staging area
`.flat-tokens-staging` (transforms/staging.py), and a rejected-lines directory's probe
`.flat-tokens-write-check-<run id>` (transforms/write/rejected.py); a create-only write puts
each under a temporary name `<name>.<uuid>.partial` first (transforms/create_only.py). Scratch
directories hold an owner record `.flat-tokens-owner` (pipeline/local/scratch.py).

Those names, and only those, are "ours": `--overwrite` deletes them and input listings treat a
directory holding one as this tool's output. A name that merely starts with `.flat-tokens-`
(a user's `.flat-tokens-notes.txt`, a directory `.flat-tokens-mine/`) is the user's: it is
neither deleted nor a reason to skip what sits beside it. Pure; imports nothing of the project.
"""
import re

# A run id: the 32 hex digits of a uuid4 by default; tests and resumed runs may pass others.
_RUN_ID = r"[A-Za-z0-9][A-Za-z0-9_-]*"
_UUID = r"[0-9a-f]+"  # uuid4().hex; any hex digits
OWN_NAME = re.compile(
    r"(?:\.flat-tokens-run\.[0-9]+"
    rf"|\.flat-tokens-writing\.{_RUN_ID}\.{_UUID}"
    rf"|\.flat-tokens-conflict\.{_RUN_ID}"
    r"|\.flat-tokens-staging"
    rf"|\.flat-tokens-write-check-{_RUN_ID}"
    r"|\.flat-tokens-owner)"
    rf"(?:\.{_UUID}\.partial)?")


def is_own_name(name: str) -> bool:
    """Whether `name` (one path component, no "/") is exactly a name this tool writes for itself."""
    return OWN_NAME.fullmatch(name) is not None
