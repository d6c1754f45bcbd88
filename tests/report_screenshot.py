"""Regenerates docs/report-sample.png: the top of the bundled sample's report, in headless Chromium.

    .venv/bin/python -m tests.report_screenshot [--out docs/report-sample.png] [--height 2000]

The sample: pipeline/sample's two files as two mixture sources (as docs/mixtures.md's worked
example, with its own tokenizer and --dedup near), written to a temporary folder, then
`flat-tokens report` with the run's summary. Needs Chromium (apt-get install chromium).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import chromium

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "pipeline" / "sample"
WIDTH = 1100


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "report-sample.png"))
    ap.add_argument("--height", type=int, default=2000, help="pixels from the top of the page")
    args = ap.parse_args(argv)
    if chromium.unusable_reason():
        print(f"report_screenshot: {chromium.unusable_reason()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("corpus-1.jsonl", "corpus-2.jsonl", "tokenizer.json"):  # short paths on the page
            shutil.copy(SAMPLE / name, tmp)
        mix = Path(tmp, "mix.yaml")
        mix.write_text("sources:\n  - {name: one, input: corpus-1.jsonl, weight: 0.7}\n"
                       "  - {name: two, input: corpus-2.jsonl, weight: 0.3, max_epochs: 2}\n")
        html = Path(tmp, "report.html")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "pipeline.run", "--mixture", "mix.yaml", "--dedup", "near",
                        "--tokenizer", "tokenizer.json", "--output", "sample.zarr", "--quiet",
                        "--summary_json", "summary.json"], check=True, env=env, cwd=tmp)
        subprocess.run([sys.executable, "-m", "flat_tokens.tools.report", "sample.zarr", "--html", str(html),
                        "--summary", "summary.json", "--window", "512"], check=True, env=env, cwd=tmp)
        with chromium.Chromium() as browser:
            page = browser.open(html.as_uri(), width=WIDTH, height=args.height)
            page.screenshot(args.out, WIDTH, args.height)
    print(f"report_screenshot: wrote {args.out} ({os.path.getsize(args.out) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
