"""What an array's metadata may say in a flat-tokens dataset, checked before zarr acts on it.

A trainer opens datasets it did not build: their metadata is untrusted input. zarr would
open an array whose `.zarray` names a pickle filter or an object dtype (it runs no code,
but the read then fails deep inside numcodecs with a bare ValueError), or any codec a
plugin registers. This format writes arrays of integers (uint16, uint32, uint64) with zstd or Blosc, zarr 3's crc32c and sharding, or numcodecs' crc32 filter
(transforms/write/zarr_store.py, `_codecs`); anything else is refused by name, before zarr
builds a codec from it.

Pure: the parsed JSON document in, a phrase naming the field out.
"""
from __future__ import annotations

# Integers only: a signed or narrower one is a wrong type that verify names as such; an
# object, string or float dtype is not a dataset of tokens at all.
DTYPES_V2 = frozenset(f"{order}{kind}{size}" for order in "<>|" for kind in "iu" for size in (1, 2, 4, 8))
DTYPES_V3 = frozenset(f"{kind}int{bits}" for kind in ("", "u") for bits in (8, 16, 32, 64))
COMPRESSORS_V2 = frozenset({"zstd", "blosc"})
FILTERS_V2 = frozenset({"blosc", "crc32"})
CODECS_V3 = frozenset({"bytes", "zstd", "blosc", "crc32c", "sharding_indexed"})


def _ids(value, field: str, allowed: frozenset, key: str = "id") -> str | None:
    items = [] if value is None else value if isinstance(value, list) else [value]
    for item in items:
        name = item.get(key) if isinstance(item, dict) else None
        if name not in allowed:
            return f"field {field} names codec {name!r}, which this format does not use ({', '.join(sorted(allowed))})"
    return None


def _codecs_v3(codecs, field: str) -> str | None:
    if not isinstance(codecs, list):
        return f"field {field} is not a list of codecs"
    problem = _ids(codecs, field, CODECS_V3, key="name")
    if problem:
        return problem
    for codec in codecs:
        if codec.get("name") == "sharding_indexed":
            config = codec.get("configuration") or {}
            for inner in ("codecs", "index_codecs"):
                problem = _codecs_v3(config.get(inner, []), f"{field}[sharding_indexed].{inner}")
                if problem:
                    return problem
    return None


def _shape(document: dict, field: str) -> str | None:
    """A shape of non-negative integers (its number of dimensions is verify's to name)."""
    shape = document.get(field)
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                            for n in shape)):
        return f"field {field} is {shape!r}, not a list of sizes"
    return None


def unsupported(document) -> str | None:
    """Why an array's metadata document (`.zarray`, or a `zarr.json` of node_type "array")
    is not one this format writes (a phrase naming the field), or None. Group documents pass."""
    if not isinstance(document, dict):
        return "is not a JSON object"
    if document.get("zarr_format") == 3:
        if document.get("node_type") != "array":
            return None
        if document.get("data_type") not in DTYPES_V3:
            return f"field data_type is {document.get('data_type')!r}, not an integer type"
        return _shape(document, "shape") or _codecs_v3(document.get("codecs"), "codecs")
    if "dtype" not in document and "chunks" not in document:
        return None  # a group's .zgroup/.zattrs
    if document.get("dtype") not in DTYPES_V2:
        return f"field dtype is {document.get('dtype')!r}, not an integer type"
    return (_shape(document, "shape") or _shape(document, "chunks")
            or _ids(document.get("compressor"), "compressor", COMPRESSORS_V2)
            or _ids(document.get("filters"), "filters", FILTERS_V2))
