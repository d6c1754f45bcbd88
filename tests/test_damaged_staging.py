"""A rerun never trusts damaged staged work or damaged chunks (issue 27, items 3, 5 and 9).

Every staged file (a batch's ids and documents, a unit's account, a shard record, a shared
chunk's mark) carries a checksum written with it, and every chunk a record or mark vouches
for is checked against the size and CRC-32C that landed. Damaged since the kill, it is
redone, not reused and not fatal; the dataset is then byte-identical to an uninterrupted
run's, and the summary counts what was redone. Runs are real subprocesses, killed with
SIGKILL at moments observed in the staging area (as in tests/test_resume.py), then damaged
the way disks and hands damage files: a flipped bit, a truncation, a deletion."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flat_tokens.tools import verify
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, run_pipeline
from tests.test_resume import (area, corpus, dataset_digest, gs_dataset_digest, job_args, kill_when,
                               shards_recorded, stage_batches, staged_now)
from transforms import staging
from transforms.write.ownership import STAGING

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """(root, args, the uninterrupted run's dataset, the output path, a copy of the output as a
    SIGKILL left it with shards written, and one with shared chunks marked too)."""
    root = tmp_path_factory.mktemp("damaged")
    corpus(root / "in")
    args = job_args(root)
    ref = root / "ref.zarr"
    run_pipeline(*args, "--output", ref)
    out = root / "out.zarr"
    kill_when(args, out, lambda: shards_recorded(out) >= 6)
    shutil.copytree(out, root / "shards-written")
    shutil.rmtree(out)
    kill_when(args, out, lambda: len(list(area(out).glob("chunks/*/*"))) >= 2)
    shutil.copytree(out, root / "chunks-marked")
    return root, args, ref, out


def restore(killed, which: str = "shards-written") -> Path:
    """The output as the kill left it, at its own path (the command names the output)."""
    root, _, _, out = killed
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(root / which, out)
    return out


def flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


def a_reused_chunk(out: Path) -> Path:
    """A chunk object a staged shard record vouches for (so the rerun would reuse it)."""
    a = staging.StagingArea(str(out))
    listed = a.listing()
    name = sorted(listed.shards[listed.arrays_key].values())[0][1]
    record, _ = a.read_shard(listed.arrays_key, name)
    return out / record["split"] / record["objects"][0][0]


DAMAGE = {  # what is damaged -> (how, the kind the summary counts)
    "a staged batch's ids": (lambda out: flip(sorted(area(out).glob("units/*/*.ids"))[3]), "staged_units"),
    "a staged batch's documents": (lambda out: flip(sorted(area(out).glob("units/*/*.batch"))[0]), "staged_units"),
    "a unit's account": (lambda out: flip(sorted(area(out).glob("units/*/unit.*.json"))[0], 0.9), "staged_units"),
    "a staged batch's ids, truncated": (lambda out: sorted(area(out).glob("units/*/*.ids"))[1].write_bytes(b"\0"),
                                        "staged_units"),
    "a shard record": (lambda out: flip(sorted(area(out).glob("shards/*/*.rec"))[0]), "shard_records"),
    "a reused chunk, one bit": (lambda out: flip(a_reused_chunk(out)), "chunks"),
    "a reused chunk, truncated": (lambda out: a_reused_chunk(out).write_bytes(a_reused_chunk(out).read_bytes()[:9]),
                                  "chunks"),
    "a reused chunk, deleted": (lambda out: a_reused_chunk(out).unlink(), "chunks"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.slow
def test_damaged_staged_work_is_redone_and_counted(killed, damage, tmp_path):
    root, args, ref, _ = killed
    out = restore(killed)
    units, chunks = staged_now(out)
    how, kind = DAMAGE[damage]
    how(out)
    summary = tmp_path / "summary.json"
    proc = run_pipeline(*args, "--output", out, "--summary_json", summary)
    reused = json.loads(summary.read_text())["reused"]
    assert reused["damaged"] == {k: int(k == kind) for k in ("staged_units", "shard_records", "chunk_marks", "chunks")}
    if damage == "a unit's account":  # it no longer says which input bytes it read: no chunk can be vouched for
        assert (reused["input_units"], reused["chunks"]) == (units - 1, 0)
    elif kind == "staged_units":
        assert (reused["input_units"], reused["chunks"]) == (units - 1, chunks)
    else:  # the shard is written again: its chunks are not counted as reused
        assert reused["input_units"] == units and 0 < reused["chunks"] < chunks
    assert "damaged since they were written" in proc.stderr and "redoing them, not reusing them" in proc.stderr
    assert "resumed: reused" in proc.stdout and "redone, damaged since they were written: 1 " in proc.stdout
    assert verify.verify_dataset(str(out)) == []
    assert dataset_digest(out) == dataset_digest(ref), f"{damage}: not the uninterrupted run's bytes"


@pytest.mark.slow
def test_a_damaged_chunk_mark_or_shared_chunk_is_merged_again(killed, tmp_path):
    root, args, ref, _ = killed
    for damage in ("mark", "chunk"):
        out = restore(killed, "chunks-marked")
        a = staging.StagingArea(str(out))
        listed = a.listing()
        split, array, index = sorted(listed.chunks[listed.arrays_key])[0]
        if damage == "mark":
            flip(area(out) / "chunks" / listed.arrays_key / f"{split}.{array}.{index}")
        else:
            (key, _), = a.read_chunk_mark(listed.arrays_key, split, array, index)
            flip(out / split / key)
        summary = tmp_path / "summary.json"
        run_pipeline(*args, "--output", out, "--summary_json", summary)
        damaged = json.loads(summary.read_text())["reused"]["damaged"]
        assert damaged == {"staged_units": 0, "shard_records": 0, "chunk_marks": int(damage == "mark"),
                           "chunks": int(damage == "chunk")}, damage
        assert dataset_digest(out) == dataset_digest(ref), damage


def test_a_staged_file_damaged_after_the_launch_fails_naming_it(tmp_path):
    """The launcher checked it; damaged while the run goes on, the replay finds it, names it,
    and the rerun redoes it (the message says so)."""
    from transforms.tokenize.staged import ReplayUnitFn
    from transforms.write.finished import ReplayShardFn

    unit = "a" * 32
    a = staging.StagingArea(str(tmp_path / "out"), unit_keys={"0:a.jsonl": ([0], [unit])})
    stage_batches(a, [("0:a.jsonl", ["one", "two", "three"])])
    a.put_unit(unit, {"places": [0], "counts": {"documents": 3}, "line_counts": None, "rejected": []})
    replay = ReplayUnitFn(a)
    replay.setup()
    assert len([b for b in replay.process((unit, "unit.1.json", 10)) if hasattr(b, "ids")]) == 1
    # Near signatures staged beside their batch: replayed mapped and checked, named when damaged.
    signatures = np.arange(3 * 8, dtype=np.uint16).reshape(3, 8)
    batch = a.read_batch(unit, 0)
    batch.signatures = signatures
    beside = a.put_batch_signatures(unit, 1, signatures)
    ids = a.put_batch_ids(unit, 1, batch.ids)
    a.put_batch(unit, 1, a.batch_documents(batch, signatures_beside=True), ids, beside)
    again = a.read_batch(unit, 1)
    assert np.array_equal(again.signatures, signatures) and again.signatures_file == (a.batch_signatures_path(unit, 1), beside)
    a.check_batch(unit, 1)
    # A shape forged in a resealed `.batch` (the file's bytes still match their Sum) is refused.
    forged = a.batch_documents(batch, signatures_beside=True)
    forged.header["signatures_shape"] = [6, 4]
    a.put_batch(unit, 2, forged, ids, beside)
    os.link(a.batch_signatures_path(unit, 1), a.batch_signatures_path(unit, 2))
    os.link(a.path("units", unit, staging.place_name(1) + staging.IDS),
            a.path("units", unit, staging.place_name(2) + staging.IDS))
    with pytest.raises(staging.Damaged, match="holds 6 signatures, its documents need 3"):
        a.read_batch(unit, 2)
    flip(Path(again.signatures_file.path))
    for read in (a.read_batch, a.check_batch):
        with pytest.raises(staging.Damaged, match=f"{again.signatures_file.path}: damaged"):
            read(unit, 1)

    ids = Path(a.path("units", unit, staging.place_name(0) + staging.IDS))
    flip(ids)
    with pytest.raises(RuntimeError, match=f"{ids}: damaged.*rerun the same command"):
        list(replay.process((unit, "unit.1.json", 10)))

    a.job_key = "k" * 32
    a.put_shard("train", 3, {"split": "train", "shard": 3, "tokens": 5, "sequences": 1, "max_token_id": 9,
                             "receipts": [["encoded_tokens", 1]], "objects": []},
                [(("train", "encoded_tokens", 0), (0, np.arange(4, dtype=np.uint32)))])
    record = next(Path(a.path("shards", a.job_key)).iterdir())
    assert len(list(ReplayShardFn(a).process(record.name))) == 3
    flip(record)
    with pytest.raises(RuntimeError, match=f"{record.name}: .*damaged.*rerun the same command"):
        list(ReplayShardFn(a).process(record.name))


@pytest.mark.slow
def test_gs_damaged_staged_ids_and_a_damaged_reused_chunk_are_redone(gcs, tmp_path):
    """On GCS the checks read no chunk and no ids: the listing gives each object's CRC-32C."""
    corpus(tmp_path / "in", files=4, per_file=400)
    gcs.fs.put(str(tmp_path / "in") + "/", f"{BUCKET}/damaged/in/", recursive=True)
    args = ["--input", f"gs://{BUCKET}/damaged/in", "--tokenizer", "bytes", "--num_shards", "6",
            "--validation_fraction", "0.1", "--tokens_chunk_size", "1024", "--seq_starts_chunk_size", "64",
            "--batch_documents", "40", "--rejected_output", f"gs://{BUCKET}/damaged/rejected"]
    run_pipeline(*args, "--output", f"gs://{BUCKET}/damaged/ref.zarr", env=gcs.env)
    path = f"{BUCKET}/damaged/out.zarr"

    def records() -> list:
        gcs.fs.invalidate_cache()
        return gcs.fs.glob(f"{path}/{STAGING}/shards/*/*.rec")

    cmd = [sys.executable, "-m", "pipeline.run", *args, "--output", f"gs://{path}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **gcs.env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    while proc.poll() is None and len(records()) < 2:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before two shards were written"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    def damage(key: str) -> None:
        data = bytearray(gcs.fs.cat_file(key))
        data[len(data) // 2] ^= 0x10
        gcs.fs.pipe_file(key, bytes(data))

    gcs.fs.invalidate_cache()
    damage(sorted(gcs.fs.glob(f"{path}/{STAGING}/units/*/*.ids"))[0])
    a = staging.StagingArea(f"gs://{path}", {"endpoint_url": gcs.url, "token": "anon"})
    a._fs = gcs.fs
    listed = a.listing()
    header, _ = a.read_shard(listed.arrays_key, sorted(listed.shards[listed.arrays_key].values())[0][1])
    damage(f"{path}/{header['split']}/{header['objects'][0][0]}")
    summary = tmp_path / "summary.json"
    run_pipeline(*args, "--output", f"gs://{path}", "--summary_json", summary, env=gcs.env)
    damaged = json.loads(summary.read_text())["reused"]["damaged"]
    assert damaged == {"staged_units": 1, "shard_records": 0, "chunk_marks": 0, "chunks": 1}, damaged
    assert gs_dataset_digest(gcs.fs, path) == gs_dataset_digest(gcs.fs, f"{BUCKET}/damaged/ref.zarr")
