"""The manifest binds every object of a dataset to its key and its build (issue 37, items 1-4
and 7): chunks swapped, copied from another build or another split, a sharded chunk's index
entry set to "empty", a removed checksum attribute, and files that would make a tool hang
or allocate without bound. Each is done to a dataset the pipeline wrote, as a user's tools
would (mv, cp, an editor), and every reader must refuse it, naming the object."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import google_crc32c
import numpy as np
import pytest

from flat_tokens.tools import verify
from flat_tokens.blend import Blend
from flat_tokens.read_guard import CorruptChunk, DatasetError
from flat_tokens.reader import FlatTokensSplit
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, remove_manifest, run_pipeline, write_jsonl

CHUNK = 4096
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def corpus(path):
    """40 documents of ~20,000 bytes: with 4096-token chunks (the bytes tokenizer), most
    chunks lie inside one document and hold no sequence start, so nothing but the manifest
    tells one such chunk from another."""
    rng = np.random.default_rng(7)
    texts = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 3000)) for _ in range(40)]
    return write_jsonl(path / "corpus.jsonl", texts)


def write(out, source, *extra, env=None):
    run_pipeline("--input", source, "--tokenizer", "bytes", "--output", out, "--tokens_chunk_size", str(CHUNK),
                 "--seq_starts_chunk_size", "16", "--validation_fraction", "0.1", *extra, env=env)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two builds of one corpus (seeds 0 and 1): A is damaged, B is where foreign objects come from."""
    base = tmp_path_factory.mktemp("manifest")
    source = corpus(base)
    return write(base / "a.zarr", source), write(base / "b.zarr", source, "--seed", "1")


@pytest.fixture
def dataset(built, tmp_path):
    return shutil.copytree(built[0], tmp_path / "a.zarr", symlinks=True)


def serve_all(root, split="train"):
    s = FlatTokensSplit(str(root), split)
    return [*s.iter_encoded()]


def verify_problems(root) -> list[str]:
    return verify.verify_dataset(str(root))


def inner_chunks_without_starts(root, split="train") -> list[int]:
    """Chunk indices of encoded_tokens that hold no sequence start (read from the intact dataset)."""
    s = FlatTokensSplit(str(root), split)
    encoded = np.concatenate(list(s.iter_encoded()))
    return [i for i in range(encoded.size // CHUNK) if not (encoded[i * CHUNK:(i + 1) * CHUNK] & 1).any()]


# ---------------------------------------------------------------------------------------------
# Item 1: swapped and foreign chunks


def test_swapped_chunks_are_refused_by_the_reader_and_verify_naming_both(dataset):
    a, b = inner_chunks_without_starts(dataset)[:2]
    tokens = dataset / "train" / "encoded_tokens"
    first, second = (tokens / str(a)).read_bytes(), (tokens / str(b)).read_bytes()
    (tokens / str(a)).write_bytes(second)
    (tokens / str(b)).write_bytes(first)
    with pytest.raises(CorruptChunk) as e:
        serve_all(dataset)
    named = re.search(r"chunk train/encoded_tokens/(\d+) does not match the manifest .* holds the bytes the "
                      r"manifest lists for train/encoded_tokens/(\d+)", str(e.value))
    assert named and {int(named[1]), int(named[2])} == {a, b}, str(e.value)
    assert str(e.value).startswith(f"{dataset}: ")
    problems = verify_problems(dataset)
    # verify reads chunks on several threads: either of the two may be the one it names first
    found = [re.search(r"chunk train/encoded_tokens/(\d+) does not match the manifest .* lists for "
                       r"train/encoded_tokens/(\d+)", p) for p in problems]
    assert any(m and {int(m[1]), int(m[2])} == {a, b} for m in found), problems


def test_a_chunk_copied_from_another_build_is_refused(built, dataset):
    i = inner_chunks_without_starts(dataset)[0]
    foreign = built[1] / "train" / "encoded_tokens" / str(i)
    assert foreign.read_bytes() != (dataset / "train" / "encoded_tokens" / str(i)).read_bytes()
    shutil.copyfile(foreign, dataset / "train" / "encoded_tokens" / str(i))
    with pytest.raises(CorruptChunk, match=f"chunk train/encoded_tokens/{i} .*another build"):
        serve_all(dataset)
    assert any(f"chunk train/encoded_tokens/{i}" in p for p in verify_problems(dataset))


def test_blend_refuses_a_swapped_chunk(dataset):
    a, b = inner_chunks_without_starts(dataset)[:2]
    tokens = dataset / "train" / "encoded_tokens"
    first, second = (tokens / str(a)).read_bytes(), (tokens / str(b)).read_bytes()
    (tokens / str(a)).write_bytes(second)
    (tokens / str(b)).write_bytes(first)
    blend = Blend([FlatTokensSplit(str(dataset))], weights=[1.0], seed=0)
    batches = blend.packed_batches(1024, 8)
    with pytest.raises(CorruptChunk, match="does not match the manifest"):
        for _ in range(10 ** 4):  # endless: every window, then on
            next(batches)


# ---------------------------------------------------------------------------------------------
# Item 3: checksums cannot be downgraded by editing attributes


def edit_root(root, edit):
    attrs = json.loads((root / ".zattrs").read_text())
    edit(attrs)
    (root / ".zattrs").write_text(json.dumps(attrs))


def flip(path, byte: int):
    data = bytearray(path.read_bytes())
    data[byte] ^= 4
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("removed", ["storage.checksums", "and the seal", "and the seal and the manifest"])
def test_removing_the_checksum_attribute_does_not_turn_checks_off(dataset, removed):
    def edit(attrs):
        del attrs["storage"]["checksums"]
        if removed != "storage.checksums":
            del attrs["manifest"]
    edit_root(dataset, edit)
    if removed == "and the seal and the manifest":
        (dataset / "flat-tokens-manifest.json").unlink()
    flip(dataset / "train" / "encoded_tokens" / "3", 200)
    with pytest.raises(DatasetError):
        serve_all(dataset)
    problems = verify_problems(dataset)
    assert problems, "verify passed a dataset with a flipped chunk"
    if removed != "and the seal and the manifest":  # the attributes no longer match the manifest's seal
        assert any("seal" in p for p in problems), problems
    else:  # read as a dataset from before manifests: the chunk's own checksum frame still decides
        assert any("chunk train/encoded_tokens/3 is damaged" in p for p in problems), problems


def test_an_edited_root_attribute_is_refused(dataset):
    edit_root(dataset, lambda attrs: attrs["stats"]["train"].update(max_token_id=1))
    with pytest.raises(DatasetError, match="seal"):
        FlatTokensSplit(str(dataset))
    assert any("seal" in p for p in verify_problems(dataset))


def test_an_edited_split_attribute_or_array_metadata_is_refused(dataset):
    zattrs = dataset / "train" / ".zattrs"
    zattrs.write_text(json.dumps({**json.loads(zattrs.read_text()), "max_token_id": 10 ** 6}))
    with pytest.raises(DatasetError, match="train/.zattrs does not match the manifest"):
        FlatTokensSplit(str(dataset))
    assert any("train/.zattrs does not match the manifest" in p for p in verify_problems(dataset))


def test_a_dataset_from_before_manifests_reads_as_before_and_verify_says_so(dataset, capsys):
    expected = serve_all(dataset)
    edit_root(dataset, lambda attrs: attrs.pop("manifest"))
    (dataset / "flat-tokens-manifest.json").unlink()
    assert all(np.array_equal(x, y) for x, y in zip(serve_all(dataset), expected))
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", str(dataset)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "has no manifest" in proc.stderr, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# Item 4: a split copied from another dataset


def test_a_split_copied_from_another_build_is_refused_by_reader_inspect_and_export(built, dataset, tmp_path):
    shutil.rmtree(dataset / "validation")
    shutil.copytree(built[1] / "validation", dataset / "validation")
    with pytest.raises(DatasetError, match="validation/"):
        serve_all(dataset, "validation")
    assert any("validation/" in p and "manifest" in p for p in verify_problems(dataset))
    inspect = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", str(dataset)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert inspect.returncode != 0 and "validation/" in inspect.stderr, inspect.stdout + inspect.stderr
    export = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", str(dataset),
                             str(tmp_path / "mega" / "d")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert export.returncode != 0 and "validation/" in export.stderr, export.stdout + export.stderr


# ---------------------------------------------------------------------------------------------
# Item 2: zarr 3 sharding, an inner chunk's index entry set to "empty"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    base = tmp_path_factory.mktemp("sharded")
    return write(base / "s.zarr", corpus(base), "--zarr_format", "3", "--chunks_per_shard", "4")


def empty_index_entry(shard_path, inner: int, chunks_per_shard: int = 4):
    """Sets the shard index entry of inner chunk `inner` to (2**64-1, 2**64-1), "empty", and
    recomputes the index's CRC-32C: a well-formed shard that zarr reads as fill values."""
    data = bytearray(shard_path.read_bytes())
    size = chunks_per_shard * 16
    index = bytearray(data[-size - 4:-4])
    index[inner * 16:(inner + 1) * 16] = struct.pack("<QQ", 2 ** 64 - 1, 2 ** 64 - 1)
    data[-size - 4:] = bytes(index) + struct.pack("<I", google_crc32c.value(bytes(index)))
    shard_path.write_bytes(bytes(data))


def test_zarr3_sharded_an_emptied_index_entry_is_refused(sharded, tmp_path):
    root = shutil.copytree(sharded, tmp_path / "s.zarr")
    empty_index_entry(root / "train" / "encoded_tokens" / "c" / "1", 2)
    with pytest.raises(CorruptChunk, match="chunk train/encoded_tokens/c/1"):
        serve_all(root)
    # A window inside the emptied inner chunk: zarr reads it by byte range; the shard is checked whole.
    with pytest.raises(CorruptChunk, match="chunk train/encoded_tokens/c/1"):
        FlatTokensSplit(str(root)).packed((4 * CHUNK + 2 * CHUNK) // 16, 16)
    assert any("chunk train/encoded_tokens/c/1" in p for p in verify_problems(root))


def test_zarr3_sharded_swapped_shards_are_refused(sharded, tmp_path):
    root = shutil.copytree(sharded, tmp_path / "s.zarr")
    shards = root / "train" / "encoded_tokens" / "c"
    one, two = (shards / "1").read_bytes(), (shards / "2").read_bytes()
    (shards / "1").write_bytes(two)
    (shards / "2").write_bytes(one)
    with pytest.raises(CorruptChunk, match="train/encoded_tokens/c/2"):
        serve_all(root)


# ---------------------------------------------------------------------------------------------
# Item 7: bounded resources


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_chunk_that_is_not_a_regular_file_is_refused_without_reading_it(dataset, kind):
    path = dataset / "train" / "encoded_tokens" / "2"
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    with pytest.raises(CorruptChunk, match="chunk train/encoded_tokens/2 is not a regular file"):
        serve_all(dataset)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", str(dataset)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "chunk train/encoded_tokens/2 is not a regular file" in proc.stdout, \
        proc.stdout + proc.stderr


@pytest.mark.parametrize("manifest", [True, False], ids=["with a manifest", "from before manifests"])
def test_a_forged_huge_shape_is_refused_before_anything_is_sized_by_it(dataset, manifest):
    if not manifest:
        remove_manifest(dataset)
    meta_path = dataset / "train" / "encoded_tokens" / ".zarray"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "shape": [2 ** 34], "chunks": [4]}))
    # A limit on the address space: the old verify grew to 23 GB here.
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
    code = limit + "import sys; from flat_tokens.tools.verify import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, str(dataset)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "encoded_tokens" in proc.stdout and "Traceback" not in proc.stderr, \
        proc.stdout + proc.stderr[-2000:]
    if manifest:  # without one, the reader's own checks of shapes are issue 37's items 5-6
        with pytest.raises(DatasetError, match="train/encoded_tokens/.zarray does not match the manifest"):
            serve_all(dataset)


@pytest.mark.parametrize("field", ["filters", "dtype"])
def test_a_codec_or_dtype_this_format_does_not_use_is_refused_naming_the_field(dataset, field):
    remove_manifest(dataset)
    meta_path = dataset / "train" / "encoded_tokens" / ".zarray"
    meta = json.loads(meta_path.read_text())
    meta[field] = [{"id": "pickle"}] if field == "filters" else "|O"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=f"train/encoded_tokens/.zarray.*{field}"):
        serve_all(dataset)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", str(dataset)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# Items 1-4 on GCS (the emulator)


GS_READ = """
import sys
from flat_tokens.reader import DatasetError, FlatTokensSplit
try:
    for split in ("train", "validation"):
        list(FlatTokensSplit(sys.argv[1], split).iter_encoded())
except DatasetError as e:
    print(e)
"""


@pytest.mark.slow
def test_gs_swaps_foreign_chunks_downgrades_and_split_copies_are_refused(gcs, tmp_path):
    source = corpus(tmp_path)
    url = f"gs://{BUCKET}/manifest/a.zarr"
    other = f"gs://{BUCKET}/manifest/b.zarr"
    write(url, source, env=gcs.env)
    write(other, source, "--seed", "1", env=gcs.env)
    fs, a, b = gcs.fs, f"{BUCKET}/manifest/a.zarr", f"{BUCKET}/manifest/b.zarr"
    env = {**os.environ, **gcs.env}

    def refused(expect: str):
        for code in (["-c", GS_READ, url], ["-m", "flat_tokens.tools.verify", url]):
            proc = subprocess.run([sys.executable, *code], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert expect in proc.stdout, (code, proc.stdout + proc.stderr)

    original = {k: fs.cat_file(f"{a}/train/encoded_tokens/{k}") for k in (5, 6)}
    fs.pipe_file(f"{a}/train/encoded_tokens/5", original[6])  # item 1: a swap
    fs.pipe_file(f"{a}/train/encoded_tokens/6", original[5])
    refused("train/encoded_tokens/6")
    fs.pipe_file(f"{a}/train/encoded_tokens/6", fs.cat_file(f"{b}/train/encoded_tokens/6"))  # item 1: foreign
    fs.pipe_file(f"{a}/train/encoded_tokens/5", original[5])
    refused("chunk train/encoded_tokens/6 does not match the manifest")
    fs.pipe_file(f"{a}/train/encoded_tokens/6", original[6])
    for key in fs.find(f"{a}/validation"):  # item 4: a split copied from the other build
        fs.rm(key)
    for key in fs.find(f"{b}/validation"):
        fs.pipe_file(a + key[len(b):], fs.cat_file(key))
    refused("validation/")
    attrs = json.loads(fs.cat_file(f"{a}/.zattrs"))  # item 3: a downgrade
    del attrs["storage"]["checksums"]
    fs.pipe_file(f"{a}/.zattrs", json.dumps(attrs).encode())
    refused("seal")


@pytest.mark.slow
def test_gs_zarr3_sharded_an_emptied_index_entry_is_refused(gcs, tmp_path):
    url = f"gs://{BUCKET}/manifest/s.zarr"
    write(url, corpus(tmp_path), "--zarr_format", "3", "--chunks_per_shard", "4", env=gcs.env)
    key = f"{BUCKET}/manifest/s.zarr/train/encoded_tokens/c/1"
    local = tmp_path / "shard"
    local.write_bytes(gcs.fs.cat_file(key))
    empty_index_entry(local, 2)
    gcs.fs.pipe_file(key, local.read_bytes())
    env = {**os.environ, **gcs.env}
    for code in (["-c", GS_READ, url], ["-m", "flat_tokens.tools.verify", url]):
        proc = subprocess.run([sys.executable, *code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert "chunk train/encoded_tokens/c/1 does not match the manifest" in proc.stdout, proc.stdout + proc.stderr
