"""What a run reads, and what it refuses to read: every input file a pattern names is read
whole, or the run stops before reading, naming it (exit 2). Directories with other files in
them, unreadable subdirectories, broken and looping links, FIFOs, bzip2 and xz files."""
import bz2
import gzip
import lzma
import os
import shutil
import subprocess
import sys

import pytest

from flat_tokens.tools import verify
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, refused, run_pipeline, stats, write_jsonl
from tests.test_parquet import sequences, write_parquet

BYTES = ["--tokenizer", "bytes"]


# ---------------------------------------------------------------------------------------------
# Directories and globs: every entry listed, or a refusal naming it


def permissions_apply() -> list[str]:
    """A command prefix under which file permissions bind: none for an ordinary user; for
    root, setpriv without the two capabilities that bypass them (root owns the test files,
    so their owner bits then apply)."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0:
        pytest.skip("running as root, and setpriv cannot drop the capabilities that bypass file permissions")
    return prefix


def run_where_permissions_apply(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*permissions_apply(), sys.executable, "-m", "pipeline.run", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def three_files(directory):
    for i in range(3):
        write_jsonl(directory / f"{i}.jsonl", [f"document {i}"])
    return directory


@pytest.mark.slow
def test_an_unreadable_subdirectory_is_refused_naming_it(tmp_path):
    """It used to be skipped without a word: exit 0, and `verify` OK."""
    data = three_files(tmp_path / "data")
    three_files(data / "more")
    os.chmod(data / "more", 0)
    try:
        for pattern in (data, f"{data}/**/*.jsonl", f"{data}/*/*.jsonl"):
            proc = run_where_permissions_apply("--input", pattern, *BYTES, "--output", tmp_path / "o.zarr")
            message = refused(proc)
            assert f"cannot list the directory {data}/more (Permission denied)" in message, message
        # A glob that never reaches it reads what it names.
        proc = run_where_permissions_apply("--input", f"{data}/*.jsonl", *BYTES, "--output", tmp_path / "o.zarr")
        assert proc.returncode == 0, proc.stderr
        assert stats(tmp_path / "o.zarr")["documents"] == 3
    finally:
        os.chmod(data / "more", 0o755)


def test_a_file_unreadable_late_in_a_long_listing_is_refused_at_launch(tmp_path):
    """The launcher opened only the first 64 files: the 90th failed in a worker, exit 1, with
    a traceback."""
    data = tmp_path / "data"
    for i in range(100):
        write_jsonl(data / f"{i:03}.jsonl", [f"document {i}"])
    os.chmod(data / "090.jsonl", 0)
    message = refused(run_where_permissions_apply("--input", data, *BYTES, "--output", tmp_path / "o.zarr"))
    assert f"{data}/090.jsonl cannot be read (Permission denied)" in message, message
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.slow
def test_broken_links_and_link_loops_are_refused_naming_them(tmp_path):
    data = three_files(tmp_path / "data")
    out = ["--output", tmp_path / "o.zarr", *BYTES]
    os.symlink(tmp_path / "gone.jsonl", data / "broken.jsonl")
    message = refused(run_pipeline("--input", data, *out, check=False))
    assert f"{data}/broken.jsonl is a broken symbolic link" in message, message
    os.unlink(data / "broken.jsonl")

    os.symlink("loop-b.jsonl", data / "loop-a.jsonl")
    os.symlink("loop-a.jsonl", data / "loop-b.jsonl")
    message = refused(run_pipeline("--input", f"{data}/*.jsonl", *out, check=False))
    assert f"{data}/loop-a.jsonl is a symbolic link loop" in message, message
    os.unlink(data / "loop-a.jsonl")
    os.unlink(data / "loop-b.jsonl")

    (data / "deeper").mkdir()
    os.symlink("..", data / "deeper" / "up")  # a directory link back to the input itself
    message = refused(run_pipeline("--input", data, *out, check=False))
    assert f"{data}/deeper/up leads back to {data}" in message, message
    os.unlink(data / "deeper" / "up")
    os.symlink(tmp_path / "elsewhere", data / "deeper" / "linked")  # a link to a directory is followed
    three_files(tmp_path / "elsewhere")
    run_pipeline("--input", data, *out)
    assert stats(tmp_path / "o.zarr")["documents"] == 6
    assert not (tmp_path / "o.zarr.rejected").exists() or not list((tmp_path / "o.zarr.rejected").iterdir())


@pytest.mark.parametrize("how", ["in a directory", "matched by a glob", "named"])
@pytest.mark.slow
def test_a_fifo_is_refused_without_opening_it(tmp_path, how):
    """Opening a FIFO waits for a writer: the launcher used to hang there forever."""
    data = three_files(tmp_path / "data")
    os.mkfifo(data / "pipe.jsonl")
    pattern = {"in a directory": data, "matched by a glob": f"{data}/*.jsonl", "named": data / "pipe.jsonl"}[how]
    proc = run_pipeline("--input", pattern, *BYTES, "--output", tmp_path / "o.zarr", check=False,
                        timeout=120)  # a hang guard, not a measurement
    message = refused(proc)
    assert f"{data}/pipe.jsonl is a FIFO, not a regular file; refusing to open it" in message, message


# A corpus's manifest: one JSON document over several lines, not JSON Lines.
MANIFEST = '{\n  "name": "corpus",\n  "files": ["a.jsonl", "b.json.gz"],\n  "documents": 4\n}\n'


def data_and_other_files(directory):
    """Two JSONL files (one gzipped *.json, as C4's and Dolma's shards are named), a Parquet
    file and, beside them, files that are not data: a plain *.json among them."""
    write_jsonl(directory / "a.jsonl", ["first document", "second document"])
    (directory / "b.json.gz").write_bytes(gzip.compress(b'{"text": "third document"}\n'))
    write_parquet(directory / "part" / "c.parquet", {"text": ["fourth document"]})
    (directory / "MANIFEST.json").write_text(MANIFEST)
    (directory / "README.md").write_text("# Corpus\n\nThese files hold the corpus.\n")
    (directory / "config.yaml").write_text("name: corpus\n")
    (directory / "_SUCCESS").write_text("")
    (directory / "part" / "notes.txt").write_text("not data\n")
    return directory


@pytest.mark.slow
def test_a_directory_input_reads_its_data_files_and_lists_what_it_skipped(tmp_path):
    """It used to read the README and the YAML file as JSONL (their lines rejected)."""
    data = data_and_other_files(tmp_path / "data")
    proc = run_pipeline("--input", data, *BYTES, "--output", tmp_path / "o.zarr", "--quiet")
    assert stats(tmp_path / "o.zarr")["documents"] == 4 and stats(tmp_path / "o.zarr")["rejected"] == 0
    warnings = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(warnings) == 1, proc.stderr
    assert f"--input {data}: skipped 5 file(s) not named as JSONL or Parquet data" in warnings[0]
    for name in ("MANIFEST.json", "README.md", "config.yaml", "_SUCCESS", "part/notes.txt"):
        assert f"{data}/{name}" in warnings[0]
    # A glob names its files itself: they are read whatever their names.
    proc = run_pipeline("--input", f"{data}/*.md", *BYTES, "--output", tmp_path / "md.zarr", check=False)
    assert proc.returncode == 1 and "invalid_json" in proc.stderr, proc.stderr

    only_other = tmp_path / "docs"
    only_other.mkdir()
    (only_other / "README.md").write_text("nothing to read\n")
    message = refused(run_pipeline("--input", only_other, *BYTES, "--output", tmp_path / "o2.zarr", check=False))
    assert "holds no file named as JSONL or Parquet data" in message and str(only_other / "README.md") in message


@pytest.mark.slow
def test_a_plain_json_file_is_read_only_when_named_and_rejected_lines_name_their_file(tmp_path):
    """A corpus directory with a MANIFEST.json failed on 17% rejected lines, and the error
    named only the report folder. A *.json file is read when named (or globbed), as JSONL."""
    data = tmp_path / "data"
    write_jsonl(data / "docs.jsonl", [f"document {i}" for i in range(20)])
    (data / "MANIFEST.json").write_text(MANIFEST)
    run_pipeline("--input", data, *BYTES, "--output", tmp_path / "dir.zarr", "--quiet")
    assert (stats(tmp_path / "dir.zarr")["documents"], stats(tmp_path / "dir.zarr")["rejected"]) == (20, 0)
    # Named or globbed, it is read: its lines are not JSON objects, and the error names it.
    for i, named in enumerate(([data / "docs.jsonl", data / "MANIFEST.json"], [f"{data}/*"])):
        proc = run_pipeline("--input", *named, *BYTES, "--output", tmp_path / f"named{i}.zarr", check=False)
        assert proc.returncode == 1, proc.stderr
        assert "non-blank input lines were rejected" in proc.stderr, proc.stderr
        assert f"most in {data / 'MANIFEST.json'} (5)" in proc.stderr, proc.stderr
        assert str(data / "docs.jsonl") not in proc.stderr, proc.stderr  # it has no rejected line


def test_a_huggingface_save_to_disk_folder_is_refused_with_what_to_do(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "data-00000-of-00001.arrow").write_bytes(b"ARROW1")
    (folder / "dataset_info.json").write_text('{\n  "citation": ""\n}\n')
    (folder / "state.json").write_text('{\n  "_data_files": []\n}\n')
    message = refused(run_pipeline("--input", folder, *BYTES, "--output", tmp_path / "o.zarr", check=False))
    assert "holds no file named as JSONL or Parquet data" in message and "state.json" in message, message
    assert "to_json or to_parquet" in message, message


@pytest.mark.slow
def test_a_gs_directory_input_reads_its_data_files_and_lists_what_it_skipped(gcs, tmp_path):  # noqa: F811
    data = data_and_other_files(tmp_path / "data")
    gcs.fs.put(str(data) + "/", f"{BUCKET}/mixed-dir/", recursive=True)
    folder = f"gs://{BUCKET}/mixed-dir"
    proc = run_pipeline("--input", folder, *BYTES, "--output", f"gs://{BUCKET}/mixed-dir.zarr", "--quiet",
                        env=gcs.env, timeout=200)
    assert "skipped 5 file(s)" in proc.stderr and f"{folder}/MANIFEST.json" in proc.stderr, proc.stderr
    assert "4 documents, 0 blank lines, 0 rejected lines" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------------
# Compressed files


@pytest.mark.slow
def test_bz2_and_xz_inputs_hold_the_same_documents_as_plain(tmp_path):
    """They used to be read as raw bytes: every line rejected, after a full read."""
    plain = write_jsonl(tmp_path / "plain" / "c.jsonl", [f"compressed document {i} ✓" for i in range(300)])
    raw = plain.read_bytes()
    (tmp_path / "bz2").mkdir()
    # Two streams, as pbzip2 writes them.
    (tmp_path / "bz2" / "c.jsonl.bz2").write_bytes(bz2.compress(raw[:4000]) + bz2.compress(raw[4000:]))
    (tmp_path / "xz").mkdir()
    (tmp_path / "xz" / "c.jsonl.xz").write_bytes(lzma.compress(raw))
    for kind in ("plain", "bz2", "xz"):
        run_pipeline("--input", tmp_path / kind, *BYTES, "--output", tmp_path / f"{kind}.zarr")
    for kind in ("bz2", "xz"):
        got = stats(tmp_path / f"{kind}.zarr")
        assert (got["documents"], got["rejected"]) == (300, 0)
        assert sequences(tmp_path / f"{kind}.zarr") == sequences(tmp_path / "plain.zarr")


@pytest.mark.slow
def test_broken_bz2_and_xz_inputs_are_never_read_as_whole(tmp_path):
    raw = write_jsonl(tmp_path / "c.jsonl", [f"document {i}" for i in range(3000)]).read_bytes()
    (tmp_path / "not.jsonl.bz2").write_bytes(b"this is not bzip2 data\n")
    message = refused(run_pipeline("--input", tmp_path / "not.jsonl.bz2", *BYTES, "--output", tmp_path / "a.zarr",
                                   check=False))
    assert "not.jsonl.bz2: cannot be read" in message and "not valid bz2 data" in message, message
    for name, data in (("cut.jsonl.xz", lzma.compress(raw)[:-200]),
                       ("garbage-after.jsonl.bz2", bz2.compress(raw) + b"\x00garbage")):
        (tmp_path / name).write_bytes(data)
        proc = run_pipeline("--input", tmp_path / name, *BYTES, "--output", tmp_path / f"{name}.zarr", check=False)
        assert proc.returncode == 1, proc.stderr
        assert f"input {tmp_path / name}: the compressed data is truncated or corrupt" in proc.stderr, proc.stderr
        assert not (tmp_path / f"{name}.zarr").exists() or verify.verify_dataset(str(tmp_path / f"{name}.zarr"))
