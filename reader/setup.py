"""flat-tokens-reader: the reading side of flat-tokens-beam alone, for a trainer's environment.

    pip install ./reader              # from a clone: numpy, zarr and fsspec
    pip install './reader[gcs]'       # and gcsfs, to read gs:// datasets

It installs the same `pipeline` and `transforms` packages as the full distribution (the
repository root's setup.py), from the same files, with only what reading needs: the reader
(pipeline.reader, FlatTokensSplit), Blend, the data loader adapters (pipeline.loaders,
torch_data, jax_data), verify, inspect, report (its figures are hand-written SVG: no
plotting package), and the Megatron layout (pipeline.megatron). Running
the pipeline or `export` (Beam jobs) needs the full distribution: `flat-tokens run` says so.
Install one of the two distributions in an environment, not both (they hold the same
modules, as opencv-python and opencv-python-headless do).
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "pipeline" / "__init__.py").read_text()).group(1)

setup(
    name="flat-tokens-reader",
    version=VERSION,
    description="Read flat-tokens datasets in a trainer (the reader of flat-tokens-beam, without Beam)",
    python_requires=">=3.10",
    # The packages live at the repository root, beside the full distribution's setup.py.
    package_dir={"": ".."},
    packages=find_packages(where=str(ROOT), include=["pipeline", "transforms", "transforms.*"]),
    install_requires=[
        "numpy>=1.26",
        "zarr>=3.1,<4",
        "numcodecs>=0.15",
        "fsspec>=2025.3",
    ],
    extras_require={"gcs": ["gcsfs>=2025.3"]},
    entry_points={"console_scripts": ["flat-tokens=pipeline.cli:console_script"]},
)
