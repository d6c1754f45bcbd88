"""The PTransforms of flat-tokens-beam, one subpackage per stage of the sentence the graph reads:

    read the corpus -> tokenize it -> [drop duplicate texts] -> [weigh sources] -> shuffle it
    globally -> lay the shards out -> create the output -> report rejected lines -> check the
    rejected fraction -> write the flat-tokens arrays -> commit the dataset

    read/      input files and mixtures -> batches of documents, every line accounted for
    tokenize/  documents -> token ids (fast backend, HF guard); exact and near dedup by content
    shuffle/   a mixture's weights -> copies; every document -> its shard, sorted by hash
    write/     the layout, the output's ownership, the arrays, the report and the commit

Beside them: the elements that flow between stages (`records`), the count dicts and their sum
(`counts`), the seeded hashes every decision about a document comes from (`hashing`), copies
out of flat arrays of documents (`segments`) and progress for a person watching (`progress`).
A stage imports from the root and from earlier stages, never from a later one.

Each stage package names its PTransforms lazily (`stage_exports`): importing one of its
plain modules (the launcher importing `transforms.write.ownership`, say) must not import Beam.
"""
import importlib


def stage_exports(package: str, names: dict[str, str]):
    """A package's `__getattr__` and `__all__` for `names` (name -> module in the package),
    imported on first use."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{names[name]}"), name)

    return __getattr__, sorted(names)
