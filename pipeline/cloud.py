"""First contact with cloud storage: a gs:// URL that cannot be reached, or not without
credentials, fails in seconds with one line saying what to do.

Left to gcsfs, a launcher without network retried for ~50 s and then printed a 150-line
aiohttp traceback; without credentials it fell back to anonymous access and failed later,
on the first write. So before anything else the launcher looks, once for all its gs://
URLs, for the two things every such URL needs: the storage endpoint answers a TCP
connection, and (unless a token was chosen explicitly, or an emulator needs none)
Google's application default credentials exist. Each look is bounded in time.
"""
import os
import socket
import threading
from urllib.parse import urlsplit

import fsspec

from pipeline.options import OptionError

GCS_PROTOCOLS = ("gs://", "gcs://")
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
CONNECT_SECONDS = 3.0
CREDENTIALS_SECONDS = 4.0
WHAT_TO_DO = ("run `gcloud auth application-default login` (your own account), or set "
              "GOOGLE_APPLICATION_CREDENTIALS to a service account key file (docs/scale.md, "
              "'Real Google Cloud Storage'); for a public bucket, FSSPEC_GS_TOKEN=anon reads it anonymously")


def endpoint(storage_options: dict | None = None) -> tuple[str, bool]:
    """(the endpoint gcsfs will talk to, whether it is an emulator): an `endpoint_url` given
    in storage_options or fsspec's configuration, else STORAGE_EMULATOR_HOST, else Google's."""
    configured = {**fsspec.config.conf.get("gs", {}), **(storage_options or {})}
    if configured.get("endpoint_url"):
        return str(configured["endpoint_url"]), False
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator not in ("", "default"):
        return emulator if "://" in emulator else f"http://{emulator}", True
    return DEFAULT_ENDPOINT, False


def _bounded(call, seconds: float):
    """(call's result or exception, whether it finished within `seconds`). The call runs on a
    daemon thread, which is left behind if it does not finish: the launcher exits anyway."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except Exception as e:  # noqa: BLE001 - reported to the caller
            outcome["value"] = e

    worker = threading.Thread(target=run, daemon=True, name="flat-tokens-first-contact")
    worker.start()
    worker.join(seconds)
    return outcome.get("value"), "value" in outcome


def _connect(url: str) -> None:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    socket.create_connection((parts.hostname, port), timeout=CONNECT_SECONDS).close()


def _credentials():
    import google.auth
    return google.auth.default()


def urls_of(o) -> list[tuple[str, str]]:
    """(option, URL) of every location the options name (FlatTokensOptions), the output first."""
    return ([("--output", o.output)] + [("--input", u) for u in o.input or []]
            + [("--validation_input", u) for u in o.validation_input or []]
            + [("--mixture", o.mixture), ("--tokenizer", o.tokenizer), ("--rejected_output", o.rejected_output)])


def check_gcs_reachable(urls: list[tuple[str, str]], storage_options: dict | None = None) -> None:
    """OptionError naming the first gs:// URL of `urls` ((option, URL) pairs) when the storage
    endpoint does not answer, or when no credentials can be found for Google's endpoint."""
    on_gcs = [(option, url) for option, url in urls if url and url.startswith(GCS_PROTOCOLS)]
    if not on_gcs:
        return
    option, url = on_gcs[0]
    where, emulated = endpoint(storage_options)
    host = urlsplit(where).netloc or where
    failure, finished = _bounded(lambda: _connect(where), CONNECT_SECONDS + 1)
    if not finished or failure is not None:
        reason = f"{type(failure).__name__}: {failure}" if finished else f"no answer in {CONNECT_SECONDS + 1:.0f} s"
        if emulated:
            raise OptionError(f"{option} {url}: the GCS emulator at STORAGE_EMULATOR_HOST={host} does not answer "
                              f"({reason}); start it, or unset STORAGE_EMULATOR_HOST for Google Cloud Storage")
        raise OptionError(f"{option} {url}: cannot reach Google Cloud Storage at {host} ({reason}); check the "
                          f"network (flat-tokens connects directly: a firewall or a proxy may be in the way), or "
                          f"set STORAGE_EMULATOR_HOST for a local emulator")
    token = {**fsspec.config.conf.get("gs", {}), **(storage_options or {})}.get("token")
    if emulated or token:
        return  # an emulator checks no credentials; an explicit token is the user's choice
    found, finished = _bounded(_credentials, CREDENTIALS_SECONDS)
    if not finished:
        raise OptionError(f"{option} {url}: looking for Google Cloud credentials took more than "
                          f"{CREDENTIALS_SECONDS:.0f} s (the metadata server of a VM may not answer); {WHAT_TO_DO}")
    if isinstance(found, Exception):
        raise OptionError(f"{option} {url}: no Google Cloud credentials were found "
                          f"({type(found).__name__}); {WHAT_TO_DO}")
