"""`flat-tokens report`: the dataset's self-contained HTML page, rendered in a real, headless
Chromium (Debian's package; .ci/run installs it) and checked from the rendered page."""
import html as markup
import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from tokenizers import Tokenizer

from flat_tokens.reader import open_dataset
from flat_tokens.tools.report import spread
from tests import chromium
from tests.conftest import sample_texts
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 (a fixture)
from tests.helpers import REPO, run_pipeline, write_jsonl



@pytest.fixture
def browser_ok():
    """The browser tests skip, saying why, where Chromium is missing or does not start."""
    reason = chromium.unusable_reason()
    if reason:
        pytest.skip(f"{reason}: the report's browser tests render the page in it")


needs_chromium = pytest.mark.usefixtures("browser_ok")

SECTIONS = ("provenance", "splits", "mixture", "dedup", "rejected", "tokens", "documents", "window", "sample")
HOSTILE = ['<script>window.__pwned = 1; console.error("ran")</script> after the script',
           '<img src=x onerror="window.__pwned = 2"> an image that must stay text',
           'entities stay as written: &amp; &lt;b&gt; &#60;i&#62; &quot; and a closing </pre></section></main>',
           '<style>body{display:none}</style><iframe src="https://example.com"></iframe> <!-- a comment']


def report(dataset, html, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flat_tokens.tools.report", str(dataset), "--html", str(html), *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def mixture_dataset(tmp_path_factory, bpe_tokenizer):
    """Real text (stdlib docstrings) as two weighted sources, with exact copies, near-copies and
    rejected lines, built with --dedup near; and its run summary."""
    root = tmp_path_factory.mktemp("report")
    texts = [t for t in sample_texts() if len(t.split()) >= 12]
    web, code = texts[:260], texts[260:520]
    write_jsonl(root / "web.jsonl", web + web[:12])  # exact copies
    write_jsonl(root / "code.jsonl", code + [t + " Also." for t in code[:8]])  # near-copies
    with open(root / "web.jsonl", "a") as f:
        f.write('not json {"text": <script>alert(1)</script>\n{"body": "no text key"}\n')
    (root / "mix.yaml").write_text("sources:\n  - {name: web, input: web.jsonl, weight: 0.7}\n"
                                   "  - {name: code, input: code.jsonl, weight: 0.3, max_epochs: 3}\n")
    out = root / "mix.zarr"
    run_pipeline("--mixture", root / "mix.yaml", "--tokenizer", bpe_tokenizer, "--output", out, "--dedup", "near",
                 "--validation_fraction", "0.05", "--max_rejected_fraction", "0.05",
                 "--summary_json", root / "summary.json", "--dedup_report", root / "dups")
    return out, root / "summary.json"


def cut(text: str) -> str:
    """A text as the page shows it in a removed/kept pair (docs/report.md: 600 characters)."""
    return text[:600] + ("…" if len(text) > 600 else "")


def input_texts(*files) -> list[str]:
    return [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")
            if line.startswith("{") and '"text"' in line]


def rendered(html, width=1280):
    """(the page's facts as measured in the browser, its console, its PDF's size)."""
    with chromium.Chromium() as browser:
        page = browser.open(html.as_uri(), width=width)
        facts = page.evaluate("""JSON.stringify({
            sections: [...document.querySelectorAll('main > section')].map(s => ({id: s.id,
                height: s.getBoundingClientRect().height, heading: s.querySelector('h2').textContent})),
            figures: [...document.querySelectorAll('figure')].map(f => {
                const r = f.querySelector('svg').getBoundingClientRect();
                return {id: f.id, width: r.width, height: r.height,
                        marks: f.querySelectorAll('svg .bar, svg .series').length,
                        caption: f.querySelector('figcaption').textContent}}),
            scripts: document.scripts.length, images: document.images.length,
            svgs: document.querySelectorAll('svg').length,
            legend: [...document.querySelectorAll('#fig-source-lengths svg text, #fig-source-lengths svg title')].map(
                t => t.textContent).join('|'),
            iframes: document.querySelectorAll('iframe').length,
            resources: performance.getEntriesByType('resource').length,
            pwned: window.__pwned === undefined ? null : window.__pwned,
            bodyVisible: getComputedStyle(document.body).display !== 'none',
            overflowX: document.documentElement.scrollWidth - document.documentElement.clientWidth,
            docs: [...document.querySelectorAll('#documents pre.doc')].map(p => p.textContent),
            excerpts: [...document.querySelectorAll('#rejected pre.excerpt')].map(p => p.textContent),
            pairs: [...document.querySelectorAll('#dedup .pairs pre')].map(p => p.textContent),
            wheres: [...document.querySelectorAll('#dedup .pairs .where')].map(p => p.textContent),
            clusters: [...document.querySelectorAll('#fig-clusters svg .bar title')].map(t => t.textContent),
            matched: document.querySelector('#dedup .matched') && document.querySelector('#dedup .matched').textContent,
            window: document.querySelector('#window .window') && document.querySelector('#window .window').textContent,
            boundaries: document.querySelectorAll('#window .window .boundary').length,
            splitRows: [...document.querySelectorAll('#splits table tr')].slice(1).map(
                tr => [...tr.children].map(td => td.textContent)),
            topTokens: [...document.querySelectorAll('#tokens table tr')].slice(1).map(
                tr => [...tr.children].map(td => td.textContent)),
            chosenWindows: [...document.querySelectorAll('#splits .chosen')].map(b => b.textContent),
        })""")
        pdf = page.pdf()
        return json.loads(facts), page.console, pdf


@needs_chromium
def test_the_report_of_a_mixture_with_dedup_renders_every_section_and_figure(mixture_dataset, tmp_path,
                                                                          bpe_tokenizer):
    out, summary = mixture_dataset
    html = tmp_path / "report.html"
    proc = report(out, html, "--summary", summary, "--window", "512")
    assert proc.returncode == 0, proc.stderr
    facts, console, pdf = rendered(html)

    problems = [m for m in console if m["level"] in ("error", "warning")]
    assert not problems, problems
    assert facts["resources"] == 0 and facts["scripts"] == 0  # self-contained: nothing fetched, nothing run
    assert [s["id"] for s in facts["sections"]] == list(SECTIONS)
    assert all(s["height"] > 40 for s in facts["sections"]), facts["sections"]
    figures = {f["id"]: f for f in facts["figures"]}
    assert set(figures) == {"fig-lengths-train", "fig-lengths-validation", "fig-shares", "fig-source-lengths",
                            "fig-dedup", "fig-clusters", "fig-rejected", "fig-rank-frequency"}
    for f in figures.values():
        assert f["width"] >= 400 and f["height"] >= 60 and f["marks"] >= 1, f
    assert figures["fig-shares"]["marks"] == 4  # asked and achieved, for each of the two sources
    assert figures["fig-source-lengths"]["marks"] == 2
    assert facts["overflowX"] <= 0  # readable on a laptop screen: no sideways scrolling at 1280 px
    narrow, _, _ = rendered(html, width=800)
    assert narrow["overflowX"] <= 0
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000  # printable

    # What the page says is what the reader reads (the reader is the oracle, not the report).
    splits = open_dataset(str(out))
    rows = {r[0]: r for r in facts["splitRows"]}
    for name, split in splits.items():
        assert rows[name][1] == f"{split.num_sequences:,}" and rows[name][2] == f"{split.num_tokens:,}"
    assert facts["chosenWindows"] == [f"{s.num_windows(512):,}" for s in splits.values()]
    ids = np.concatenate(list(splits["train"]))  # a small split: the report counted every token
    top = np.argsort(-np.bincount(ids), kind="stable")[:10]
    assert [int(r[1].replace(",", "")) for r in facts["topTokens"][:10]] == top.tolist()
    assert all(r[2] not in ("", "–") for r in facts["topTokens"])  # decoded with the dataset's tokenizer
    window = splits["train"].packed(0, 512)
    assert facts["boundaries"] == int((window & 1).sum())
    assert "all" in figures["fig-lengths-train"]["caption"]  # a small split is not sampled: it is all read
    # The rejected lines' excerpts are shown as the text they were.
    assert any('<script>alert(1)</script>' in e for e in facts["excerpts"])
    # The decoded documents are the dataset's own sequences.
    decoded = set(facts["docs"])
    assert len(decoded) >= 3 and all(len(d) > 20 for d in decoded)

    # The removed/kept pairs (found through the dataset's recorded --dedup_report) are real:
    # each kept text is in the dataset, each removed one in the inputs; an exact copy is its
    # kept text again, in the inputs more than once; a near-copy is in no split.
    tokenizer = Tokenizer.from_file(str(bpe_tokenizer))
    written = {cut(tokenizer.decode(s.tolist())) for split in splits.values() for s in split}
    inputs = Counter(cut(t) for t in input_texts(out.parent / "web.jsonl", out.parent / "code.jsonl"))
    pairs = list(zip(facts["pairs"][::2], facts["pairs"][1::2], facts["wheres"]))
    assert len(pairs) == 5 and all(kept in written and inputs[removed] for removed, kept, _ in pairs), pairs
    exact = [(r, k) for r, k, where in pairs if where.endswith("(exact copy)")]
    near = [(r, k) for r, k, where in pairs if "(near-copy, estimated Jaccard 0." in where]
    assert exact and near and len(exact) + len(near) == 5
    assert all(r == k and inputs[r] >= 2 for r, k in exact) and all(r != k and r not in written for r, k in near)
    assert (out.parent / "web.jsonl").name in facts["wheres"][0]
    # Cluster sizes: every removed document is in one cluster (the stats are the oracle).
    stats = open_dataset(str(out))["train"].attrs["stats"]
    removed = stats["duplicates"] + stats["near_duplicates"]
    assert all(t.split()[0].isdigit() for t in facts["clusters"])  # sizes 2..8 are each a bar of their own
    counted = {int(t.split()[0]): int(t.split(": ")[1].replace(",", "")) for t in facts["clusters"]}
    assert sum((size - 1) * n for size, n in counted.items()) == removed >= 20
    assert f"matched by {removed:,} removed documents" in facts["matched"]


@needs_chromium
def test_input_text_with_script_and_entities_never_runs_or_breaks_the_page(tmp_path):
    """Documents, rejected lines, dedup pairs and a file (so a source) name holding markup are
    shown as the text they are."""
    name = tmp_path / "in" / "<b onmouseover=x>&amp;<svg onload=alert(1)>.jsonl"
    write_jsonl(name, HOSTILE + HOSTILE)  # and an exact copy of each, removed: the dedup report's pairs
    with open(name, "a") as f:
        f.write("<script>window.__pwned = 3</script> &amp; not JSON\n")
    out = tmp_path / "hostile.zarr"
    run_pipeline("--input", name, "--tokenizer", "bytes", "--output", out, "--record_sources",
                 "--validation_fraction", "0", "--max_rejected_fraction", "0.5", "--dedup", "exact",
                 "--dedup_report", tmp_path / "dups")
    html = tmp_path / "report.html"
    # Every document is shown decoded, and the packed window (longer than the split) holds them all.
    proc = report(out, html, "--dedup_report", tmp_path / "dups", "--window", "4096")
    assert proc.returncode == 0, proc.stderr
    facts, console, _ = rendered(html)

    assert not [m for m in console if m["level"] in ("error", "warning")], console
    assert facts["pwned"] is None and facts["scripts"] == 0 and facts["images"] == 0 and facts["iframes"] == 0
    assert facts["resources"] == 0 and facts["bodyVisible"]
    assert [s["id"] for s in facts["sections"]] == list(SECTIONS)  # a `</section></main>` in text broke nothing
    assert sorted(facts["docs"]) == sorted(HOSTILE)  # character for character, entities not decoded
    assert all(h in facts["window"] for h in HOSTILE)
    assert facts["boundaries"] == len(HOSTILE)
    assert facts["svgs"] == len(facts["figures"])  # the file name made no <svg> of its own
    assert str(name) in facts["legend"]  # the source's name, whole in the per-source figure's tooltip
    assert "…" + str(name)[-17:] in facts["legend"]  # and its end in the legend
    assert any("<script>window.__pwned = 3</script> &amp; not JSON" in e for e in facts["excerpts"])
    # Each pair: the removed copy and its kept copy, read back from the input, shown as text.
    assert sorted(zip(facts["pairs"][::2], facts["pairs"][1::2])) == sorted((h, h) for h in HOSTILE)
    assert len(facts["wheres"]) == len(HOSTILE) and all(str(name) in w for w in facts["wheres"])


def test_the_report_reads_a_bounded_sample_and_says_so(mixture_dataset, tmp_path):
    """A split larger than the sample is read in spread runs of fixed size; the page states it."""
    out, _ = mixture_dataset
    html = tmp_path / "r.html"
    proc = report(out, html, "--sample_sequences", "64", "--sample_tokens", "4096")
    assert proc.returncode == 0, proc.stderr
    text = html.read_text()
    assert "sample: 64 of" in text and "a sample of 4,096 train tokens: 16 windows of 256 tokens" in text
    assert "<script" not in text.split("</head>")[1]


def test_spread_covers_evenly_and_reads_everything_when_small():
    assert spread(10, 4, 16) == [(0, 10)]
    runs = spread(1000, 10, 5)
    assert runs == [(0, 10), (247, 257), (495, 505), (742, 752), (990, 1000)]
    assert spread(0, 10, 5) == []


def test_a_missing_or_uncommitted_dataset_is_one_error_line(tmp_path):
    proc = report(tmp_path / "nothing.zarr", tmp_path / "r.html")
    assert proc.returncode == 2 and proc.stderr.startswith("flat-tokens report: error:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()


def test_a_named_file_that_cannot_be_read_is_one_error_line(mixture_dataset, tmp_path):
    out, _ = mixture_dataset
    proc = report(out, tmp_path / "r.html", "--dedup_report", tmp_path / "missing.jsonl")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"flat-tokens report: error: --dedup_report {tmp_path / 'missing.jsonl'}: cannot be read")
    assert not (tmp_path / "r.html").exists()


def test_run_writes_the_report_when_asked(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", sample_texts()[:60])
    out, html = tmp_path / "o.zarr", tmp_path / "o.html"
    proc = run_pipeline("--input", tmp_path / "a.jsonl", "--tokenizer", "bytes", "--output", out, "--report", html)
    assert f"report: {html}" in proc.stdout
    text = html.read_text()
    assert "tokens/s" in text and open_dataset(str(out))["train"].run_id in text  # the run's own build time


def shown_pairs(page: str) -> list[tuple[str, str]]:
    """The (removed, kept) texts of the page's pairs, as the text they show."""
    grid = page.split('<div class="pairs">', 1)[1].split("</div>", 1)[0]
    texts = [markup.unescape(t) for t in re.findall(r"<pre>(.*?)</pre>", grid, flags=re.S)]
    return list(zip(texts[::2], texts[1::2]))


def test_run_with_a_parquet_dedup_report_puts_its_pairs_on_its_page(tmp_path):
    """`flat-tokens run --dedup_report X.parquet --report Y`: the page shows the run's own pairs
    and cluster sizes; `flat-tokens report` takes the directory or one of its files, and says
    in one line when a directory holds none of the dataset's run."""
    texts = list(dict.fromkeys(t for t in sample_texts() if t))[:120]  # distinct
    write_jsonl(tmp_path / "a.jsonl", texts + texts[:9] + texts[:3])  # 9 clusters: 3 of size 3, 6 of size 2
    out, page, dups = tmp_path / "o.zarr", tmp_path / "o.html", tmp_path / "dups.parquet"
    run_pipeline("--input", tmp_path / "a.jsonl", "--tokenizer", "bytes", "--output", out, "--dedup", "exact",
                 "--dedup_report", dups, "--report", page)
    pairs = shown_pairs(page.read_text())
    assert len(pairs) == 5 and all(r == k and r in {cut(t) for t in texts[:9]} for r, k in pairs)
    assert 'class="matched">9 kept texts were matched by 12 removed documents; the largest cluster has 3' in (
        page.read_text())

    one_file = next(dups.iterdir())
    html = tmp_path / "r.html"
    assert report(out, html, "--dedup_report", one_file).returncode == 0
    assert shown_pairs(html.read_text()) == pairs
    (tmp_path / "empty").mkdir()
    proc = report(out, tmp_path / "e.html", "--dedup_report", tmp_path / "empty")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "holds no report file of run" in proc.stderr and not (tmp_path / "e.html").exists()


def test_a_dedup_report_without_rows_is_said_so(tmp_path):
    """A run that removed nothing wrote no report file: the page says so, not that it is missing."""
    write_jsonl(tmp_path / "a.jsonl", list(dict.fromkeys(t for t in sample_texts() if t))[:40])
    out, page = tmp_path / "o.zarr", tmp_path / "o.html"
    run_pipeline("--input", tmp_path / "a.jsonl", "--tokenizer", "bytes", "--output", out, "--dedup", "exact",
                 "--dedup_report", tmp_path / "dups", "--report", page)
    text = page.read_text()
    assert f"{tmp_path / 'dups'}: no document was removed, so the dedup report has no rows" in text
    assert 'class="warn"' not in text.split('<section id="dedup">')[1].split("</section>")[0]


@pytest.mark.slow  # starts the emulator
def test_report_reads_and_writes_cloud_storage(mixture_dataset, gcs):
    """gs:// both ways (the real fake-gcs-server): the dataset read from the bucket, the page written there."""
    out, _ = mixture_dataset
    gcs.fs.put(str(out), f"{BUCKET}/report/mix.zarr", recursive=True)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.report", f"gs://{BUCKET}/report/mix.zarr",
                           "--html", f"gs://{BUCKET}/report/mix.html"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **gcs.env})
    assert proc.returncode == 0, proc.stderr
    gcs.fs.invalidate_cache()
    page = gcs.fs.cat(f"{BUCKET}/report/mix.html").decode()
    assert all(f'<section id="{s}">' in page for s in SECTIONS)
    assert f"{open_dataset(str(out))['train'].num_tokens:,} train tokens" in page
