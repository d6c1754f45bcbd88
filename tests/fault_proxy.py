"""A fault-injecting HTTP proxy for tests: put it between gcsfs and the GCS emulator
(tests/gcs_emulator.py) and tell it which faults to inject.

    with FaultProxy(gcs.url) as proxy:                 # 127.0.0.1 only, a free port
        proxy.truncate("train/encoded_tokens/0")       # the next GET of that object: half its body
        proxy.fail(0.05, seed=3)                       # 5% of requests: 503, 429 or a reset
        proxy.outage(8)                                # every request reset for 8 s from now
        proxy.hang(5)                                  # every request held 5 s, then answered
        proxy.before_get("train/encoded_tokens/.zarray", lose)  # lose() runs first: the store loses objects
        proxy.url, proxy.env                           # endpoint for gcsfs, STORAGE_EMULATOR_HOST

Faults act on what a real store and network do to a client: a body silently cut short (its
Content-Length says the short length: only a checksum finds it), a body cut mid-transfer (the
connection closes before Content-Length bytes came), 503 and 429 answers, connections reset
without an answer, outages, and requests that get no answer for a while. Object names are
matched on the decoded request path, so "ds.zarr/train/encoded_tokens/0" matches gcsfs's
".../o/ds.zarr%2Ftrain%2Fencoded_tokens%2F0?alt=media".

Bounded: every wait has a deadline (hangs end, upstream requests time out), the server
listens on loopback only, and it stops when the `with` block ends (its threads are daemons).
"""
from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

UPSTREAM_TIMEOUT_S = 30
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "trailer"}


class FaultProxy:
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port or 80)
        self._lock = threading.Lock()
        self._truncations: list[list] = []  # [object substring, GETs to let through first, "silent"|"cut"]
        self._rate, self._rng = 0.0, random.Random(0)
        self._outage_until = 0.0
        self._hang_until, self._hang_s = 0.0, 0.0
        self._before: list[list] = []  # [object substring, action]: run once, before that GET is forwarded
        self.gets: dict[str, int] = {}  # decoded object path -> GETs of its bytes (alt=media)
        self.faults = 0  # faults injected so far
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="fault-proxy")

    @property
    def env(self) -> dict:
        """Environment for a subprocess that should reach the emulator through this proxy."""
        return {"STORAGE_EMULATOR_HOST": self.url}

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.clear()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- faults the test asks for --------------------------------------------------------------
    def truncate(self, name: str, after: int = 0, how: str = "silent") -> None:
        """The GET of an object whose path contains `name`, after `after` such GETs pass
        untouched, returns half its body: "silent" with a Content-Length that matches the cut
        body, "cut" with the full Content-Length and the connection closed early."""
        with self._lock:
            self._truncations.append([name, after, how])

    def before_get(self, name: str, action) -> None:
        """Before the first GET of an object whose path contains `name` is forwarded, calls
        `action()` once (on the proxy's thread; the request waits for it): the store changes
        under the client at a chosen moment, e.g. loses the run's objects."""
        with self._lock:
            self._before.append([name, action])

    def fail(self, rate: float, seed: int = 0) -> None:
        """From now on, a fraction `rate` of requests (drawn from a seeded RNG) gets a 503, a 429
        or a connection reset instead of its answer."""
        with self._lock:
            self._rate, self._rng = rate, random.Random(seed)

    def outage(self, seconds: float) -> None:
        """For `seconds` from now, every request is reset without an answer."""
        with self._lock:
            self._outage_until = time.monotonic() + seconds

    def hang(self, seconds: float, for_s: float | None = None) -> None:
        """For `for_s` seconds from now (default `seconds`), every request waits `seconds` before it
        is forwarded: a stalled store."""
        with self._lock:
            self._hang_s = seconds
            self._hang_until = time.monotonic() + (seconds if for_s is None else for_s)

    def clear(self) -> None:
        with self._lock:
            self._truncations.clear()
            self._before.clear()
            self._rate, self._outage_until, self._hang_until = 0.0, 0.0, 0.0

    def get_count(self, name: str) -> int:
        """GETs of object bytes whose path contains `name`, so far."""
        with self._lock:
            return sum(n for path, n in self.gets.items() if name in path)

    # -- what the handler asks ----------------------------------------------------------------
    def _action_before(self, method: str, path: str):
        """The action to run before this request is forwarded (before_get), or None."""
        if method != "GET" or "alt=media" not in path:
            return None
        name = unquote(urlsplit(path).path)
        with self._lock:
            for rule in self._before:
                if rule[0] in name:
                    self._before.remove(rule)
                    return rule[1]
        return None

    def _decide(self, method: str, path: str) -> tuple[str, float]:
        """(fault, seconds to hold the request first): fault is "", "reset", "503", "429",
        "silent" or "cut"."""
        now = time.monotonic()
        with self._lock:
            hold = self._hang_s if now < self._hang_until else 0.0
            media = method == "GET" and "alt=media" in path
            if media:
                name = unquote(urlsplit(path).path)
                self.gets[name] = self.gets.get(name, 0) + 1
            if now < self._outage_until:
                self.faults += 1
                return "reset", hold
            if self._rate and self._rng.random() < self._rate:
                self.faults += 1
                return self._rng.choice(["503", "429", "reset"]), hold
            if media:
                for rule in self._truncations:
                    if rule[0] in name:
                        if rule[1] > 0:
                            rule[1] -= 1
                            continue
                        self._truncations.remove(rule)
                        self.faults += 1
                        return rule[2], hold
            return "", hold


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: pytest shows stderr of failing tests only
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reset(self) -> None:
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _handle(self) -> None:
        body = self._body()
        fault, hold = self.owner._decide(self.command, self.path)
        if hold:
            time.sleep(hold)
        if fault == "reset":
            return self._reset()
        action = self.owner._action_before(self.command, self.path) if not fault else None
        if action is not None:
            action()
        if fault in ("503", "429"):
            message = b'{"error": {"code": %s, "message": "injected by the fault proxy"}}' % fault.encode()
            self.send_response(int(fault))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(message)))
            self.end_headers()
            self.wfile.write(message)
            return
        upstream = http.client.HTTPConnection(*self.owner._upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            return self._forward(upstream, body, fault)
        except OSError:  # the emulator stopped (the session ends) or the client went away
            return self._reset()
        finally:
            upstream.close()

    def _forward(self, upstream, body: bytes, fault: str) -> None:
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT") else None,
                             headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            status, answer_headers = answer.status, answer.getheaders()
        finally:
            upstream.close()
        sent = data
        if fault in ("silent", "cut") and len(data) > 1:
            sent = data[:len(data) // 2]
        self.send_response(status)
        for key, value in answer_headers:
            if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) if fault == "cut" else len(sent)))
        if fault == "cut":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(sent)
        if fault == "cut":
            self.wfile.flush()
            self._reset()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle
