"""Read the corpus: input files (JSONL by byte range, Parquet by row group, a mixture's
sources) -> batches of documents, with an account of every line that is not a document.

Keeps: nothing is lost. Every line is a document, a blank line (counted) or a rejected line
(counted and reported); a file that cannot be read whole fails the job, naming it.
"""
from transforms import stage_exports

__getattr__, __all__ = stage_exports(__name__, {
    "ReadCorpus": "corpus",  # read the corpus
    "list_input_files": "inputs",
    "load_mixture": "mixture",
})
