"""The layout of transforms/: one subpackage per stage, imported in the order of the sentence.

A stage may import from the package root and from earlier stages, never from a later one,
and no modules import each other in a circle; graph.py names its steps in sentence order.
"""
import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRANSFORMS = REPO / "transforms"
STAGES = ["read", "tokenize", "shuffle", "write"]  # in the order of the sentence
SENTENCE = [  # (stage, step) as pipeline/graph.py must import them
    ("read", "ReadCorpus"), ("tokenize", "TokenizeBatches"), ("tokenize", "DropDuplicates"),
    ("tokenize", "LimitLengths"), ("shuffle", "WeighSources"), ("shuffle", "ShuffleGlobally"), ("write", "LayOutShards"),
    ("write", "CreateOutput"), ("write", "WriteRejectedLines"), ("write", "CheckRejectedFraction"),
    ("write", "WriteFlatTokens"), ("write", "CommitDataset")]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every `transforms...` module a file imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("transforms")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transforms"):
            for a in node.names:  # `from transforms.read import jsonl` imports a module
                candidate = f"{node.module}.{a.name}"
                is_module = any((REPO / (candidate.replace(".", "/") + suffix)).exists()
                                for suffix in (".py", "/__init__.py"))
                found.add(candidate if is_module else node.module)
    return found


def rank(module: str) -> int:
    """0 for the package root and its modules, else 1 + the stage's place in the sentence."""
    parts = module.split(".")
    return STAGES.index(parts[1]) + 1 if len(parts) > 1 and parts[1] in STAGES else 0


def graph_of_imports() -> dict[str, set[str]]:
    return {module_name(p): imported_modules(p) for p in TRANSFORMS.rglob("*.py")}


def test_every_module_of_transforms_lives_in_a_stage_or_at_the_root():
    for path in TRANSFORMS.rglob("*.py"):
        parts = path.relative_to(TRANSFORMS).parts
        assert len(parts) == 1 or (len(parts) == 2 and parts[0] in STAGES), path


def test_no_stage_imports_a_later_stage():
    late = [(m, i) for m, imports in graph_of_imports().items() for i in imports
            if rank(i) > rank(m) and i != "transforms"]
    assert not late, f"imports of a later stage (or of a stage from the root): {late}"


def test_no_modules_import_each_other_in_a_circle():
    graph = graph_of_imports()
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import circle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for i in graph.get(m, ()):
            if i != m:
                visit(i, path + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])


def test_graph_imports_one_name_per_step_in_the_order_of_the_sentence():
    tree = ast.parse((REPO / "pipeline" / "graph.py").read_text())
    steps = [(node.module.split(".")[1], a.name) for node in tree.body
             if isinstance(node, ast.ImportFrom) and node.module in {f"transforms.{s}" for s in STAGES}
             for a in node.names]
    assert steps == SENTENCE


def test_each_stage_names_its_steps_and_says_what_it_keeps():
    import importlib
    for stage in STAGES:
        package = importlib.import_module(f"transforms.{stage}")
        assert "Keeps:" in package.__doc__, stage
        for name in package.__all__:
            assert getattr(package, name).__module__.startswith(f"transforms.{stage}."), name
    assert {name for stage, name in SENTENCE} <= {
        n for s in STAGES for n in importlib.import_module(f"transforms.{s}").__all__}


def test_the_reader_and_verify_import_no_beam():
    """A trainer's environment has numpy and zarr, not Beam: the stage packages name their
    PTransforms lazily, so importing a plain module of one does not pull Beam in."""
    code = ("import sys; import flat_tokens.reader, flat_tokens.blend, flat_tokens.tools.verify, flat_tokens.tools.inspect, flat_tokens.loaders, "
            "flat_tokens.megatron, flat_tokens.tools.report, flat_tokens.tools.report_html; "
            "print('apache_beam' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
