"""Storage faults (issue 43): a transient fault is not corruption, and every wait has a bound.
Through a fault-injecting proxy (tests/fault_proxy.py) in front of the GCS emulator: a body cut
short is read again, not called damaged; an outage is waited out, or ends in one line and exit
1 once the patience runs out; a run through 503s, 429s and resets writes the same bytes."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from flat_tokens.tools import verify
from flat_tokens.reader import FlatTokensSplit, StorageUnavailable
from tests.fault_proxy import FaultProxy
from tests.gcs_emulator import BUCKET, gcs  # noqa: F401 - pytest fixture
from tests.helpers import REPO, SAMPLE, check_flat_tokens, run_pipeline
from flat_tokens.format import storage_faults

CHUNK = 4096
NAME = "faults.zarr"
URL = f"gs://{BUCKET}/{NAME}"
TOKENS0 = f"{NAME}/train/encoded_tokens/0"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / NAME
    run_pipeline("--input", SAMPLE / "*.jsonl", "--tokenizer", "bytes", "--output", out, "--tokens_chunk_size",
                 str(CHUNK), "--seq_starts_chunk_size", "128", "--validation_fraction", "0.05")
    return out


@pytest.fixture(scope="module")
def on_gcs(gcs, written):
    """The dataset, copied to the emulator as it is."""
    gcs.fs.put(str(written) + "/", f"{BUCKET}/{NAME}/", recursive=True)
    return URL


@pytest.fixture(autouse=True)
def plain_gcsfs():
    """This process talks to the emulator as the commands do with STORAGE_EMULATOR_HOST set
    (flat_tokens/format/gcs.py): through gcsfs's core filesystem, without the gRPC probe of a bucket's
    layout that an emulator does not answer."""
    import fsspec
    from fsspec.registry import registry
    from gcsfs.core import GCSFileSystem
    before = registry.get("gs")
    fsspec.register_implementation("gs", GCSFileSystem, clobber=True)
    yield
    if before is not None:
        fsspec.register_implementation("gs", before, clobber=True)


@pytest.fixture
def proxy(gcs):
    with FaultProxy(gcs.url) as p:
        yield p


def through(proxy) -> dict:
    return {"endpoint_url": proxy.url, "token": "anon"}


def verify_args(proxy) -> list[str]:
    return [URL, "--storage_option", f"endpoint_url={proxy.url}", "--storage_option", "token=anon"]


def test_a_truncated_chunk_read_is_read_again_by_the_reader(on_gcs, written, proxy):
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    before = storage_faults.counts()
    proxy.truncate(TOKENS0)
    got = train.packed(0, CHUNK)
    assert np.array_equal(got, FlatTokensSplit(str(written)).packed(0, CHUNK))
    assert proxy.get_count(TOKENS0) == 2  # the cut read, then a fresh one
    assert storage_faults.counts()["rereads"] == before["rereads"] + 1


def test_a_chunk_cut_mid_transfer_is_read_again_by_the_reader(on_gcs, written, proxy):
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    proxy.truncate(TOKENS0, how="cut")
    assert np.array_equal(train.packed(0, CHUNK), FlatTokensSplit(str(written)).packed(0, CHUNK))


def test_verify_reads_a_truncated_chunk_again_and_says_ok(on_gcs, proxy, capsys):
    proxy.truncate(TOKENS0)
    assert verify.main(verify_args(proxy)) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("OK:")
    assert "storage: 1 read of bytes that failed their check were read again" in err
    assert proxy.get_count(TOKENS0) == 2


def test_a_truncated_metadata_read_is_read_again(on_gcs, written, proxy):
    proxy.truncate(f"{NAME}/.zattrs")
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    assert train.num_tokens == FlatTokensSplit(str(written)).num_tokens


def test_damage_still_found_on_every_fresh_read(gcs, written, proxy, tmp_path, capsys):
    """The re-read is no excuse: bytes wrong on every read are still damaged."""
    bad = f"{BUCKET}/damaged.zarr"
    gcs.fs.put(str(written) + "/", bad + "/", recursive=True)
    data = bytearray(gcs.fs.cat_file(f"{bad}/train/encoded_tokens/0"))
    data[len(data) // 2] ^= 0x10
    gcs.fs.pipe_file(f"{bad}/train/encoded_tokens/0", bytes(data))
    code = verify.main([f"gs://{bad}", "--storage_option", f"endpoint_url={proxy.url}",
                        "--storage_option", "token=anon"])
    out, _ = capsys.readouterr()
    assert code == 1 and "encoded_tokens/0 is damaged" in out and "on 4 reads" in out
    assert proxy.get_count("damaged.zarr/train/encoded_tokens/0") == 4


# Outages: a short one, and the 30 seconds issue 43 names (each 30 s case adds its outage, or
# its patience, to the suite's time: about 110 s in all).
OUTAGES = [6, 30]
GIVING_UP = [(3, 8), (20, 30)]  # (patience, outage): the patience runs out first


@pytest.mark.slow
@pytest.mark.parametrize("outage", OUTAGES)
def test_verify_waits_out_an_outage(on_gcs, proxy, capsys, monkeypatch, outage):
    monkeypatch.setattr(storage_faults, "WAITING_EVERY_S", 2.0)
    proxy.outage(outage)
    started = time.monotonic()
    assert verify.main(verify_args(proxy)) == 0
    assert time.monotonic() - started >= outage  # it read nothing during the outage, and did not give up
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("OK:")
    assert f"waiting for {URL}" in err  # gcsfs's own retries waited it out, and said so


@pytest.mark.slow
@pytest.mark.parametrize("patience, outage", GIVING_UP)
def test_verify_gives_up_after_its_patience_in_one_line(on_gcs, proxy, capsys, monkeypatch, patience, outage):
    monkeypatch.setenv(storage_faults.PATIENCE_ENV, str(patience))
    proxy.outage(outage)
    started = time.monotonic()
    assert verify.main(verify_args(proxy)) == 1
    waited = time.monotonic() - started
    out, err = capsys.readouterr()
    assert waited < patience * 1.1, waited
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: storage unavailable: {URL}"), err
    assert "retry later" in lines[0] and "--overwrite" not in lines[0]


@pytest.mark.slow
def test_verify_command_during_an_outage_prints_no_traceback(on_gcs, proxy):
    proxy.outage(8)
    proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", URL], capture_output=True, text=True, cwd=REPO,
                          env={**_env(), **proxy.env, storage_faults.PATIENCE_ENV: "2"}, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: storage unavailable:"), proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("outage", OUTAGES)
def test_the_reader_waits_out_an_outage(on_gcs, written, proxy, outage):
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    proxy.outage(outage)
    started = time.monotonic()
    assert np.array_equal(train.packed(1, CHUNK), FlatTokensSplit(str(written)).packed(1, CHUNK))
    assert time.monotonic() - started >= outage


@pytest.mark.slow
@pytest.mark.parametrize("patience, outage", GIVING_UP)
def test_the_reader_gives_up_after_its_patience(on_gcs, proxy, monkeypatch, patience, outage):
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    monkeypatch.setenv(storage_faults.PATIENCE_ENV, str(patience))
    proxy.outage(outage)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match=f"storage unavailable: {URL}/train/encoded_tokens/1") as e:
        train.packed(1, CHUNK)
    assert time.monotonic() - started < patience * 1.1
    assert "--overwrite" not in str(e.value)


@pytest.mark.slow
def test_a_stalled_request_is_cut_at_the_request_timeout(on_gcs, written, proxy, monkeypatch):
    train = FlatTokensSplit(on_gcs, "train", through(proxy))
    monkeypatch.setenv(storage_faults.REQUEST_TIMEOUT_ENV, "1")
    proxy.hang(4, for_s=0.5)  # requests that arrive in the next half second get no answer for 4 s
    assert np.array_equal(train.packed(2, CHUNK), FlatTokensSplit(str(written)).packed(2, CHUNK))


def _env() -> dict:
    import os
    return {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}


def test_transient_errors_are_told_from_answers_about_data():
    import aiohttp
    assert storage_faults.is_transient(aiohttp.ClientOSError(104, "Connection reset by peer"))
    assert storage_faults.is_transient(TimeoutError())
    assert not storage_faults.is_transient(FileNotFoundError("gs://b/x"))
    assert not storage_faults.is_transient(ValueError("not JSON"))
    from gcsfs.retry import HttpError
    assert storage_faults.is_transient(HttpError({"code": 503, "message": "unavailable"}))
    assert not storage_faults.is_transient(HttpError({"code": 403, "message": "forbidden"}))


def test_a_claim_the_store_lost_is_not_called_a_takeover(gcs):
    """The store emptied under a run (an emulator restarted, say): no other run's claim is
    there, so no run took the output over; the message says what happened."""
    from transforms.write import ownership
    url = f"gs://{BUCKET}/vanished.zarr"
    ownership.claim(url, "run-a", 1, {"endpoint_url": gcs.url, "token": "anon"})
    gcs.fs.rm(f"{BUCKET}/vanished.zarr", recursive=True)  # everything of the run gone
    with pytest.raises(ownership.ObjectsVanished) as e:
        ownership.check_owner(url, "run-a", {"endpoint_url": gcs.url, "token": "anon"})
    assert "objects of this run disappeared from the store" in str(e.value)
    assert "took it over" not in str(e.value) and "Run the same command again" in str(e.value)


def _run_through(proxy, gcs, output: str, *extra, check=True):
    env = {**_env(), **proxy.env}
    return run_pipeline("--input", SAMPLE / "*.jsonl", "--tokenizer", f"gs://{BUCKET}/tok.json", "--output",
                        f"gs://{BUCKET}/{output}", "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size",
                        "128", "--validation_fraction", "0.05", *extra, env=env, timeout=300, check=check)


@pytest.fixture(scope="module")
def tokenizer_on_gcs(gcs):
    gcs.fs.put(str(SAMPLE / "tokenizer.json"), f"{BUCKET}/tok.json")
    return f"gs://{BUCKET}/tok.json"


@pytest.mark.slow
def test_a_truncated_tokenizer_read_is_read_again(gcs, tokenizer_on_gcs, proxy):
    proxy.truncate("tok.json")
    proc = _run_through(proxy, gcs, "tok-cut.zarr", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proxy.get_count("tok.json") >= 2


@pytest.mark.slow
def test_a_run_through_503s_429s_and_resets_writes_the_same_bytes(gcs, tokenizer_on_gcs, proxy, tmp_path):
    local = tmp_path / "local.zarr"
    run_pipeline("--input", SAMPLE / "*.jsonl", "--tokenizer", SAMPLE / "tokenizer.json", "--output", local,
                 "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size", "128", "--validation_fraction", "0.05")
    proxy.fail(0.05, seed=43)
    proc = _run_through(proxy, gcs, "flaky.zarr", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proxy.faults > 0
    proxy.clear()
    fetched = tmp_path / "flaky.zarr"
    gcs.fs.get(f"{BUCKET}/flaky.zarr/", str(fetched) + "/", recursive=True)
    check_flat_tokens(fetched, "--compare", local)


@pytest.mark.slow
def test_inspect_during_an_outage_says_so_in_one_line(on_gcs, proxy, capsys, monkeypatch):
    from flat_tokens.tools import inspect
    monkeypatch.setenv(storage_faults.PATIENCE_ENV, "2")
    proxy.outage(6)
    assert inspect.main(verify_args(proxy)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "storage unavailable:" in lines[0] and "--overwrite" not in lines[0], lines


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The same command's dataset written without faults, on local disk: what every run through
    the proxy must write, byte for byte."""
    local = tmp_path_factory.mktemp("local") / "local.zarr"
    run_pipeline("--input", SAMPLE / "*.jsonl", "--tokenizer", SAMPLE / "tokenizer.json", "--output", local,
                 "--tokens_chunk_size", str(CHUNK), "--seq_starts_chunk_size", "128", "--validation_fraction", "0.05")
    return local


def _same_as(gcs, output: str, local, tmp_path) -> None:
    fetched = tmp_path / output
    gcs.fs.get(f"{BUCKET}/{output}/", str(fetched) + "/", recursive=True)
    check_flat_tokens(fetched, "--compare", local)


@pytest.mark.slow
def test_a_run_reads_its_own_metadata_and_claims_again_when_cut_short(gcs, tokenizer_on_gcs, proxy, local_run,
                                                                     tmp_path):
    """The writers' reads of what the run itself stored (the arrays' metadata, read by every
    writer and by the end markers' writer; the claim) cut short once each, and the commit's reads of the chunks it sums for the manifest: read again, never a
    JSONDecodeError, a takeover, a conflict or "damaged after it was written"."""
    output = "own-reads.zarr"
    for name in ("train/seq_starts/.zarray", "validation/seq_starts/.zarray", "train/encoded_tokens/.zarray",
                 ".flat-tokens-run.", "train/encoded_tokens/0", "validation/seq_starts/0"):
        proxy.truncate(f"{output}/{name}")
    proc = _run_through(proxy, gcs, output, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proxy.faults == 6, proxy.faults  # every one of those reads was cut
    proxy.clear()
    _same_as(gcs, output, local_run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("keep", ["", ".flat-tokens-staging", ".flat-tokens-run.1"])
def test_a_store_that_loses_the_runs_objects_mid_run_is_reported_as_such(gcs, tokenizer_on_gcs, proxy, local_run,
                                                                        tmp_path, keep):
    """The run's objects deleted under it once its arrays exist (all of them: an emulator
    restarted empty, a bucket emptied; or all but the staging area, or all but the claim: a
    lifecycle rule, an operator's rm): the run stops with exit 1 saying that the store lost
    them, not that another run took the output over (there is none). The same command then
    builds the dataset: from the start when nothing is left, resuming (and saying so) what is,
    starting over (and saying so) when nothing but the claim is."""
    output = f"lost{len(keep)}.zarr"

    def lose():
        for path in gcs.fs.ls(f"{BUCKET}/{output}", detail=False, refresh=True):
            if not keep or not path.endswith("/" + keep):
                gcs.fs.rm(path, recursive=True)
        gcs.fs.invalidate_cache()

    proxy.before_get(f"{output}/train/encoded_tokens/.zarray", lose)
    proc = _run_through(proxy, gcs, output, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "objects of this run disappeared from the store" in line, proc.stderr[-3000:]
    assert "took it over" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    left = sorted(p.rsplit("/", 1)[-1] for p in gcs.fs.ls(f"{BUCKET}/{output}", detail=False, refresh=True)) \
        if gcs.fs.exists(f"{BUCKET}/{output}") else []
    assert left == ([keep] if keep else []), left
    again = _run_through(proxy, gcs, output, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    if keep.startswith(".flat-tokens-run."):  # nothing but the claim: nothing to resume, nothing to lose
        assert "starting over: it holds nothing of run" in again.stderr, again.stderr[-3000:]
    elif keep:
        assert "flat-tokens: resuming:" in again.stderr and "resumed: reused" in again.stdout, again.stderr[-3000:]
        assert "the store no longer holds train/encoded_tokens" in again.stderr, again.stderr[-3000:]
    else:
        assert "resum" not in again.stderr + again.stdout  # nothing was left: built from the start
    _same_as(gcs, output, local_run, tmp_path)


def test_staged_files_cut_short_are_read_again(gcs, proxy):
    """What a rerun reads back from the staging area (a unit's account, a chunk's mark, the
    arrays' mark) and the objects it checks against their sums: a read cut short is read
    again, not called damaged (which would redo the work) or absent."""
    from flat_tokens.format.checksums import Sum, damaged_objects
    from transforms.staging import ARRAYS, CHUNKS, UNITS, StagingArea
    url = f"gs://{BUCKET}/staged.zarr"
    area = StagingArea(url, through(proxy), job_key="job")
    area.put_unit("unit", {"places": [0, 1]})
    area.put_chunk("train", "encoded_tokens", 3, [("encoded_tokens/3", Sum(5, 7))])
    area.mark_arrays()
    data = b"the bytes of a chunk"
    gcs.fs.pipe_file(f"{BUCKET}/staged.zarr/train/encoded_tokens/3", data)
    for name in (f"{UNITS}/unit/", f"{CHUNKS}/job/", ARRAYS, "train/encoded_tokens/3"):
        proxy.truncate(name)
    assert area.read_unit("unit", "unit.2.json")["places"] == [0, 1]
    assert area.read_chunk_mark("job", "train", "encoded_tokens", 3) == [("encoded_tokens/3", Sum(5, 7))]
    assert area.arrays_key() == "job"
    fs = area.fs
    assert damaged_objects(fs, {f"{BUCKET}/staged.zarr/train/encoded_tokens/3": Sum.of(data)}) == {}
    assert proxy.faults == 4
    for name in (f"{UNITS}/unit/", f"{CHUNKS}/job/", ARRAYS, "train/encoded_tokens/3"):
        assert proxy.get_count(name) == 2, name


def _limits_here(_, out: str) -> None:
    import json
    import os
    from flat_tokens.format import storage_faults
    with open(out, "w") as f:
        json.dump([storage_faults.patience(), storage_faults.request_timeout(), os.getpid()], f)


def test_the_jobs_storage_limits_reach_workers_that_do_not_share_the_launchers_environment(tmp_path, monkeypatch):
    """Workers elsewhere (Dataflow's, a cluster's) are handed the job's options, not the
    launcher's environment: --storage_patience and --storage_request_timeout reach them so.
    Here on worker processes of their own, started from an environment that lacks the
    launcher's settings."""
    import json
    import os
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    import pipeline.options  # noqa: F401 - the job's options are known, as in `flat-tokens run`
    monkeypatch.delenv(storage_faults.PATIENCE_ENV, raising=False)
    monkeypatch.delenv(storage_faults.REQUEST_TIMEOUT_ENV, raising=False)
    out = tmp_path / "limits.json"
    options = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing",
                               "--storage_patience=7", "--storage_request_timeout=3"])
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create([0]) | beam.Map(_limits_here, str(out))
    patience, timeout, pid = json.loads(out.read_text())
    assert pid != os.getpid()  # measured in another process
    assert (patience, timeout) == (7.0, 3.0)


@pytest.mark.slow
def test_a_rerun_of_a_built_command_reads_the_root_attributes_again_when_cut_short(gcs, tokenizer_on_gcs, proxy):
    """The launcher reads the committed dataset's attributes to see that this very command built
    it: cut short, that read made it take the dataset for something else and refuse (exit 2,
    "pass --overwrite"): a configuration error for a transient fault."""
    output = "built.zarr"
    _run_through(proxy, gcs, output)
    proxy.truncate(f"{output}/.zattrs")
    proc = _run_through(proxy, gcs, output, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "was already built by run" in proc.stdout, proc.stdout
    assert proxy.faults == 1


@pytest.mark.slow
def test_the_commit_lists_the_stored_dedup_index_when_a_read_of_it_is_cut_short(gcs, tokenizer_on_gcs, proxy,
                                                                                capsys):
    """The commit reads the dedup index's files to list them in the manifest: a read cut short
    listed that response's bytes, and every later verify called the good file damaged."""
    output = "dedup-cut.zarr"
    proxy.truncate(f"{output}/dedup_index/")
    proc = _run_through(proxy, gcs, output, "--dedup", "exact", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proxy.faults == 1
    assert verify.main([f"gs://{BUCKET}/{output}", "--storage_option", f"endpoint_url={proxy.url}",
                        "--storage_option", "token=anon"]) == 0, capsys.readouterr()


@pytest.mark.slow
def test_the_commit_reads_a_zarr3_shard_cut_short_again(gcs, tokenizer_on_gcs, proxy, capsys):
    """A zarr 3 shard object carries no checksum of itself, but its index ends with one: a
    read of it cut short by the commit is read again, not listed in the manifest as read."""
    output = "shards-cut.zarr"
    proxy.truncate(f"{output}/train/encoded_tokens/c/0")
    proc = _run_through(proxy, gcs, output, "--zarr_format", "3", "--chunks_per_shard", "2", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proxy.faults == 1
    assert verify.main([f"gs://{BUCKET}/{output}", "--storage_option", f"endpoint_url={proxy.url}",
                        "--storage_option", "token=anon"]) == 0, capsys.readouterr()


def test_verify_reads_a_manifest_cut_short_again(on_gcs, proxy, capsys):
    """The manifest is read to check every object against it: cut short once, it was called
    an edit ("the dataset cannot be trusted"); a fresh read is the one judged."""
    name = f"{NAME}/flat-tokens-manifest.json"
    proxy.truncate(name)
    assert verify.main(verify_args(proxy)) == 0, capsys.readouterr()
    assert proxy.faults == 1 and proxy.get_count(name) >= 2


@pytest.mark.slow
def test_a_build_against_an_earlier_dataset_reads_its_index_again_when_cut_short(gcs, tokenizer_on_gcs, proxy,
                                                                                capsys):
    """--dedup_against reads the earlier datasets' index files, and verify reads a dataset's
    own: a body cut short failed the build (its manifest entry differs) and verify; a fresh
    read is the one judged, and the build removes what an uncut one removes."""
    earlier = "earlier-indexed.zarr"
    run_pipeline("--input", SAMPLE / "corpus-1.jsonl", "--tokenizer", tokenizer_on_gcs, "--output",
                 f"gs://{BUCKET}/{earlier}", "--dedup", "exact", env={**_env(), **proxy.env}, timeout=300)
    proxy.truncate(f"{earlier}/dedup_index/")
    assert verify.main([f"gs://{BUCKET}/{earlier}", "--storage_option", f"endpoint_url={proxy.url}",
                        "--storage_option", "token=anon"]) == 0, capsys.readouterr()
    assert proxy.faults == 1
    removed = {}
    for output, cut in (("against-whole.zarr", False), ("against-cut.zarr", True)):
        if cut:
            proxy.truncate(f"{earlier}/dedup_index/")
        proc = _run_through(proxy, gcs, output, "--dedup", "exact", "--dedup_against", f"gs://{BUCKET}/{earlier}",
                            check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        removed[cut] = json.loads(gcs.fs.cat_file(f"{BUCKET}/{output}/.zattrs"))["stats"]["dedup_against"]
    assert proxy.faults == 2 and removed[True] == removed[False] > 0
