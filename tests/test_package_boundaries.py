"""The three sides of the system and what each may import (docs/design.md, "Packages").

- flat_tokens.format, the format's contract: no Beam, nothing of the job (pipeline,
  transforms) and nothing of the trainer's side (the rest of flat_tokens).
- the trainer's side (flat_tokens outside format): no Beam and nothing of the job, so the
  reader-only install (reader/setup.py) holds it whole.
- everywhere: no module imports another module's private (`_name`) name.

Checked on the source (every import at any depth of a module, lazy ones included) and, for
what a trainer's process actually loads, in a fresh interpreter.
"""
import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE = ("flat_tokens", "pipeline", "transforms")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in (REPO / package).rglob("*.py")}


def imports_of(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import statement of a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names], node.lineno))
    return found


def is_format(module: str) -> bool:
    return module == "flat_tokens.format" or module.startswith("flat_tokens.format.")


def is_trainer_side(module: str) -> bool:
    return (module == "flat_tokens" or module.startswith("flat_tokens.")) and not is_format(module)


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_layout_has_the_three_sides():
    assert modules("flat_tokens").keys() >= {"flat_tokens.reader", "flat_tokens.blend", "flat_tokens.format.manifest",
                                             "flat_tokens.format.chunk_checksums", "flat_tokens.tools.verify"}
    assert not (REPO / "transforms" / "write" / "manifest.py").exists() and not (REPO / "pipeline" / "verify.py").exists()


def test_the_old_reader_imports_are_aliases_that_say_where_the_module_went():
    """`from pipeline.reader import FlatTokensSplit` (a trainer's import before the move) still
    works for one release, with a DeprecationWarning, and is the very same module."""
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import pipeline.reader\nexcept DeprecationWarning as w:\n    print(w)\n"
            "warnings.simplefilter('ignore')\n"
            "import flat_tokens.reader, pipeline.blend, flat_tokens.blend\n"
            "from pipeline.reader import FlatTokensSplit\n"
            "print(pipeline.blend is flat_tokens.blend, FlatTokensSplit is flat_tokens.reader.FlatTokensSplit)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["pipeline.reader moved to flat_tokens.reader; this alias goes in the next "
                                           "release", "True True"]


def test_the_format_imports_no_beam_no_job_and_no_trainer_side():
    bad = [(m, imported, line) for m, path in modules("flat_tokens").items() if is_format(m)
           for imported, _, line in imports_of(path)
           if top(imported) in ("apache_beam", "pipeline", "transforms") or is_trainer_side(imported)
           and imported != "flat_tokens"]
    assert not bad, f"the format's modules import outside the format: {bad}"


def test_the_trainer_side_imports_no_beam_and_no_job():
    bad = [(m, imported, line) for m, path in modules("flat_tokens").items() if is_trainer_side(m)
           for imported, _, line in imports_of(path) if top(imported) in ("apache_beam", "pipeline", "transforms")]
    assert not bad, f"the trainer's side imports the job or Beam: {bad}"


def test_no_module_imports_a_private_name_of_another():
    bad = [(m, imported, name, line) for package in CODE for m, path in modules(package).items()
           for imported, names, line in imports_of(path) if top(imported) in CODE
           for name in names if name.startswith("_") and not name.startswith("__")]
    assert not bad, f"imports of another module's private name: {bad}"


def loaded_after(code: str) -> list[str]:
    probe = (f"import sys; {code}; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
             f"('apache_beam', 'pipeline', 'transforms', 'flat_tokens'))))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_importing_the_format_loads_nothing_else():
    names = " ".join(f"import {m};" for m in modules("flat_tokens") if is_format(m))
    loaded = loaded_after(names.rstrip(";"))
    assert loaded and all(m == "flat_tokens" or is_format(m) for m in loaded), loaded


def test_a_trainer_process_loads_no_beam_and_nothing_of_the_job():
    code = ("from flat_tokens import open_dataset, Blend; import flat_tokens.loaders, flat_tokens.megatron, "
            "flat_tokens.tools.verify, flat_tokens.tools.inspect, flat_tokens.tools.report, flat_tokens.tools.cli")
    loaded = loaded_after(code)
    assert "flat_tokens.reader" in loaded and "flat_tokens.blend" in loaded
    assert not [m for m in loaded if top(m) != "flat_tokens"], loaded
