"""The documentation stays true: its links resolve inside the repository, and the format
page's worked example is what the pipeline's writer and reader produce."""
import ast
import re

import apache_beam as beam
import numpy as np
import zarr

from flat_tokens.tools import verify
from flat_tokens.reader import FlatTokensSplit
from tests.helpers import REPO
from transforms.records import ShardSize, SortedShard
from transforms.write import CreateOutput, LayOutShards, WriteFlatTokens
from transforms.write.commit import CommitDataset
from transforms.write.zarr_store import StoreTarget

FORMAT_PAGE = REPO / "docs" / "flat-tokens-format.md"


def documents():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*/README.md")),
            *sorted(REPO.glob("templates/*/README.md"))]


def test_every_relative_link_resolves_inside_the_repository():
    checked = 0
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        assert "../shared/" not in text, f"{doc.relative_to(REPO)} points outside the repository"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            assert path.is_relative_to(REPO) and path.exists(), f"{doc.relative_to(REPO)}: broken link {target}"
            checked += 1
    assert checked >= 3  # README -> the format page, and the docs' links to each other


def anchors(doc) -> set[str]:
    """The anchors GitHub gives the page's headings (outside code blocks): lowercased, punctuation
    but `-` and `_` dropped, spaces as `-`, a repeated one suffixed -1, -2, ..."""
    found, fence = set(), False
    for line in doc.read_text(encoding="utf-8").splitlines():
        fence ^= line.startswith("```")
        heading = re.match(r"#{1,6} (.+)", line)
        if heading and not fence:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n, candidate = 0, slug
            while candidate in found:
                n += 1
                candidate = f"{slug}-{n}"
            found.add(candidate)
    return found


def test_every_anchor_names_a_heading_of_its_page():
    """A link to a section that moved (the README's sections went to docs/) must follow it."""
    checked = 0
    for doc in documents():
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            path, anchor = target.split("#", 1)
            page = (doc.parent / path).resolve() if path else doc
            if page.suffix == ".md":
                assert anchor in anchors(page), f"{doc.relative_to(REPO)}: {target}: no such heading"
                checked += 1
    assert checked >= 10


def test_the_pages_that_messages_cite_hold_what_they_cite():
    """A message that sends the user to "docs/PAGE.md, 'Section'" names a page that exists and
    a phrase that is in it; none sends them to a README section (the README keeps no details)."""
    cited = 0
    for source in [*REPO.glob("pipeline/**/*.py"), *REPO.glob("transforms/**/*.py"), *REPO.glob("flat_tokens/**/*.py")]:
        text = source.read_text(encoding="utf-8")
        assert not re.search(r"README[:,] ['\"]", text), f"{source.relative_to(REPO)} cites a README section"
        for page, phrase in re.findall(r"(docs/[\w.-]+\.md), (?:\"\s*\"\s*)?'([^']+)'", text):
            assert phrase in (REPO / page).read_text(encoding="utf-8"), f"{source.relative_to(REPO)}: {page} has no {phrase!r}"
            cited += 1
    assert cited >= 2  # the cluster worker's failure and the credentials advice


def numbers(name: str, text: str):
    """The value given as `name = [...]` (or a number) in the page's code blocks."""
    return ast.literal_eval(re.search(rf"^{name}\s*=\s*(.+)$", text, flags=re.M).group(1))


def write_with_the_pipeline(path, seqs):
    """Writes the sequences as one train shard through the pipeline's writer and commit."""
    encoded = np.array([2 * t + (i == 0) for s in seqs for i, t in enumerate(s)], dtype=np.uint32)
    shard = SortedShard("train", 0, np.array([len(s) for s in seqs]), encoded)
    size = ShardSize("train", 0, len(encoded), len(seqs), max(max(s) for s in seqs))
    target = StoreTarget(url=str(path), tokens_chunk=3, seq_starts_chunk=3, run_id="docs")
    with beam.Pipeline(runner="FnApiRunner") as p:
        layout = p | "Sizes" >> beam.Create([size]) | beam.CombineGlobally(LayOutShards())
        ready = (p | "Once" >> beam.Create([None])
                 | beam.ParDo(CreateOutput(target, False, str(path) + ".rejected"), beam.pvalue.AsSingleton(layout)))
        written = (p | "Shards" >> beam.Create([shard])
                   | WriteFlatTokens(target, beam.pvalue.AsSingleton(layout), beam.pvalue.AsSingleton(ready)))
        counts = p | "Counts" >> beam.Create([{"lines": len(seqs), "documents": len(seqs)}])
        (written, layout, counts) | CommitDataset(target, {})


def test_the_worked_example_is_what_the_pipeline_writes_and_reads(tmp_path):
    page = FORMAT_PAGE.read_text(encoding="utf-8")
    seqs = ast.literal_eval(re.search(r"Three sequences of token ids, `(\[\[.+?\]\])`", page).group(1))
    assert seqs == [[1, 2], [3, 4, 5], [6, 7, 8]]
    write_with_the_pipeline(tmp_path / "ex.zarr", seqs)
    assert verify.verify_dataset(str(tmp_path / "ex.zarr")) == []
    stored = zarr.open_group(str(tmp_path / "ex.zarr"), mode="r")["train"]
    assert stored["encoded_tokens"][:].tolist() == numbers("encoded_tokens", page)
    assert stored["seq_starts"][:].tolist() == numbers("seq_starts", page)
    assert stored.attrs["max_token_id"] == numbers("max_token_id", page)
    train = FlatTokensSplit(str(tmp_path / "ex.zarr"), "train")
    # unpacked access to sequence 1, packed window 1 of length 4, and the whole split as one window
    unpacked = re.search(r"Sequence 1 is\s+`encoded_tokens\[2:5\]` = `(\[.+?\])`, which decodes to the ids `(\[.+?\])`",
                         page)
    assert train.encoded_sequence(1).tolist() == ast.literal_eval(unpacked.group(1))
    assert train.sequence(1).tolist() == ast.literal_eval(unpacked.group(2))
    window = re.search(r"With `L = 4`, window 1 is\s+`(\[.+?\])`", page).group(1)
    assert train.packed(1, 4).tolist() == ast.literal_eval(window)
    inputs, targets = train.packed_inputs_targets(0, 8)
    assert targets.tolist() == numbers("targets", page) and inputs.tolist() == numbers("inputs", page)
