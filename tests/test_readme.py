"""The README stays true: its option table matches --help, its commands match .ci/run."""
import argparse
import importlib.util
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.options import OPTIONS, FlatTokensOptions, default_text
from tests.helpers import REPO


def readme():
    return (REPO / "README.md").read_text()


def option_rows() -> dict[str, str]:
    """README's Options table: option -> its default cell (backticks removed)."""
    return {name: cell.replace("`", "").strip()
            for name, cell in re.findall(r"^\| `(--[a-z_]+)` \| ([^|]+) \|", readme(), flags=re.M)}


def test_the_option_table_lists_exactly_the_options_of_run():
    parser = argparse.ArgumentParser()
    FlatTokensOptions._add_argparse_args(parser)
    options = {a.option_strings[0] for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"}
    assert options == {f"--{o.name}" for o in OPTIONS}
    table = set(option_rows())
    assert table == options, f"missing from README: {options - table}; not options: {table - options}"


def test_the_option_table_defaults_are_the_option_tables():
    """Each default cell starts with the default as --help states it: 'required', 'off', 'none', or the value."""
    rows = option_rows()
    for o in OPTIONS:
        cell, expected = rows[f"--{o.name}"], default_text(o)
        assert cell == expected or cell.startswith(expected + " "), f"--{o.name}: README says {cell!r}, default is {expected!r}"


def test_the_option_table_defaults_match_the_parser():
    parser = argparse.ArgumentParser()
    FlatTokensOptions._add_argparse_args(parser)
    rows = option_rows()
    for action in parser._actions:
        name = action.option_strings[0] if action.option_strings else None
        if name not in rows or action.default in (None, False, 0) and not isinstance(action.default, float):
            continue
        assert str(action.default) in rows[name], f"{name}: README says {rows[name]!r}, default is {action.default!r}"


def test_the_readme_commands_are_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(.+?)\n```", readme(), flags=re.S)
    install_and_run, tests = commands[0].strip(), commands[1].strip()
    assert install_and_run in ci
    assert tests in ci


@pytest.mark.slow
def test_the_gs_recipe_runs_as_written(tmp_path):
    """docs/scale.md's 'Trying gs:// locally' block, run by bash. Changed only where this machine
    differs: a free port instead of 4443, and this interpreter's bin/ instead of .venv/bin/."""
    section = (REPO / "docs" / "scale.md").read_text().split("### Trying gs:// locally", 1)[1]
    recipe = re.search(r"```bash\n(.+?)\n```", section, flags=re.S).group(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = recipe.replace("4443", str(port)).replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GCSFS_", "STORAGE_EMULATOR"))}
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", recipe], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:  # the emulator too, when the recipe failed before its own `kill`
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, out + err
    assert "flat-tokens: wrote gs://demo/sample.zarr" in out and "OK: train" in out, out + err
    assert [line for line in err.splitlines() if not line.startswith("progress: ")] == [], err


def test_the_readme_stays_a_first_hour_page():
    """Issue 32: install, run, verify, read, the options and the exit codes; the rest lives in
    docs/. 1,432 lines had buried the quickstart under resume internals and runner tables."""
    lines = readme().count("\n")
    assert lines < 400, f"README.md has {lines} lines: move what a user does not need in the first hour to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    """A page no one can find from the README is a page no one reads."""
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", readme()))
    pages = {page.name for page in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


@pytest.mark.slow  # collects the whole suite in a subprocess
def test_the_fast_subset_is_named_and_covers_every_test_module():
    """Issue 32.5: the README names the fast subset beside the full command, with measured time
    and peak memory, and `-m "not slow"` keeps at least one test of every module (a module
    skipped at import, e.g. torch's where torch is not installed, excepted only then)."""
    text = readme()
    assert '.venv/bin/python -m pytest tests -q -m "not slow"' in text
    assert re.search(r"fast\s+subset covers every test module in [\d.]+ min [\d.]+ s on 2 cores \(peak [\d.]+ GB\)", text)
    assert re.search(r"full suite runs on every core .* it took [\d.]+\s+minutes .* peak [\d.]+ GB", text, flags=re.S)
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-m", "not slow", "--collect-only",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=600)
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    missing = {f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py")} - collected
    for module in sorted(missing):
        skipped_for = re.findall(r'pytest\.importorskip\("(\w+)"\)', (REPO / module).read_text())
        assert skipped_for and all(importlib.util.find_spec(name) is None for name in skipped_for), \
            f"{module} has no test outside `slow`: the fast subset would not cover it"
