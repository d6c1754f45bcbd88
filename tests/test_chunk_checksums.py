"""Every chunk carries a checksum that every read checks (issue 27, item 1), and a chunk that
cannot be read is named with its dataset (item 9): on datasets the pipeline writes, locally
and on the GCS emulator. The checksums are checked here with libraries of their own
(google-crc32c, zlib, zstandard), not with the code that writes them."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr
import zstandard

from flat_tokens.tools import verify
from flat_tokens.read_guard import CorruptChunk, DatasetError
from flat_tokens.reader import FlatTokensSplit
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, SAMPLE, run_pipeline

CHUNK = 16384


def write(out, *extra, env=None):
    run_pipeline("--input", SAMPLE / "*.jsonl", "--tokenizer", "bytes", "--output", out, "--tokens_chunk_size",
                 str(CHUNK), "--seq_starts_chunk_size", "128", "--record_sources", "--validation_fraction", "0.05",
                 "--rejected_output", f"{out}.rejected", *extra, env=env)
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write(tmp_path_factory.mktemp("checksums") / "d.zarr")


@pytest.fixture
def dataset(written, tmp_path):
    """A fresh copy of the pipeline's dataset (zarr 2, zstd), for a test to damage."""
    return shutil.copytree(written, tmp_path / "d.zarr")


def chunk_files(root):
    return sorted(p for p in root.glob("*/*/*") if p.is_file() and not p.name.startswith("."))


def everything(root) -> list:
    """What the reader serves of both splits: every sequence (encoded) and every source id."""
    out = []
    for split in ("train", "validation"):
        s = FlatTokensSplit(str(root), split)
        out += [*s.iter_encoded(), s.sources(slice(0, len(s)))]
    return out


def flipped(path, byte: int, bit: int = 0) -> bytes:
    data = bytearray(path.read_bytes())
    data[byte] ^= 1 << bit
    path.write_bytes(bytes(data))
    return bytes(data)


# ---------------------------------------------------------------------------------------------
# What the chunks carry


@pytest.mark.slow
def test_zarr2_zstd_chunks_are_checksummed_zstd_frames_that_any_zstd_decoder_reads(dataset):
    assert json.loads((dataset / ".zattrs").read_text())["storage"]["checksums"] == "zstd+crc32c-frame"
    for array in ("encoded_tokens", "seq_starts", "seq_sources"):
        meta = json.loads((dataset / "train" / array / ".zarray").read_text())
        # The plain config every numcodecs reads: "checksum": true made numcodecs < 0.13 refuse it.
        assert (meta["compressor"], meta["filters"]) == ({"id": "zstd", "level": 1}, None)
    files = chunk_files(dataset)
    assert len(files) > 10
    for path in files:
        data = path.read_bytes()
        frame, (magic, size, crc) = data[:-12], struct.unpack("<III", data[-12:])
        assert 0x184D2A50 <= magic <= 0x184D2A5F and size == 4, path  # a zstd skippable frame
        assert crc == google_crc32c.value(frame), path
        # Any zstd decoder skips the skippable frame: zstandard as zarr's numcodecs does.
        assert zstandard.ZstdDecompressor().decompress(data) == numcodecs.Zstd().decode(data), path
    train = zarr.open_group(str(dataset), mode="r")["train"]  # plain zarr reads it, unchecked
    served = np.concatenate(list(FlatTokensSplit(str(dataset)).iter_encoded()))
    assert np.array_equal(train["encoded_tokens"][:], served)


@pytest.mark.slow
def test_zarr3_and_blosc_chunks_carry_crc32c_or_crc32_and_a_flip_is_found(tmp_path):
    v3 = write(tmp_path / "v3.zarr", "--zarr_format", "3", "--chunks_per_shard", "2")
    codecs = json.loads((v3 / "train" / "encoded_tokens" / "zarr.json").read_text())["codecs"][0]["configuration"]
    assert [c["name"] for c in codecs["codecs"]] == ["bytes", "zstd", "crc32c"]
    assert json.loads((v3 / "zarr.json").read_text())["attributes"]["storage"]["checksums"] == "crc32c"
    blosc = write(tmp_path / "blosc.zarr", "--codec", "blosc-lz4")
    meta = json.loads((blosc / "train" / "encoded_tokens" / ".zarray").read_text())
    assert meta["compressor"] is None and [f["id"] for f in meta["filters"]] == ["blosc", "crc32"]
    for path in chunk_files(blosc):
        data = path.read_bytes()
        assert struct.unpack("<I", data[:4])[0] == zlib.crc32(data[4:]), path
    for root, shard, message in (
            # (a shard is checked whole against the dataset's manifest before zarr reads its
            # inner chunks: issue 37)
            (v3, "train/encoded_tokens/c/0", r"chunk train/encoded_tokens/c/0 does not match the manifest"),
            (blosc, "train/encoded_tokens/0", "chunk train/encoded_tokens/0 is damaged")):
        assert verify.verify_dataset(str(root)) == []
        path = root / shard
        if root is v3:  # in the shard's second inner chunk
            index = np.frombuffer(path.read_bytes()[-(16 * 2 + 4):-4], "<u8").reshape(-1, 2)
            flipped(path, int(index[1, 0] + index[1, 1] // 2))
        else:
            flipped(path, path.stat().st_size // 2)
        problems = verify.verify_dataset(str(root))
        assert len(problems) == 1 and re.search(message, problems[0]), problems
        with pytest.raises(CorruptChunk, match=message):
            everything(root)
    # Without a manifest (a dataset from before it), zarr's crc32c codec finds the flip, and the
    # reader names the inner chunk.
    document = json.loads((v3 / "zarr.json").read_text())
    del document["attributes"]["manifest"]
    (v3 / "zarr.json").write_text(json.dumps(document))
    (v3 / "flat-tokens-manifest.json").unlink()
    with pytest.raises(CorruptChunk, match=r"chunk train/encoded_tokens/c/0 \(its inner chunk 1\)"):
        everything(v3)


# ---------------------------------------------------------------------------------------------
# Every flipped bit is found


def test_random_bit_flips_are_found_by_verify_and_by_the_reader(dataset):
    """Before issue 27, 217 of 300 such flips decoded silently to other tokens."""
    expected = everything(dataset)
    files = chunk_files(dataset)
    sizes = [p.stat().st_size for p in files]
    rng = np.random.default_rng(27)
    for _ in range(12):
        offset = int(rng.integers(sum(sizes) * 8))
        index = int(np.searchsorted(np.cumsum(sizes) * 8, offset, side="right"))
        path, offset = files[index], offset - sum(sizes[:index]) * 8
        original = path.read_bytes()
        flipped(path, offset // 8, offset % 8)
        problems = verify.verify_dataset(str(dataset))
        assert len(problems) == 1 and path.relative_to(dataset).as_posix() in problems[0], (path, problems)
        with pytest.raises(DatasetError, match=path.relative_to(dataset).as_posix()):
            everything(dataset)
        path.write_bytes(original)
    assert verify.verify_dataset(str(dataset)) == [] and all(
        np.array_equal(a, b) for a, b in zip(everything(dataset), expected))


def zstd_header_length(data: bytes) -> int:
    """Magic, frame header descriptor, window descriptor, dictionary id, content size."""
    fhd = data[4]
    single, fcs = (fhd >> 5) & 1, fhd >> 6
    return 4 + 1 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if single else 0), 2, 4, 8)[fcs]


def test_every_bit_of_a_chunks_zstd_header_and_checksums_is_covered(dataset):
    """Exhaustively: each bit of the frame header, the first block header, the last block's end
    and the CRC-32C frame. zstd's content checksum would miss some of them (below)."""
    path = dataset / "train" / "encoded_tokens" / "1"
    original = path.read_bytes()
    places = [*range(zstd_header_length(original) + 3), *range(len(original) - 16, len(original))]
    train = FlatTokensSplit(str(dataset))
    assert train.packed(1, CHUNK).size == CHUNK
    for byte in places:
        for bit in range(8):
            flipped(path, byte, bit)
            with pytest.raises(CorruptChunk, match="chunk train/encoded_tokens/1 is damaged"):
                train.packed(1, CHUNK)
            path.write_bytes(original)
    flipped(path, 4, 4)  # the frame header's unused bit: the values decode the same
    assert any("train/encoded_tokens/1" in p for p in verify.verify_dataset(str(dataset)))


def test_zstds_content_checksum_alone_misses_flips_that_decode_the_same():
    """Why chunks carry a CRC-32C of their bytes rather than zstd's content checksum: zstd
    checks the values it decodes, and some flips decode to the same values (the header's
    unused bit, a larger window)."""
    values = np.frombuffer((SAMPLE / "corpus-1.jsonl").read_bytes()[:1 << 20], np.uint8).astype(np.uint32) * 2
    frame = bytearray(numcodecs.Zstd(level=1, checksum=True).encode(values))
    silent = 0
    for byte in range(zstd_header_length(frame)):
        for bit in range(8):
            frame[byte] ^= 1 << bit
            try:
                silent += np.array_equal(np.frombuffer(numcodecs.Zstd().decode(bytes(frame)), np.uint32), values)
            except RuntimeError:
                pass
            frame[byte] ^= 1 << bit
    assert silent >= 1


# ---------------------------------------------------------------------------------------------
# Datasets without checksums; naming the chunk


def strip_checksums(root):
    """The dataset as this tool wrote it before chunks carried checksums (and before the
    commit wrote a manifest, issue 37)."""
    plain = numcodecs.Zstd(level=1)
    for path in chunk_files(root):
        path.write_bytes(plain.encode(np.frombuffer(numcodecs.Zstd().decode(path.read_bytes()), np.uint8)))
    attrs = json.loads((root / ".zattrs").read_text())
    del attrs["storage"]["checksums"]
    del attrs["manifest"]
    (root / "flat-tokens-manifest.json").unlink()
    (root / ".zattrs").write_text(json.dumps(attrs))


def test_a_dataset_written_before_checksums_is_read_and_verify_says_it_carries_none(dataset):
    expected = everything(dataset)
    strip_checksums(dataset)
    assert all(np.array_equal(a, b) for a, b in zip(everything(dataset), expected))
    assert FlatTokensSplit(str(dataset)).chunk_checksums is None
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", str(dataset)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: "), proc.stdout + proc.stderr
    assert "carry no checksums" in proc.stderr


@pytest.mark.parametrize("checksums", [True, False], ids=["with checksums", "written before them"])
def test_a_truncated_chunk_is_named_with_its_dataset(dataset, checksums):
    if not checksums:
        strip_checksums(dataset)
    path = dataset / "train" / "encoded_tokens" / "1"
    path.write_bytes(path.read_bytes()[:100])
    train = FlatTokensSplit(str(dataset))
    for read in (lambda: train.packed(1, CHUNK), lambda: list(train), lambda: train.packed_batch([0, 1], CHUNK)):
        with pytest.raises(CorruptChunk) as e:
            read()
        assert str(dataset) in str(e.value) and "chunk train/encoded_tokens/1" in str(e.value)
    problems = verify.verify_dataset(str(dataset))
    assert len(problems) == 1 and "chunk train/encoded_tokens/1" in problems[0]


@pytest.mark.slow
def test_inspect_and_export_name_a_damaged_chunk(dataset, tmp_path):
    flipped(dataset / "train" / "seq_starts" / "0", 40)
    inspect = subprocess.run([sys.executable, "-m", "flat_tokens.tools.inspect", str(dataset)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert inspect.returncode == 2 and "chunk train/seq_starts/0 is damaged" in inspect.stderr, inspect.stderr
    export = subprocess.run([sys.executable, "-m", "pipeline.export", "--format", "megatron", str(dataset),
                             str(tmp_path / "mega" / "d")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert export.returncode == 1 and "chunk train/seq_starts/0 is damaged" in export.stderr, export.stderr


GS_READER = """
import sys
from flat_tokens.reader import CorruptChunk, FlatTokensSplit
train = FlatTokensSplit(sys.argv[1])
assert train.packed(1, int(sys.argv[2])).size == int(sys.argv[2])
try:
    train.packed(2, int(sys.argv[2]))
except CorruptChunk as e:
    print(e)
"""


@pytest.mark.slow
def test_gs_a_flipped_bit_is_found_by_verify_and_the_reader(gcs, tmp_path):
    """verify and the reader as users run them (processes of their own, the emulator named by
    STORAGE_EMULATOR_HOST)."""
    url = f"gs://{BUCKET}/checksums/d.zarr"
    write(url, env=gcs.env)
    key = f"{BUCKET}/checksums/d.zarr/train/encoded_tokens/2"
    data = bytearray(gcs.fs.cat_file(key))
    data[len(data) // 2] ^= 8
    gcs.fs.pipe_file(key, bytes(data))
    env = {**os.environ, **gcs.env}
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", url], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "chunk train/encoded_tokens/2 is damaged" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-c", GS_READER, url, str(CHUNK)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.startswith(f"{url}: chunk train/encoded_tokens/2 is damaged"), proc.stdout + proc.stderr
