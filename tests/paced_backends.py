"""A tokenizer backend that holds the run at a chosen document, plugged in with
--tokenizer_backend tests.paced_backends:NAME, so that a test can observe the launcher
while the run is still going (progress lines) without depending on how fast it is."""
import os
import time

from transforms.tokenize.backends import make_encoder

HOLD_MARKER = "hold-the-run-here"
# The test creates this file once it has seen what it waits for; the backend then goes on.
RELEASE_FILE_ENV = "FLAT_TOKENS_TEST_RELEASE_FILE"


def holds_at_marker(json_text):
    """Encodes as HF does; a batch holding HOLD_MARKER first waits (at most 5 minutes) for
    the release file."""
    encode = make_encoder("hf", json_text)

    def paced(texts):
        if any(HOLD_MARKER in t for t in texts):
            release = os.environ[RELEASE_FILE_ENV]
            deadline = time.monotonic() + 300
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
        return encode(texts)
    return paced
