"""Tokenizing batches of documents into flat numpy arrays, with no special tokens added.

A tokenizer is named by a spec: `bytes` (built in: UTF-8 byte b becomes id b + 1), a
`tokenizer.json` path or fsspec URL, or a HuggingFace hub name when the network allows.
The spec is resolved once when the pipeline is built (so a bad spec fails before any
worker starts); workers load the same bytes again and check their sha256, so a tokenizer
file replaced during a run fails the job instead of mixing two tokenizers.
"""
import hashlib
import logging
import os
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass

import apache_beam as beam
import fsspec
import numpy as np
from apache_beam.utils import shared

from flat_tokens.format import storage_faults
from transforms import staging
from transforms.progress import ProgressFile, show_document_lengths
from transforms.read.inputs import PARQUET, absolute, format_of
from transforms.records import DocumentBatch, TokenizedBatch, narrowest_ids
from transforms.tokenize import backends, minhash
from transforms.tokenize.dedup import content_digests, digests_of
from transforms.tokenize.near_features import FeatureMemo, SharedFeatureMemo, batch_features
from transforms.write_behind import WriteBehind

BYTES = "bytes"
MAX_TOKEN_ID = 2**31 - 1
_BYTES_IDENTITY = b"flat-tokens-beam builtin bytes tokenizer v1: UTF-8 byte b -> id b+1"


class TokenizerError(ValueError):
    """The tokenizer spec cannot be used; the message names the spec and the fix."""


@dataclass(frozen=True)
class TokenizerInfo:
    spec: str
    kind: str  # "bytes", "file" or "hub"
    sha256: str
    vocab_size: int
    backend: str = backends.HF
    check_fraction: float = 0.0  # share of documents re-encoded with the reference backend
    split_special_tokens: bool = False  # special-token text in documents encoded as text (backends.py)

    def provenance(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "sha256": self.sha256, "vocab_size": self.vocab_size,
                "backend": self.backend, "backend_version": backends.version_of(self.backend),
                "checked_fraction": self.check_fraction if self.backend != backends.HF else None,
                "split_special_tokens": self.split_special_tokens}


def _looks_like_hub_name(spec: str) -> bool:
    return not spec.endswith(".json") and "://" not in spec and spec.count("/") <= 1 and not spec.startswith((".", "/"))


def _load_json_text(spec: str, storage_options: dict | None) -> tuple[str, str]:
    """The tokenizer.json text for a spec, and its kind ("file" or "hub")."""
    try:
        fs, path = fsspec.core.url_to_fs(spec, **(storage_options or {}))
        if storage_faults.call(fs, lambda: fs._exists(path) if fs.async_impl else fs.exists(path), spec):
            # Read again while its bytes are not JSON: a body cut short in transit is no bad file.
            return storage_faults.cat_file(fs, path, spec, storage_faults.not_json).decode("utf-8"), "file"
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise TokenizerError(f"--tokenizer {spec}: cannot read it ({e})") from None
    if not _looks_like_hub_name(spec):
        raise TokenizerError(f"--tokenizer {spec}: no such file; give a tokenizer.json path or URL, "
                             f"'bytes', or a HuggingFace hub name")
    return _load_from_hub(spec), "hub"


# How long the hub may take to accept a connection before we call it out of reach. Its client
# would retry an unreachable hub five times with backoff (~25 s), saying so at each retry.
HUB_CONNECT_SECONDS = 3


def hub_out_of_reach() -> str | None:
    """Why the HuggingFace hub (HF_ENDPOINT, or the proxy in front of it) cannot be reached
    now, from one connection attempt of a few seconds at most; None when it can be."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(endpoint.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy.hostname, proxy.port or 80
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_SECONDS).close()
    except OSError as e:
        return f"cannot connect to {host}:{port}: {e.strerror or e}"
    return None


def _load_from_hub(spec: str) -> str:
    """tokenizer.json of a hub repository (what Tokenizer.from_pretrained loads): downloaded
    when the hub is in reach, else from the local HuggingFace cache, else a TokenizerError."""
    from huggingface_hub import hf_hub_download
    from tokenizers import Tokenizer
    out_of_reach = hub_out_of_reach()
    try:
        path = hf_hub_download(spec, "tokenizer.json", local_files_only=out_of_reach is not None)
        return Tokenizer.from_file(path).to_str()
    except Exception as e:  # the hub client raises many kinds: offline, 404, auth
        why = (f"the HuggingFace hub is out of reach ({out_of_reach}) and the local cache has no copy"
               if out_of_reach else f"fetching it from the HuggingFace hub failed ({type(e).__name__}: {str(e)[:200]})")
        raise TokenizerError(f"--tokenizer {spec}: not a local file, and {why}; download tokenizer.json "
                             f"where the network allows and pass its path") from None


def _parse(json_text: str, spec: str):
    try:
        return backends.hf_tokenizer(json_text)
    except Exception as e:  # tokenizers raises its own exception type for bad JSON
        raise TokenizerError(f"--tokenizer {spec}: not a valid tokenizer.json ({str(e)[:200]})") from None


def resolve_tokenizer(spec: str, storage_options: dict | None = None, backend: str = backends.HF,
                      first_documents: list[str] = (), check_fraction: float = 0.001,
                      split_special_tokens: bool = False) -> TokenizerInfo:
    """Checks that a spec loads and picks the backend (guarded against the reference on
    tricky strings and `first_documents`). Runs when the pipeline is built."""
    if spec == BYTES:  # it has no special tokens: --split_special_tokens changes nothing
        return TokenizerInfo(BYTES, BYTES, hashlib.sha256(_BYTES_IDENTITY).hexdigest(), 257, BYTES)
    text, kind = _load_json_text(spec, storage_options)
    tokenizer = _parse(text, spec)
    try:
        chosen, warning = backends.choose_backend(backend, text, list(first_documents), split_special_tokens)
    except backends.BackendMismatch as e:
        raise TokenizerError(str(e)) from None
    except (ImportError, ValueError) as e:
        raise TokenizerError(f"--tokenizer_backend {backend}: cannot be used ({e})") from None
    if warning:
        logging.getLogger(__name__).warning(warning)
    # A file's spec made absolute: workers load it again, and provenance records it for
    # `flat-tokens inspect` to decode with, from whatever directory either runs in.
    return TokenizerInfo(absolute(spec) if kind == "file" else spec, kind,
                         hashlib.sha256(text.encode("utf-8")).hexdigest(),
                         tokenizer.get_vocab_size(with_added_tokens=True), chosen, check_fraction,
                         split_special_tokens)


def encode_bytes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The built-in tokenizer: ids are UTF-8 bytes plus one."""
    encoded = [t.encode("utf-8") for t in texts]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    ids = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.uint32) + 1
    return ids, lengths


def load_encoders(info: TokenizerInfo, storage_options: dict | None = None):
    """(encoder, reference encoder or None) for a resolved tokenizer, checked by sha256."""
    if info.kind == BYTES:
        return encode_bytes, None
    text, _ = _load_json_text(info.spec, storage_options)
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if sha != info.sha256:
        raise TokenizerError(f"--tokenizer {info.spec}: its content changed while the job ran "
                             f"(sha256 {sha}, expected {info.sha256}); rerun with a fixed tokenizer file")
    split = info.split_special_tokens
    encoder = backends.make_encoder(info.backend, text, split)
    checked = info.backend != backends.HF and info.check_fraction > 0
    return encoder, backends.make_encoder(backends.HF, text, split) if checked else None


_DECODERS = {}  # sha256 -> decode: loaded once per process


def load_decoder(info: TokenizerInfo, storage_options: dict | None = None):
    """decode(ids) -> str for a resolved tokenizer (checked by sha256, as load_encoders): the
    text its ids stand for, special tokens included. Whether that is the text that was read
    depends on the tokenizer (a normalizer may have changed it): callers compare digests."""
    if info.kind == BYTES:
        return lambda ids: (np.asarray(ids, dtype=np.int64) - 1).astype(np.uint8).tobytes().decode("utf-8")
    if info.sha256 not in _DECODERS:
        text, _ = _load_json_text(info.spec, storage_options)
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != info.sha256:
            raise TokenizerError(f"--tokenizer {info.spec}: its content changed while the job ran; rerun with a "
                                 f"fixed tokenizer file")
        tokenizer = backends.hf_tokenizer(text)
        _DECODERS[info.sha256] = lambda ids: tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=False)
    return _DECODERS[info.sha256]


def check_id_limit(top: int, spec: str) -> None:
    """The format stores 2*id + start bit in 32 bits; `top` is the largest id produced."""
    if top > MAX_TOKEN_ID:
        raise TokenizerError(f"--tokenizer {spec}: produced token id {top}, above the "
                             f"format's limit 2**31-1; this tokenizer cannot be stored as flat-tokens")


def sample_check(batch: DocumentBatch, ids: np.ndarray, lengths: np.ndarray, encoder, reference,
                 info: TokenizerInfo):
    """The comparison of the batch's guard sample with the reference, ready to run: a call
    that raises on any difference, or None when no document of the batch is sampled.

    The sample's ids are the run's own, taken here; documents longer than the guard's bound
    are compared on their prefix, encoded here by both backends. The returned call only
    encodes with the reference, so it may run on another thread."""
    picked = np.flatnonzero(backends.guard_sample(batch.file_key, batch.offsets, info.check_fraction))
    if picked.size == 0:
        return None
    texts = [backends.bounded(batch.texts[i]) for i in picked]
    if all(len(t) == len(batch.texts[i]) for i, t in zip(picked, texts)):
        starts = np.cumsum(lengths) - lengths
        candidate = (np.concatenate([ids[starts[i]:starts[i] + lengths[i]] for i in picked]), lengths[picked])
    else:
        candidate = encoder(texts)

    def compare():
        found = backends.first_mismatch(reference, lambda _: candidate, texts)
        if found:
            k, want, got = found
            path = batch.file_key.split(":", 1)[1]
            unit = "row" if format_of(path) == PARQUET else "byte"  # a Parquet document's place is its row
            where = f"the document at {unit} {int(batch.offsets[picked[k]])} of input {path}"
            raise backends.BackendMismatch(backends.describe_mismatch(info.backend, texts[k], want, got, where))
    return compare


def tokenize_batch(batch: DocumentBatch, encoder, info: TokenizerInfo, reference=None,
                   digests: bool = False, checks=None, near: minhash.MinHashSettings | None = None,
                   memo: FeatureMemo | None = None) -> TokenizedBatch:
    """Tokenizes a batch; documents that tokenize to nothing are dropped and counted. With
    `digests` (--dedup exact), each kept document's content digest comes along; with `near`
    (--dedup near), its digest, its MinHash signature and its copy defects (those of the
    texts `memo` holds taken from it). With a `reference`, the batch's guard sample is
    compared with it: here, or given `checks` (a function taking the comparison), wherever
    that runs it."""
    ids, lengths = encoder(batch.texts)
    if reference is not None:
        compare = sample_check(batch, ids, lengths, encoder, reference, info)
        if compare is not None:
            (checks or (lambda run: run()))(compare)
    top = int(ids.max()) if ids.size else -1
    check_id_limit(top, info.spec)
    kept = lengths > 0
    ids = narrowest_ids(ids, top)
    signatures = defects = None
    texts = [t for t, k in zip(batch.texts, kept.tolist()) if k] if near is not None or digests else None
    if near is not None:  # each kept text encoded once, for its digest, its words and its defects
        encoded = [t.encode("utf-8") for t in texts]
        document_digests = digests_of(encoded)
        signatures, defects = batch_features(near, texts, encoded, document_digests, ids, lengths[kept], memo)
    elif digests:
        document_digests = content_digests(texts)
    else:
        document_digests = None
    return TokenizedBatch(
        file_key=batch.file_key,
        split=batch.split,
        offsets=batch.offsets[kept],
        lengths=lengths[kept],
        ids=ids,
        empty=int(np.count_nonzero(~kept)),
        digests=document_digests,
        signatures=signatures,
        defects=defects,
    )


class TokenizeBatches(beam.DoFn):
    """DocumentBatch -> TokenizedBatch. The tokenizer is loaded once per worker, in setup().

    The guard's comparisons with the reference (HF tokenizers, which releases the GIL) run
    on a thread of their own while the stage reads and tokenizes on: one at a time, the
    next waiting for the last, and every one finished before the bundle is. A mismatch
    fails the bundle as it would have in place. The thread is a WriteBehind's
    (transforms/write_behind.py): teardown() stops it, and it starts again if the instance
    is used after that."""

    def __init__(self, info: TokenizerInfo, storage_options: dict | None = None, progress_dir: str | None = None,
                 digests: bool = False, near: minhash.MinHashSettings | None = None, memo_dir: str | None = None):
        """`memo_dir` (local runs: the spill directory): where the machine's worker processes
        share their near features (near_features.SharedFeatureMemo)."""
        self._info = info
        self._memo_dir = memo_dir
        self._digests = digests
        self._near = near
        self._storage_options = storage_options
        self._progress_dir = progress_dir
        self._encoder = self._reference = self._progress = self._checker = self._memo = None
        self._checking = None  # the guard comparison in flight (a Future)
        self._shared_memo = shared.Shared() if near is not None else None  # one per process: near_features.py

    def setup(self):
        self._encoder, self._reference = load_encoders(self._info, self._storage_options)
        if self._shared_memo is not None:
            self._memo = self._shared_memo.acquire(self._new_memo, tag=repr(self._near))
        self._progress = ProgressFile(self._progress_dir)
        if self._reference is not None:
            self._checker = WriteBehind("flat-tokens-guard")

    def _new_memo(self):
        if self._memo_dir is None:
            return FeatureMemo(self._near)
        name = f"near-features-{staging.key_of(self._near.signature_key())}.bin"
        return SharedFeatureMemo(self._near, os.path.join(self._memo_dir, name))

    def start_bundle(self):
        self._checking = None  # a failed bundle's comparison is not this bundle's
        if self._checker:
            self._checker.forget()

    def process(self, batch: DocumentBatch):
        tokenized = tokenize_batch(batch, self._encoder, self._info, self._reference, self._digests, self._check,
                                   self._near, self._memo)
        self._progress.add(tokens=int(tokenized.ids.size))
        show_document_lengths(tokenized.lengths, tokenized.empty)
        yield tokenized

    def _check(self, compare) -> None:
        self._checking = self._checker.submit(compare)  # after the last comparison, raising its difference

    def _wait_for_check(self) -> None:
        self._checking = None
        if self._checker:
            self._checker.wait()  # raises the comparison's BackendMismatch

    def finish_bundle(self):
        self._wait_for_check()
        self._progress.flush()  # the bundle's tokens show now, not when the workers stop

    def teardown(self):
        if self._checker:
            self._checker.close()
        if self._progress:
            self._progress.flush()
