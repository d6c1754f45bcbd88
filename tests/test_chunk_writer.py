"""The direct chunk writer stores exactly the bytes zarr's own write path stores (with the
Blosc codecs: the crc32 filter is zarr's too), or, with zstd, the frame zarr stores with a
skippable frame holding its CRC-32C after it."""
import os
import struct

import google_crc32c
import numpy as np
import pytest
import zarr
import zstandard

from transforms.write import zarr_store as store
from transforms.write.chunk_writers import _ArrayCache
from transforms.write.zarr_store import SEQ_STARTS, TOKENS, ChunkWriter, StoreTarget, ZarrWriter

TOKENS_LENGTH, SEQUENCES = 50, 9  # 50 tokens in 7-token chunks: the last chunk is partial


def files(root):
    found = {}
    for d, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                found[os.path.relpath(os.path.join(d, n), root)] = f.read()
    return found


@pytest.mark.parametrize("codec", ["zstd", "blosc-zstd", "blosc-lz4"])
def test_direct_chunks_are_byte_identical_to_zarrs_own(tmp_path, codec):
    rng = np.random.default_rng(1)
    values = {TOKENS: rng.integers(0, 100_000, TOKENS_LENGTH).astype(np.uint32),
              SEQ_STARTS: np.sort(rng.integers(0, TOKENS_LENGTH, SEQUENCES + 1)).astype(np.uint64)}
    written = {}
    for how, writer_class in (("zarr", ZarrWriter), ("direct", ChunkWriter)):
        target = StoreTarget(url=str(tmp_path / how), tokens_chunk=7, seq_starts_chunk=3, codec=codec, run_id="r")
        store.create_split(target, "train", TOKENS_LENGTH, SEQUENCES)
        cache = _ArrayCache(target)
        cache.get("train", TOKENS)  # the pool
        for name, v in values.items():
            writer = (writer_class(target, "train", name, cache._pool) if writer_class is ChunkWriter
                      else writer_class(target, "train", name))
            chunk = target.chunk(name)
            writer.write(0, v[:2 * chunk])  # two whole chunks
            writer.write(2 * chunk, v[2 * chunk:])  # the rest, up to the array's end
        cache.close()
        written[how] = files(tmp_path / how)
        g = zarr.open_group(str(tmp_path / how / "train"), mode="r")
        assert all(np.array_equal(g[name][:], v) for name, v in values.items())
    assert written["direct"].keys() == written["zarr"].keys()
    if codec != "zstd":
        assert written["direct"] == written["zarr"]
        return
    for key, direct in written["direct"].items():
        if os.path.basename(key).startswith("."):  # metadata: the same plain zstd codec
            assert direct == written["zarr"][key]
            continue
        frame, trailer = direct[:-12], direct[-12:]
        magic, size, crc = struct.unpack("<III", trailer)
        assert (magic & 0xFFFFFFF0, size, crc) == (0x184D2A50, 4, google_crc32c.value(frame)), key
        assert frame == written["zarr"][key]
        decoder = zstandard.ZstdDecompressor()
        assert decoder.decompress(direct) == decoder.decompress(written["zarr"][key]), key


def test_a_write_that_is_not_whole_chunks_is_refused(tmp_path):
    target = StoreTarget(url=str(tmp_path / "o"), tokens_chunk=7, seq_starts_chunk=3, run_id="r")
    store.create_split(target, "train", TOKENS_LENGTH, SEQUENCES)
    cache = _ArrayCache(target)
    writer = cache.get("train", TOKENS)
    assert isinstance(writer, ChunkWriter)
    for start, size in ((3, 7), (0, 8), (7, 41)):
        with pytest.raises(ValueError, match="not made of whole chunks"):
            writer.write(start, np.zeros(size, np.uint32))
    cache.close()
