"""An input file that changes while the job runs (truncated, grown, rewritten) fails the run,
naming it, instead of giving a dataset of part of it: locally and on GCS (the emulator).

The change happens after the launcher listed the inputs and before any worker reads them,
made by a tokenizer backend plugin the launcher loads in between (tests/changing_inputs.py);
what happens when a file changes between two reads of one worker is checked on open_input."""
import json
import os

import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from flat_tokens.tools import verify
from tests import changing_inputs
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import SAMPLE, run_pipeline, write_jsonl
from transforms.read import inputs

TOKENIZER = SAMPLE / "tokenizer.json"


def changed_run(tmp_path, pattern, change: str, changed_file: str, output: str, env=None):
    env = {"FLAT_TOKENS_TEST_CHANGE": changed_file, "FLAT_TOKENS_TEST_CHANGED": str(tmp_path / "changed"),
           **(env or {})}
    return run_pipeline("--input", pattern, "--tokenizer", TOKENIZER, "--tokenizer_backend",
                        f"tests.changing_inputs:{change}", "--output", output, env=env, check=False, timeout=300)


def failed_naming(proc, url: str) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("flat-tokens: error:")]
    assert f"input {url} changed while the job ran" in line, line
    return line


def corpus(directory):
    for i in range(3):
        write_jsonl(directory / f"part-{i}.jsonl", [f"document {j} of part {i}, in more words" for j in range(200)])
    return directory


@pytest.mark.parametrize("change", ["truncating", "appending", "rewriting"])
@pytest.mark.slow
def test_a_local_file_changed_during_the_run_fails_it(tmp_path, change):
    """Each used to give a dataset of what the worker found (exit 0)."""
    data = corpus(tmp_path / "data")
    before = (data / "part-1.jsonl").read_bytes()
    after = {"truncating": changing_inputs.truncated, "appending": changing_inputs.appended,
             "rewriting": changing_inputs.rewritten}[change](before)
    how = "its modification time changed" if len(after) == len(before) else f"now holds {len(after):,} bytes"
    out = tmp_path / "o.zarr"
    line = failed_naming(changed_run(tmp_path, data, change, str(data / "part-1.jsonl"), str(out)),
                         data / "part-1.jsonl")
    assert f"listed with {len(before):,} bytes, and {how}" in line, line
    assert (data / "part-1.jsonl").read_bytes() == after  # the change did happen between listing and reading
    assert not out.exists() or verify.verify_dataset(str(out))


def test_a_parquet_file_changed_during_the_run_fails_it(tmp_path):
    data = corpus(tmp_path / "data")
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(100)]}), data / "rows.parquet")
    out = tmp_path / "o.zarr"
    failed_naming(changed_run(tmp_path, data, "appending", str(data / "rows.parquet"), str(out)), data / "rows.parquet")
    assert not out.exists() or verify.verify_dataset(str(out))


@pytest.mark.parametrize("change", ["truncating", "rewriting"])
@pytest.mark.slow
def test_a_gs_object_changed_during_the_run_fails_it(gcs, tmp_path, change):  # noqa: F811
    """On GCS a rewrite of the same size is a new generation: the workers read the generation
    the launcher listed, or fail."""
    prefix = f"changing-{change}"
    gcs.fs.put(str(corpus(tmp_path / "data")) + "/", f"{BUCKET}/{prefix}/", recursive=True)
    url = f"gs://{BUCKET}/{prefix}/part-1.jsonl"
    out = f"gs://{BUCKET}/{prefix}.zarr"
    failed_naming(changed_run(tmp_path, f"gs://{BUCKET}/{prefix}/*.jsonl", change, url, out, env=gcs.env), url)
    assert not gcs.fs.exists(f"{BUCKET}/{prefix}.zarr/.zgroup")  # never committed


# ---------------------------------------------------------------------------------------------
# Between two reads of one worker


def big_jsonl(path, documents=400_000):
    path.write_bytes(b"".join(json.dumps({"text": f"document {i}"}).encode() + b"\n" for i in range(documents)))
    return path


def read_all(f, *, change, storage_options=None):
    """Reads `f` through open_input, calling change() after the first read."""
    with inputs.open_input(f, storage_options) as fh:
        got = fh.read(1000)
        change()
        while True:
            block = fh.read(1 << 20)
            if not block:
                return got
            got += block


@pytest.mark.slow
def test_a_local_file_truncated_or_grown_while_it_is_read_fails_the_read(tmp_path):
    path = big_jsonl(tmp_path / "big.jsonl")
    [f] = inputs.list_input_files([str(path)], "auto")
    with pytest.raises(inputs.InputChanged, match=r"changed while the job ran: it was listed with [\d,]+ bytes, and now "
                                           r"ends at byte 1,000,000"):
        read_all(f, change=lambda: os.truncate(path, 1_000_000))
    big_jsonl(path)
    [f] = inputs.list_input_files([str(path)], "auto")

    def grow():
        with open(path, "ab") as out:
            out.write(b'{"text": "late"}\n')
    with pytest.raises(inputs.InputChanged, match="now holds more"):
        read_all(f, change=grow)
    [f] = inputs.list_input_files([str(path)], "auto")
    assert read_all(f, change=lambda: None) == path.read_bytes()  # unchanged: read whole, no error


@pytest.mark.slow
def test_a_gs_object_rewritten_while_it_is_read_fails_the_read(gcs, tmp_path):  # noqa: F811
    """gcsfs reads the current object at each request: without the generation pinned, the
    rest of the file would come from the new version."""
    path = big_jsonl(tmp_path / "big.jsonl")
    gcs.fs.put(str(path), f"{BUCKET}/rewritten/big.jsonl")
    storage = {"endpoint_url": gcs.url, "token": "anon"}
    [f] = inputs.list_input_files([f"gs://{BUCKET}/rewritten/big.jsonl"], "auto", storage_options=storage)
    assert f.version.startswith("generation ")

    def rewrite():
        with gcs.fs.open(f"{BUCKET}/rewritten/big.jsonl", "wb") as out:
            out.write(path.read_bytes().replace(b"document", b"DOCUMENT"))
    with pytest.raises(inputs.InputChanged, match="the version listed is gone"):
        data = read_all(f, change=rewrite, storage_options=storage)
        assert b"DOCUMENT" not in data  # (what the read would have mixed in, were it not pinned)


def test_a_unit_s_stored_bytes_are_checked_with_the_digest_they_were_recorded_with(tmp_path):
    """Issue 28 changed the recorded digest from sha256 to xxh3-128: an account holds either
    (one staged before the change, or on a machine without xxhash), and digest_of reads the
    same spans again with the algorithm named, so both still tell an edit from no edit."""
    import hashlib

    path = tmp_path / "a.jsonl"
    data = b'{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n'
    path.write_bytes(data)
    f = inputs.list_input_files([str(path)], "train")[0]
    stored = inputs.StoredBytes()
    with inputs.open_input(f, stored=stored) as raw:
        raw.seek(5)
        raw.read(20)
    recorded = stored.describe()
    [[offset, length]] = recorded["spans"]
    assert inputs.UNIT_DIGEST in inputs.UNIT_DIGESTS and inputs.UNIT_DIGEST in recorded
    assert inputs.digest_of(f, recorded["spans"]) == recorded[inputs.UNIT_DIGEST]
    sha256 = inputs.digest_of(f, recorded["spans"], name="sha256")
    assert sha256 == hashlib.sha256(data[offset:offset + length]).hexdigest()
    before = path.stat()  # edited in place, size and modification time restored: only the bytes tell
    path.write_bytes(data.replace(b"one", b"eno"))  # inside the span read
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert inputs.digest_of(f, recorded["spans"]) != recorded[inputs.UNIT_DIGEST]
    assert inputs.digest_of(f, recorded["spans"], name="sha256") != sha256
    with pytest.raises(ValueError, match="not available"):
        inputs.new_digest("md5")
