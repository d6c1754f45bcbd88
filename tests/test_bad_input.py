"""Dirty input: every good document kept, every bad line counted and reported, bad
configuration refused before any data is read."""
import gzip
import json
import os
import shutil
import socket

import pytest
import zarr
import zstandard

from flat_tokens.tools import verify
from tests.helpers import SAMPLE, check_flat_tokens, run_pipeline, write_jsonl

# (raw line bytes, reason) for every rejected case the pipeline must handle.
BAD_LINES = [
    (b'{"text": "truncated', "invalid_json"),
    (b'{"text": "trailing comma",}', "invalid_json"),
    (b"{'text': 'single quotes'}", "invalid_json"),
    (b'{"text": "one"} {"text": "two"}', "invalid_json"),
    (b'{"text": "an unescaped newline', "invalid_json"),  # the newline splits the record in two
    (b'inside a string"}', "invalid_json"),
    (b'{"text": "raw \x01 control"}', "invalid_json"),
    (b'"just a string"', "not_an_object"),
    (b"[1, 2]", "not_an_object"),
    (b"42", "not_an_object"),
    (b"null", "not_an_object"),
    (b'{"body": "no text key"}', "missing_text_key"),
    (b'{"text": null}', "text_not_a_string"),
    (b'{"text": 7}', "text_not_a_string"),
    (b'{"text": true}', "text_not_a_string"),
    (b'{"text": ["a"]}', "text_not_a_string"),
    (b'{"text": {"a": 1}}', "text_not_a_string"),
    (b'{"text": "raw \xff byte"}', "invalid_utf8"),
    ('{"text": "latin-1 café"}'.encode("latin-1"), "invalid_utf8"),
    (b'{"text": "truncated \xe6\x97"}', "invalid_utf8"),
    (b'{"text": "lone \\ud800"}', "unencodable_text"),
    (b'{"text": "reversed \\udc00\\ud800"}', "unencodable_text"),
    (b'{"text": "nul after"}\x00', "invalid_json"),
]


def good(i):
    return json.dumps({"text": f"good document number {i}"}).encode()


@pytest.fixture(scope="module")
def dirty(tmp_path_factory):
    """Bad lines interleaved with good ones in one file, plus files of every accepted shape."""
    root = tmp_path_factory.mktemp("dirty")
    lines = []
    for i, (raw, _) in enumerate(BAD_LINES):
        lines += [good(i), raw]
    (root / "dirty.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ok = root / "ok"
    ok.mkdir()
    (ok / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + good(100) + b"\n" + good(101) + b"\n")
    (ok / "crlf.jsonl").write_bytes(good(102) + b"\r\n" + good(103) + b"\r\n")
    (ok / "no-final-newline.jsonl").write_bytes(good(104) + b"\n" + good(105))
    (ok / "empty.jsonl").write_bytes(b"")
    (ok / "blank.jsonl").write_bytes(b"\n\n   \n\t\n")
    (ok / "shapes.jsonl").write_bytes(b"\n".join([
        b'{"text": "ascii escaped \\u00e9\\u6771\\ud83d\\ude00"}',
        b'{"text": "escaped \\u0000 nul"}',
        b'{"text": "first", "text": "duplicate key: last wins"}',
        b'{"id": 5, "meta": {"x": [1, 2]}, "text": "extra keys"}',
        '{"text": "raw separators \u2028 \u2029 \u0085 stay inside"}'.encode(),
        b'   \t {"text": "surrounding whitespace"}  \t ',
        b'{"text": "NaN elsewhere", "score": NaN}',
    ]) + b"\n")
    (root / "ok.jsonl.gz").write_bytes(gzip.compress(good(106) + b"\n" + good(107) + b"\n"))
    big = "sixteen megabytes of text, in words and sentences. " * (16 * 2**20 // 51)
    (ok / "big.jsonl").write_bytes(json.dumps({"text": big}).encode() + b"\n")
    return root


@pytest.mark.slow
def test_every_bad_line_is_counted_reported_and_every_good_document_kept(tmp_path, dirty):
    out = tmp_path / "out.zarr"
    proc = run_pipeline("--input", dirty / "dirty.jsonl", "--input", dirty / "ok", "--input", dirty / "ok.jsonl.gz",
                        "--output", out, "--tokenizer", "bytes", "--max_rejected_fraction", "1")
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    want = {}
    for _, reason in BAD_LINES:
        want[reason] = want.get(reason, 0) + 1
    assert stats["rejected_by_reason"] == want
    assert stats["rejected"] == len(BAD_LINES)
    assert stats["blank"] == 4  # blank.jsonl
    # Every good line of every file is a document: the interleaved ones, bom, crlf,
    # no-final-newline, shapes, gz and big.
    assert stats["documents"] == len(BAD_LINES) + 2 + 2 + 2 + 7 + 2 + 1
    # The report lists each rejected line with its file, 1-based line number and reason.
    rows = [json.loads(line) for p in sorted((tmp_path / "out.zarr.rejected").glob("*.jsonl"))
            for line in p.read_text().splitlines()]
    assert sorted((r["line"], r["reason"]) for r in rows) == [(2 * i + 2, reason) for i, (_, reason) in enumerate(BAD_LINES)]
    assert all(r["file"].endswith("dirty.jsonl") for r in rows)
    assert "out.zarr.rejected" in proc.stdout
    assert verify.verify_dataset(str(out)) == []


@pytest.mark.slow
def test_checker_agrees_on_which_lines_are_documents(tmp_path, dirty):
    out = tmp_path / "out.zarr"
    run_pipeline("--input", dirty / "dirty.jsonl", "--output", out, "--tokenizer", "bytes", "--max_rejected_fraction", "1")
    check_flat_tokens(out, "--input", dirty / "dirty.jsonl", "--tokenizer", "bytes")
    out2 = tmp_path / "ok.zarr"
    run_pipeline("--input", f"{dirty}/ok/*.jsonl", "--output", out2, "--tokenizer", "bytes")
    check_flat_tokens(out2, "--input", f"{dirty}/ok/*.jsonl", "--tokenizer", "bytes")


@pytest.mark.slow
def test_zst_and_gz_inputs_hold_the_same_documents_as_plain(tmp_path):
    texts = [f"compressed document {i} ✓" for i in range(200)]
    plain = write_jsonl(tmp_path / "plain" / "c.jsonl", texts)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "c.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    (tmp_path / "zst").mkdir()
    (tmp_path / "zst" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    for kind in ("plain", "gz", "zst"):
        run_pipeline("--input", tmp_path / kind, "--output", tmp_path / f"{kind}.zarr", "--tokenizer", "bytes")
    # Same relative place (input 0, c.jsonl[.gz|.zst] differ in name) -> same multiset; plain vs gz compared by checker.
    check_flat_tokens(tmp_path / "gz.zarr", "--input", str(tmp_path / "gz" / "c.jsonl.gz"), "--tokenizer", "bytes")
    check_flat_tokens(tmp_path / "zst.zarr", "--input", str(plain), "--tokenizer", "bytes")


@pytest.mark.slow
def test_the_rejected_limit_is_checked_over_the_whole_input(tmp_path):
    """One file is 50% bad, but the corpus is 0.1% bad: a per-file or per-bundle check would fail."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a-bad.jsonl").write_bytes(good(0) + b"\n{broken\n")
    write_jsonl(tmp_path / "in" / "b-good.jsonl", [f"fine {i}" for i in range(999)])
    run_pipeline("--input", tmp_path / "in", "--output", tmp_path / "ok.zarr", "--tokenizer", "bytes",
                 "--max_rejected_fraction", "0.0011", "--num_shards", "3")
    proc = run_pipeline("--input", tmp_path / "in", "--output", tmp_path / "fail.zarr", "--tokenizer", "bytes",
                        "--max_rejected_fraction", "0.0005", check=False)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    assert "1 of 1001 non-blank input lines were rejected" in message
    assert "invalid_json 1" in message and "fail.zarr.rejected" in message
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "fail.zarr").exists() or verify.verify_dataset(str(tmp_path / "fail.zarr"))
    report = list((tmp_path / "fail.zarr.rejected").glob("*.jsonl"))
    assert len(report) == 1 and json.loads(report[0].read_text())["line"] == 2


@pytest.mark.slow
def test_a_deeply_nested_line_is_a_rejected_line(tmp_path):
    """Deeper than orjson's 1,024 levels, the fallback `json` raised RecursionError: the
    launcher's look at the first lines (this file starts with one) printed a traceback."""
    deep = b'{"text": "deep", "meta": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    fine = b'{"text": "fine", "meta": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([deep] + [json.dumps({"text": f"document {i}"}).encode() for i in range(3)]
                                + [fine]) + b"\n")
    out = tmp_path / "o.zarr"
    run_pipeline("--input", path, "--tokenizer", "bytes", "--output", out, "--max_rejected_fraction", "0.5")
    stats = zarr.open_group(str(out), mode="r").attrs["stats"]
    assert stats["documents"] == 4 and stats["rejected_by_reason"] == {"too_deeply_nested": 1}
    [report] = (tmp_path / "o.zarr.rejected").glob("*.jsonl")
    row = json.loads(report.read_text())
    assert (row["line"], row["reason"]) == (1, "too_deeply_nested")


def usage_error(tmp_path, *args, env=None):
    proc = run_pipeline(*args, check=False, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("flat-tokens: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.slow
def test_bad_configuration_fails_fast_naming_the_culprit(tmp_path):
    good_input = write_jsonl(tmp_path / "in.jsonl", ["hello"])
    out = ["--output", tmp_path / "o.zarr"]
    assert "nothing-*.jsonl" in usage_error(tmp_path, "--input", tmp_path / "nothing-*.jsonl", *out, "--tokenizer", "bytes")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    msg = usage_error(tmp_path, "--input", tmp_path / "broken.jsonl.gz", *out, "--tokenizer", "bytes")
    assert "broken.jsonl.gz" in msg and "cannot be read" in msg
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "dangling.jsonl")
    assert "dangling.jsonl" in usage_error(tmp_path, "--input", tmp_path / "dangling.jsonl", *out, "--tokenizer", "bytes")
    assert "missing.json" in usage_error(tmp_path, "--input", good_input, *out, "--tokenizer", tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"model": "nonsense"}')
    msg = usage_error(tmp_path, "--input", good_input, *out, "--tokenizer", tmp_path / "bad.json")
    assert "bad.json" in msg and "not a valid tokenizer.json" in msg
    msg = usage_error(tmp_path, "--input", good_input, *out, "--tokenizer", "no-such-org/no-such-model",
                      env={"HF_HUB_OFFLINE": "1"})
    assert "no-such-org/no-such-model" in msg and "hub" in msg
    (tmp_path / "a-file").write_text("x")
    msg = usage_error(tmp_path, "--input", good_input, "--output", tmp_path / "a-file" / "o.zarr", "--tokenizer", "bytes")
    assert "a-file/o.zarr" in msg and "cannot write" in msg
    assert "--ouput" in usage_error(tmp_path, "--input", good_input, "--ouput", tmp_path / "x", "--tokenizer", "bytes")
    assert "--tokenizer is required" in usage_error(tmp_path, "--input", good_input, *out)
    assert "--validation_fraction" in usage_error(tmp_path, "--input", good_input, *out, "--tokenizer", "bytes",
                                                  "--validation_fraction", "1.5")
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.slow
def test_a_rejected_output_that_cannot_take_the_report_is_refused_at_launch(tmp_path):
    """It was found after the whole run, when the report was written: exit 1."""
    from tests.test_inputs import run_where_permissions_apply
    corpus = tmp_path / "in.jsonl"
    corpus.write_bytes(good(0) + b"\n{broken\n")
    common = ["--input", corpus, "--tokenizer", "bytes", "--max_rejected_fraction", "1"]
    (tmp_path / "a-file").write_text("mine")
    msg = usage_error(tmp_path, *common, "--output", tmp_path / "o.zarr", "--rejected_output", tmp_path / "a-file")
    assert "--rejected_output" in msg and "a-file: is a file, not a directory" in msg, msg
    assert (tmp_path / "a-file").read_text() == "mine" and not (tmp_path / "o.zarr").exists()
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o555)
    try:
        proc = run_where_permissions_apply(*common, "--output", tmp_path / "p.zarr", "--rejected_output", locked)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"--rejected_output {locked}: cannot write there" in proc.stderr, proc.stderr
    finally:
        os.chmod(locked, 0o755)
    assert list(locked.iterdir()) == []


def test_a_temp_location_that_is_not_a_directory_is_one_line(tmp_path):
    """It was a traceback from tempfile.mkdtemp."""
    corpus = write_jsonl(tmp_path / "in.jsonl", ["hello"])
    msg = usage_error(tmp_path, "--input", corpus, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr",
                      "--temp_location", tmp_path / "no-such-dir")
    assert f"--temp_location {tmp_path / 'no-such-dir'}: not a writable directory" in msg, msg


def keyed_records(n, start=0):
    """Records whose text is under `content`, beside a short string `id` and a nested `meta`."""
    return [{"id": f"doc-{i}", "content": f"the text of document {i}, longer than its id",
             **({"meta": {"n": i}} if i % 4 == 0 else {})} for i in range(start, start + n)]


def write_records(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
@pytest.mark.slow
def test_a_wrong_text_key_is_refused_at_launch_naming_the_keys_there_are(tmp_path, bpe_tokenizer, tokenizer):
    """It used to run and reject 100% of the lines as missing_text_key, with no hint."""
    corpus = write_records(tmp_path / "corpus.jsonl", keyed_records(300))
    msg = usage_error(tmp_path, "--input", corpus, "--output", tmp_path / "o.zarr",
                      "--tokenizer", "bytes" if tokenizer == "bytes" else bpe_tokenizer)
    assert "--text_key text" in msg and str(corpus) in msg, msg
    # the keys the records do have, most common first, and the one that holds their text
    keys = msg.split("their keys: ", 1)[1]
    assert keys in ("content (256), id (256), meta (64); use --text_key content",
                    "id (256), content (256), meta (64); use --text_key content"), msg
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "o.zarr.rejected").exists()


@pytest.mark.slow
def test_a_text_key_missing_later_in_the_input_fails_the_job_with_the_same_hint(tmp_path):
    """The launch check sees documents in the first file; the second file names its text otherwise."""
    write_jsonl(tmp_path / "in" / "a.jsonl", [f"fine {i}" for i in range(10)])
    write_records(tmp_path / "in" / "b.jsonl", keyed_records(40))
    proc = run_pipeline("--input", tmp_path / "in", "--output", tmp_path / "o.zarr", "--tokenizer", "bytes",
                        check=False)
    assert proc.returncode == 1, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert "40 of 50 non-blank input lines were rejected" in message and "missing_text_key 40" in message
    assert "Is --text_key right?" in message and "use --text_key content" in message, message
    assert "id (16), content (16)" in message or "content (16), id (16)" in message, message


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_hub_name_without_network_fails_at_once_with_one_message(tmp_path):
    """The hub client used to retry an unreachable hub five times (~25 s), printing each retry twice."""
    corpus = write_jsonl(tmp_path / "in.jsonl", ["hello"])
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf-home"),
           "HF_HUB_OFFLINE": ""}
    proc = run_pipeline("--input", corpus, "--output", tmp_path / "o.zarr", "--tokenizer", "gpt2", env=env,
                        check=False, timeout=20)  # a hang guard, not a measurement
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("flat-tokens: error: --tokenizer gpt2:") and "hub is out of reach" in proc.stderr


@pytest.mark.slow
def test_a_hub_name_is_loaded_from_the_local_cache_without_network(tmp_path):
    """What the HuggingFace cache holds (as hf_hub_download stores it) is used when the hub is out of reach."""
    snapshot = tmp_path / "hf-home" / "hub" / "models--some-org--some-tokenizer" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(SAMPLE / "tokenizer.json", snapshot / "tokenizer.json")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    corpus = write_jsonl(tmp_path / "in.jsonl", ["hello", "world"])
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf-home"),
           "HF_HUB_OFFLINE": ""}
    run_pipeline("--input", corpus, "--output", tmp_path / "o.zarr", "--tokenizer", "some-org/some-tokenizer",
                 env=env, timeout=120)
    assert zarr.open_group(str(tmp_path / "o.zarr"), mode="r").attrs["tokenizer"]["kind"] == "hub"
    check_flat_tokens(tmp_path / "o.zarr", "--input", corpus, "--tokenizer", SAMPLE / "tokenizer.json")
