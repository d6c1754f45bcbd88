"""The reader's documented snippets (docs/reader.md: several hosts, document masks, blends,
sources; docs/export.md: the Megatron export) run as written, on the datasets the README's
quickstart and docs/mixtures.md's worked example make."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, SAMPLE, run_pipeline

SECTIONS = (("reader.md", "## Several hosts"), ("reader.md", "## Document masks"),
            ("reader.md", "## Train-time blends"), ("reader.md", "## Which source"),
            ("export.md", "# Megatron-LM and NeMo"))


def section(text: str, title: str) -> str:
    """From the heading `title` to the next heading of its level or above outside code blocks
    (a `# comment` line of a snippet is not one), or to the page's end."""
    level = len(title) - len(title.lstrip("#"))
    lines = text[text.index(title):].split("\n")
    fence = False
    for n, line in enumerate(lines[1:], 1):
        fence ^= line.startswith("```")
        if not fence and re.match(rf"#{{1,{level}}} ", line):
            return "\n".join(lines[:n])
    return "\n".join(lines)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """out/sample.zarr (the quickstart) and out/mixed.zarr (the mixture example) in a directory
    that, like the repository root, holds pipeline/sample/."""
    root = tmp_path_factory.mktemp("readme")
    (root / "pipeline").symlink_to(REPO / "pipeline", target_is_directory=True)
    run_pipeline("--input", f"{SAMPLE}/*.jsonl", "--tokenizer", SAMPLE / "tokenizer.json", "--output",
                 root / "out" / "sample.zarr")
    mix = root / "mix.yaml"
    mix.write_text(f"sources:\n  - {{name: one, input: {SAMPLE / 'corpus-1.jsonl'}, weight: 0.7}}\n"
                   f"  - {{name: two, input: {SAMPLE / 'corpus-2.jsonl'}, weight: 0.3, max_epochs: 2}}\n")
    run_pipeline("--mixture", mix, "--dedup", "exact", "--tokenizer", "bytes", "--output", root / "out" / "mixed.zarr")
    return root


@pytest.mark.parametrize("page, title", SECTIONS)
def test_the_snippet_runs(workdir, page, title):
    text = section((REPO / "docs" / page).read_text(encoding="utf-8"), title)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    blocks = re.findall(r"```(python|bash)\n(.*?)```", text, re.S)
    assert blocks, title
    for kind, code in blocks:
        if kind == "python":
            cmd = [sys.executable, "-c", code]
        else:
            assert code.startswith("flat-tokens "), code
            cmd = [sys.executable, "-m", "pipeline.cli", *code.split()[1:]]
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{title}:\n{code}\n{proc.stderr[-3000:]}"
