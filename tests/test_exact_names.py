"""Inputs named exactly are read exactly, and this tool's own names are exact names (issue 37,
case 8): a file whose name holds glob characters is that file, not what the glob matches; a
user's `.flat-tokens-*` file is neither a reason to skip the directory it sits in nor deleted
by `--overwrite`; `--local_parallelism` far above the cores is refused. Real runs, locally
and on the GCS emulator."""
import json

import pytest
import zarr

from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import refused, run_pipeline, stats, write_jsonl
from transforms import staging
from flat_tokens.format.own_names import is_own_name
from transforms.write import ownership

BYTES = ["--tokenizer", "bytes"]


def documents(prefix: str, n: int) -> list[str]:
    return [f"{prefix} document {i}" for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Own names: exact, not a prefix


def test_own_names_are_the_names_the_tool_writes_and_nothing_else():
    ours = [f"{ownership.CLAIM_PREFIX}3", f"{ownership.CONFLICT_PREFIX}0123abcd", staging.FOLDER,
            f"{ownership.LEASE_PREFIX}run-a.{'ab' * 16}", f"{ownership.CLAIM_PREFIX}3.{'0f' * 16}.partial",
            ".flat-tokens-write-check-0123abcd"]
    users = [".flat-tokens-notes.txt", ".flat-tokens-mine", ".flat-tokens-x", ".flat-tokens-run.3.txt",
             ".flat-tokens-run.", ".flat-tokens-staging-old", ".flat-tokens-writing.run-a", "notes.txt"]
    assert [n for n in ours if not is_own_name(n)] == []
    assert [n for n in users if is_own_name(n)] == []


@pytest.mark.parametrize("name", [".flat-tokens-x", ".flat-tokens-notes.txt"])
def test_a_user_file_named_like_ours_does_not_hide_its_directory_from_the_input(tmp_path, name):
    """An empty `.flat-tokens-x` in an input subdirectory made the whole subdirectory be
    skipped as this tool's output: 100 of 200 documents lost, exit 0."""
    data = tmp_path / "data"
    write_jsonl(data / "top.jsonl", documents("top", 100))
    write_jsonl(data / "sub" / "more.jsonl", documents("sub", 100))
    (data / "sub" / name).write_text("")
    for pattern in (data, f"{data}/**/*.jsonl"):
        proc = run_pipeline("--input", pattern, *BYTES, "--output", tmp_path / "o.zarr", "--overwrite")
        assert stats(tmp_path / "o.zarr")["documents"] == 200, (pattern, proc.stderr)
        assert "left out this tool's own output" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_gs_user_file_named_like_ours_does_not_hide_its_directory(gcs, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    write_jsonl(data / "top.jsonl", documents("top", 100))
    write_jsonl(data / "sub" / "more.jsonl", documents("sub", 100))
    (data / "sub" / ".flat-tokens-x").write_text("")
    gcs.fs.put(str(data) + "/", f"{BUCKET}/own-names/", recursive=True)
    for pattern in (f"gs://{BUCKET}/own-names", f"gs://{BUCKET}/own-names/**/*.jsonl"):
        proc = run_pipeline("--input", pattern, *BYTES, "--output", f"gs://{BUCKET}/own-names-out.zarr", "--overwrite",
                            env=gcs.env, timeout=300)
        assert "200 documents" in proc.stdout, (pattern, proc.stdout, proc.stderr)


def test_overwrite_leaves_a_user_s_files_named_like_ours(tmp_path):
    """`--overwrite` deleted OUT/.flat-tokens-notes.txt and OUT/.flat-tokens-mine/important.txt:
    any `.flat-tokens-*` name counted as this tool's. Now they are a user's files in the
    output, like any other: the run is refused before anything is deleted, naming them."""
    src = write_jsonl(tmp_path / "in.jsonl", documents("a", 50))
    out = tmp_path / "o.zarr"
    run_pipeline("--input", src, *BYTES, "--output", out)
    (out / ".flat-tokens-notes.txt").write_text("my notes")
    (out / ".flat-tokens-mine").mkdir()
    (out / ".flat-tokens-mine" / "important.txt").write_text("important")
    before = zarr.open_group(str(out), mode="r").attrs["run_id"]
    message = refused(run_pipeline("--input", src, *BYTES, "--output", out, "--overwrite", "--seed", "1",
                                   check=False))
    assert ".flat-tokens-notes.txt" in message or ".flat-tokens-mine" in message, message
    assert (out / ".flat-tokens-notes.txt").read_text() == "my notes"
    assert (out / ".flat-tokens-mine" / "important.txt").read_text() == "important"
    assert zarr.open_group(str(out), mode="r").attrs["run_id"] == before  # nothing of the dataset was touched
    # Moved away, the output is this tool's again and is replaced.
    (out / ".flat-tokens-notes.txt").unlink()
    (out / ".flat-tokens-mine" / "important.txt").unlink()
    (out / ".flat-tokens-mine").rmdir()
    run_pipeline("--input", src, *BYTES, "--output", out, "--overwrite", "--seed", "1")
    assert zarr.open_group(str(out), mode="r").attrs["run_id"] != before
    assert json.loads(next(out.glob(".flat-tokens-run.*")).read_text())["run_id"] != before


# ---------------------------------------------------------------------------------------------
# Inputs named exactly are read exactly


def glob_named_files(directory):
    """`data[1].jsonl` beside `data1.jsonl`, the file its name matches as a glob."""
    write_jsonl(directory / "data[1].jsonl", documents("bracketed", 30))
    write_jsonl(directory / "data1.jsonl", documents("plain", 70))
    write_jsonl(directory / "what?.jsonl", documents("questioned", 20))
    write_jsonl(directory / "whatX.jsonl", documents("x", 40))
    return directory


def test_an_existing_file_whose_name_holds_glob_characters_is_read_by_its_exact_name(tmp_path):
    """`--input 'n2/data[1].jsonl'` read n2/data1.jsonl (exit 0, the provenance said
    data[1].jsonl)."""
    data = glob_named_files(tmp_path / "n2")
    for name, expected in (("data[1].jsonl", 30), ("what?.jsonl", 20)):
        out = tmp_path / "o.zarr"
        run_pipeline("--input", data / name, *BYTES, "--output", out, "--overwrite")
        root = zarr.open_group(str(out), mode="r").attrs
        assert (root["stats"]["documents"], root["input_files"]) == (expected, 1), name
        assert root["inputs"] == [str(data / name)]
    # A pattern that names no existing file is a glob, as before.
    run_pipeline("--input", data / "data[0-9].jsonl", *BYTES, "--output", tmp_path / "g.zarr")
    assert stats(tmp_path / "g.zarr")["documents"] == 70


@pytest.mark.slow
def test_an_existing_gs_object_whose_name_holds_glob_characters_is_read_by_its_exact_name(gcs, tmp_path):  # noqa: F811
    data = glob_named_files(tmp_path / "n2")
    gcs.fs.put(str(data) + "/", f"{BUCKET}/glob-names/", recursive=True)
    # (Not `what?.jsonl`: gcsfs reads a "?" in a gs:// URL as the start of a query.)
    for name, expected in (("data[1].jsonl", 30), ("data[0-9].jsonl", 70)):
        proc = run_pipeline("--input", f"gs://{BUCKET}/glob-names/{name}", *BYTES, "--output",
                            f"gs://{BUCKET}/glob-names-out.zarr", "--overwrite", env=gcs.env, timeout=300)
        assert f"{expected} documents" in proc.stdout, (name, proc.stdout, proc.stderr)
