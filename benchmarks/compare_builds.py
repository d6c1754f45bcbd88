"""Builds the same datasets with the code of two git revisions and says whether they are
byte-identical: the check that a refactor (issue 40 moved every module) changed no byte.

    python benchmarks/compare_builds.py --before 37c3fe4            # that commit vs the working tree
    python benchmarks/compare_builds.py --before main --after HEAD

Each revision is checked out into a temporary git worktree and run there as a module
(`python -m pipeline.run`, the revision's own code first on sys.path), on the bundled sample
with a few configurations (zarr 2 and 3, shards, --dedup near, --record_sources). Every file
of the two outputs is compared byte for byte, except what names the run itself: the run id
(in the root and split attributes, and the claim `.flat-tokens-run.1`), the output's own path
(`rejected_output`), and what seals those (the manifest's and the seal's entries for the
attribute files). Prints one line per configuration and exits 1 on any difference.
Standalone: it imports nothing of the project.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {
    "zarr2": [],
    "zarr3-shards-near-sources": ["--zarr_format", "3", "--chunks_per_shard", "4", "--dedup", "near",
                                  "--record_sources"],
    "exact-validation": ["--dedup", "exact", "--validation_fraction", "0.2"],
}
RUN_NAMED = {"run_id", "flat_tokens_run", "rejected_output", "manifest"}  # attributes that name the run or seal them


def checkout(rev: str, into: Path) -> Path:
    if rev == "WORKTREE":
        return REPO
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), rev], check=True)
    return into


def build(code: Path, out: Path, extra: list) -> float:
    sample = REPO / "pipeline" / "sample"
    cmd = [sys.executable, "-m", "pipeline.run", "--input", str(sample / "*.jsonl"), "--tokenizer",
           str(sample / "tokenizer.json"), "--output", str(out), "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": str(code)}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        sys.exit(f"{code}: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t


def without_run_names(value):
    if isinstance(value, dict):
        return {k: without_run_names(v) for k, v in value.items() if k not in RUN_NAMED}
    if isinstance(value, list):
        return [without_run_names(v) for v in value]
    return value


def attribute_file(name: str) -> bool:
    return name.endswith((".zattrs", "zarr.json"))


def comparable(path: Path, relative: str):
    """The file's bytes, or for files that name the run, their JSON without those names."""
    data = path.read_bytes()
    if relative.startswith(".flat-tokens-run."):
        return "claim"  # holds the run id, host and time by design
    if attribute_file(relative):
        return without_run_names(json.loads(data))
    if relative == "flat-tokens-manifest.json":
        manifest = json.loads(data)
        manifest["objects"] = {k: v for k, v in manifest["objects"].items() if not attribute_file(k)}
        return without_run_names(manifest)
    return data


def differences(a: Path, b: Path) -> list[str]:
    files_a = {str(p.relative_to(a)) for p in a.rglob("*") if p.is_file()}
    files_b = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}
    found = [f"only in before: {n}" for n in sorted(files_a - files_b)]
    found += [f"only in after: {n}" for n in sorted(files_b - files_a)]
    found += [f"differs: {n}" for n in sorted(files_a & files_b) if comparable(a / n, n) != comparable(b / n, n)]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a git revision")
    ap.add_argument("--after", default="WORKTREE", help="a git revision (default: the working tree)")
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {}
        try:
            for side, rev in (("before", args.before), ("after", args.after)):
                trees[side] = checkout(rev, tmp / f"code-{side}")
            for name, extra in CONFIGS.items():
                seconds = {side: build(code, tmp / side / f"{name}.zarr", extra) for side, code in trees.items()}
                diff = differences(tmp / "before" / f"{name}.zarr", tmp / "after" / f"{name}.zarr")
                files = sum(1 for p in (tmp / "after" / f"{name}.zarr").rglob("*") if p.is_file())
                failed |= bool(diff)
                print(f"{name}: {'IDENTICAL' if not diff else 'DIFFERENT'} ({files} files; build "
                      f"{seconds['before']:.1f} s before, {seconds['after']:.1f} s after)")
                for line in diff[:20]:
                    print(f"  {line}")
        finally:
            for side, code in trees.items():
                if code != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)], check=False)
    print(f"{args.before} vs {args.after}: {'FAIL' if failed else 'PASS'} (byte-identical datasets)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
