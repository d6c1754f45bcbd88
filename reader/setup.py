"""flat-tokens-reader: the reading side of flat-tokens-beam alone, for a trainer's environment.

    pip install ./reader              # from a clone: numpy, zarr and fsspec
    pip install './reader[gcs]'       # and gcsfs, to read gs:// datasets

It installs the `flat_tokens` package alone, from the same files as the full distribution
(the repository root's setup.py): the format's contract (flat_tokens.format), the reader
(`from flat_tokens import open_dataset, Blend`), the data loader adapters (flat_tokens.loaders,
torch_data, jax_data), the Megatron layout, and the reading commands verify, inspect and
report (its figures are hand-written SVG: no plotting package). Nothing of the job
(`pipeline`, `transforms`): `flat-tokens run` and `export` (Beam jobs) say they need the full
distribution. Install one of the two distributions in an environment, not both (both hold
`flat_tokens` and the `flat-tokens` script, as opencv-python and opencv-python-headless do).
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "flat_tokens" / "__init__.py").read_text()).group(1)

setup(
    name="flat-tokens-reader",
    version=VERSION,
    description="Read flat-tokens datasets in a trainer (the reader of flat-tokens-beam, without Beam)",
    python_requires=">=3.10",
    # The package lives at the repository root, beside the full distribution's setup.py.
    package_dir={"": ".."},
    packages=find_packages(where=str(ROOT), include=["flat_tokens", "flat_tokens.*"]),
    install_requires=[
        "numpy>=1.26",
        "zarr>=3.1,<4",
        "numcodecs>=0.15",
        "fsspec>=2025.3",
    ],
    extras_require={"gcs": ["gcsfs>=2025.3"]},
    entry_points={"console_scripts": ["flat-tokens=flat_tokens.tools.cli:console_script"]},
)
