"""Chunk and shard sizes a writer cannot hold in memory are refused at launch (exit 2, the
option named, what it would need), before any input is read (issue 27.7): a shard of 1e9
chunks used to grow to 23 GB and be killed without a word, a chunk of 1e12 tokens to fail
with MemoryError after the whole input was read."""
import os

import pytest

from pipeline.options import FlatTokensOptions, OptionError, ViewsMadeOnce
from pipeline.local.write_memory import MAX_BLOCK_BYTES, check_write_memory
from tests.helpers import run_pipeline, write_jsonl


def options(*args) -> FlatTokensOptions:
    return ViewsMadeOnce(["--input", "in.jsonl", "--tokenizer", "bytes", "--output", "o.zarr", *args]).view_as(
        FlatTokensOptions)


@pytest.mark.parametrize("sizes, named", [
    (["--zarr_format", "3", "--chunks_per_shard", "1000000000"],
     "--tokens_chunk_size 262144 with --chunks_per_shard 1000000000: a writer holds a whole encoded_tokens shard "
     "of 1,000,000,000 chunks in memory (2,861.0 TiB per block)"),
    (["--tokens_chunk_size", "1000000000000"],
     "--tokens_chunk_size 1000000000000: a writer holds a whole encoded_tokens chunk in memory (10.9 TiB per block"),
])
@pytest.mark.slow
def test_sizes_no_writer_can_hold_are_refused_before_any_input_is_read(tmp_path, sizes, named):
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)  # reading it would wait forever; listing it is refused: the check comes first
    proc = run_pipeline("--input", fifo, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr", *sizes,
                        check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"flat-tokens: error: {named}"), message
    assert "or smaller" in message or "or fewer" in message, message
    assert not (tmp_path / "o.zarr").exists()


def test_the_bound_is_the_machines_memory_and_the_advice_fits_it():
    big = options("--tokens_chunk_size", str(1 << 24))  # 64 MiB of tokens: 192 MiB per chunk, 4+ at once
    check_write_memory(big, memory=64 << 30)
    with pytest.raises(OptionError, match=r"more than half of this machine's 512\.0 MiB of memory; use "
                                          r"--tokens_chunk_size (\d+) or smaller") as refused:
        check_write_memory(big, memory=512 << 20)
    advised = int(refused.value.args[0].rsplit("--tokens_chunk_size ", 1)[1].split()[0])
    check_write_memory(options("--tokens_chunk_size", str(advised)), memory=512 << 20)
    with pytest.raises(OptionError):
        check_write_memory(options("--tokens_chunk_size", str(advised + 1)), memory=512 << 20)


def test_a_block_larger_than_the_documented_bound_is_refused_on_any_machine():
    too_big = options("--zarr_format", "3", "--chunks_per_shard", str(MAX_BLOCK_BYTES // (3 * 4 * 262144) + 1))
    with pytest.raises(OptionError, match="more than the 2.0 GiB a block may take"):
        check_write_memory(too_big, memory=1 << 50)
    check_write_memory(options("--zarr_format", "3", "--chunks_per_shard", "64"), memory=8 << 30)


@pytest.mark.slow
def test_the_defaults_fit_a_small_machine(tmp_path):
    check_write_memory(options(), memory=2 << 30)
    src = write_jsonl(tmp_path / "in.jsonl", ["one", "two"])
    run_pipeline("--input", src, "--tokenizer", "bytes", "--output", tmp_path / "o.zarr", "--zarr_format", "3",
                 "--chunks_per_shard", "64", "--quiet")
