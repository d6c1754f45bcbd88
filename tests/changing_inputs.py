"""Tokenizer backend plugins (--tokenizer_backend tests.changing_inputs:NAME) that change an input
file when the launcher loads them: after the inputs were listed and before any worker reads
them. That is what another program writing to the corpus during a run does, at a moment a
test can rely on without timing anything.

The file to change is FLAT_TOKENS_TEST_CHANGE (a local path or a gs:// URL, reached through
fsspec, so STORAGE_EMULATOR_HOST applies); it is changed once per run, whichever process
loads the plugin first (FLAT_TOKENS_TEST_CHANGED is created then). The encoder is HF
tokenizers', so only the input changes."""
import os

import fsspec

from transforms.tokenize.backends import HF, make_encoder


def _change_once(change):
    try:
        os.close(os.open(os.environ["FLAT_TOKENS_TEST_CHANGED"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    url = os.environ["FLAT_TOKENS_TEST_CHANGE"]
    with fsspec.open(url, "rb") as f:
        data = f.read()
    with fsspec.open(url, "wb") as f:
        f.write(change(data))


def truncated(data: bytes) -> bytes:
    """The file cut at half its lines."""
    return b"".join(data.splitlines(keepends=True)[: data.count(b"\n") // 2])


def appended(data: bytes) -> bytes:
    """Documents added at the end."""
    return data + b'{"text": "a late document"}\n' * 10


def rewritten(data: bytes) -> bytes:
    """Other documents of the same size ("document" becomes "DOCUMENT")."""
    return data.replace(b"document", b"DOCUMENT")


def truncating(json_text):
    _change_once(truncated)
    return make_encoder(HF, json_text)


def appending(json_text):
    _change_once(appended)
    return make_encoder(HF, json_text)


def rewriting(json_text):
    _change_once(rewritten)
    return make_encoder(HF, json_text)
