"""pipeline.local.allocator: freed buffers are reused instead of being faulted in afresh."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

# Allocates and frees a 64 MB buffer twice, then reports the minor page faults of the second
# allocation: a fresh mmap() faults in all 16,384 of its 4 KiB pages, reused heap none.
PROBE = """
import json, resource, sys
from pipeline.local import allocator
tuned = allocator.keep_freed_memory_for_reuse() if sys.argv[1] == "tuned" else None
def faults_of_one_buffer():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray(64 << 20)
    del buffer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_buffer()
print(json.dumps({"tuned": tuned, "faults": faults_of_one_buffer()}))
"""


def environment_without_malloc_settings() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}


def probe(mode: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True,
                          env={**environment_without_malloc_settings(), **(env or {})}, check=True)
    return json.loads(proc.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_a_freed_buffer_is_reused_without_page_faults():
    untuned, tuned = probe("untuned"), probe("tuned")
    assert untuned["faults"] > 10_000, untuned  # the cost being removed is real here
    assert tuned == {"tuned": True, "faults": tuned["faults"]} and tuned["faults"] < 1_000, tuned


def test_settings_the_user_made_are_left_alone():
    assert probe("tuned", {"MALLOC_TRIM_THRESHOLD_": "0"})["tuned"] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_processes_started_after_tuning_reuse_freed_buffers_too():
    """multi_processing workers are started by the tuned process: they must behave the same."""
    code = ("import subprocess, sys; from pipeline.local import allocator; allocator.keep_freed_memory_for_reuse(); "
            "sys.stdout.write(subprocess.run([sys.executable, '-c', sys.argv[1], 'untuned'], "
            "capture_output=True, text=True, check=True).stdout)")
    child = json.loads(subprocess.run([sys.executable, "-c", code, PROBE], cwd=REPO, capture_output=True,
                                      text=True, env=environment_without_malloc_settings(), check=True).stdout)
    assert child["faults"] < 1_000, child
