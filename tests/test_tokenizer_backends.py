"""The fast tokenizer backend gives HF's ids, and the guard catches one that does not."""
import numpy as np
import pytest

from tests.helpers import check_flat_tokens, run_pipeline, write_jsonl
from tests.wrong_backends import RARE_MARKER
from transforms.tokenize import backends


def test_fastokens_agrees_with_hf_on_tricky_strings_and_real_text(bpe_tokenizer, corpus):
    json_text = bpe_tokenizer.read_text()
    texts = backends.TRICKY_STRINGS + [line for p in sorted(corpus.glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert backends.first_mismatch(backends.make_encoder("hf", json_text),
                                   backends.make_encoder("fastokens", json_text), texts) is None


def test_first_mismatch_points_at_the_differing_text():
    ref = lambda texts: (np.array([1, 2, 3, 4]), np.array([2, 2]))  # noqa: E731
    bad = lambda texts: (np.array([1, 2, 3, 5]), np.array([2, 2]))  # noqa: E731
    i, want, got = backends.first_mismatch(ref, bad, ["a", "b"])
    assert i == 1 and want.tolist() == [3, 4] and got.tolist() == [3, 5]


def test_the_guard_sample_is_deterministic_and_about_the_requested_size():
    offsets = np.arange(100_000, dtype=np.uint64) * np.uint64(80)
    a = backends.guard_sample("0:f.jsonl", offsets, 0.01)
    assert np.array_equal(a, backends.guard_sample("0:f.jsonl", offsets, 0.01))
    assert 800 < a.sum() < 1200


@pytest.mark.slow
def test_auto_backend_output_is_identical_to_hf(tmp_path, corpus, bpe_tokenizer):
    common = ["--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer]
    run_pipeline(*common, "--output", tmp_path / "hf.zarr", "--tokenizer_backend", "hf")
    run_pipeline(*common, "--output", tmp_path / "auto.zarr")
    check_flat_tokens(tmp_path / "auto.zarr", "--compare", tmp_path / "hf.zarr")
    import zarr
    assert zarr.open_group(str(tmp_path / "auto.zarr"), mode="r").attrs["tokenizer"]["backend"] == "fastokens"


def test_the_pre_run_guard_refuses_a_backend_that_disagrees(tmp_path, corpus, bpe_tokenizer):
    proc = run_pipeline("--input", f"{corpus}/*.jsonl", "--tokenizer", bpe_tokenizer, "--output", tmp_path / "o.zarr",
                        "--tokenizer_backend", "tests.wrong_backends:wrong_on_accents", check=False)
    assert proc.returncode == 2
    assert "disagrees with HuggingFace tokenizers on a built-in tricky string" in proc.stderr
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.slow
def test_the_run_time_guard_fails_the_job_on_a_rare_disagreement(tmp_path, bpe_tokenizer):
    texts = [f"ordinary document {i}" for i in range(400)] + [f"a {RARE_MARKER} document"]
    write_jsonl(tmp_path / "in.jsonl", texts)
    common = ["--input", tmp_path / "in.jsonl", "--tokenizer", bpe_tokenizer,
              "--tokenizer_backend", "tests.wrong_backends:wrong_on_rare_documents"]
    # Unchecked, the wrong ids would land in the dataset: the independent checker sees it.
    run_pipeline(*common, "--output", tmp_path / "unchecked.zarr", "--tokenizer_check_fraction", "0")
    import subprocess
    import sys

    from tests.helpers import CHECKER
    proc = subprocess.run([sys.executable, str(CHECKER), str(tmp_path / "unchecked.zarr"), "--input",
                           str(tmp_path / "in.jsonl"), "--tokenizer", str(bpe_tokenizer)], capture_output=True, text=True)
    assert proc.returncode == 1 and "1 missing, 1 unexpected" in proc.stdout
    # Checked, the job fails and names the document.
    proc = run_pipeline(*common, "--output", tmp_path / "checked.zarr", "--tokenizer_check_fraction", "1", check=False)
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    offset = (tmp_path / "in.jsonl").read_bytes().index(RARE_MARKER.encode()) - len('{"text": "a ')
    assert f"the document at byte {offset} of input in.jsonl" in message, message
    assert "use --tokenizer_backend hf" in message


@pytest.mark.slow
def test_special_token_text_is_the_special_id_unless_split_special_tokens(tmp_path):
    """The default encodes `<|endoftext|>` inside a document as the special token (id 0 in the
    sample tokenizer): documented. --split_special_tokens encodes it as text, with either
    backend, and the provenance says which."""
    import zarr
    from tests.helpers import SAMPLE
    corpus = write_jsonl(tmp_path / "in.jsonl", ["a page that quotes <|endoftext|> in its text"] * 4)
    tokenizer = SAMPLE / "tokenizer.json"

    def ids(out):
        root = zarr.open_group(str(out), mode="r")
        return (np.asarray(root["train"]["encoded_tokens"][:]) >> 1).tolist(), root.attrs["tokenizer"]

    common = ["--input", corpus, "--tokenizer", tokenizer, "--validation_fraction", "0"]
    run_pipeline(*common, "--output", tmp_path / "special.zarr")
    special, recorded = ids(tmp_path / "special.zarr")
    assert special.count(0) == 4 and recorded["split_special_tokens"] is False
    for backend in ("hf", "fastokens"):
        out = tmp_path / f"split-{backend}.zarr"
        run_pipeline(*common, "--output", out, "--split_special_tokens", "--tokenizer_backend", backend)
        split, recorded = ids(out)
        assert 0 not in split and len(split) > len(special) and recorded["split_special_tokens"] is True
        assert recorded["backend"] == backend
    assert ids(tmp_path / "split-hf.zarr")[0] == ids(tmp_path / "split-fastokens.zarr")[0]
