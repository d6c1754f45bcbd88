"""Headless Chromium, driven over the DevTools protocol on a pipe (no port, no extra package).

    with Chromium() as browser:
        page = browser.open("file:///tmp/report.html")   # waits for the load event
        page.evaluate("document.title")                   # the test's JavaScript, not the page's
        page.console                                      # every console message, exception and log entry
        page.screenshot(path, width=1200, height=1600)

`--remote-debugging-pipe`: Chromium reads commands from fd 3 and writes replies and events to
fd 4, each a JSON message ended by a NUL byte. Used by tests/test_report.py (the dataset report
rendered in a real browser) and by `python -m tests.report_screenshot` (docs/report-sample.png).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

BINARIES = ("chromium", "chromium-browser", "google-chrome")
TIMEOUT_S = 60


def binary() -> str | None:
    """The Chromium on PATH, or None (tests skip, saying so)."""
    return next((p for p in map(shutil.which, BINARIES) if p), None)


_REASON: list = []


def unusable_reason() -> str | None:
    """None when headless Chromium is installed and starts here; else why not (once per process)."""
    if not _REASON:
        found = binary()
        if found is None:
            _REASON.append("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs "
                           "it)")
        else:
            try:
                proc = subprocess.run([found, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                                       "data:text/html,<p>ok</p>"], capture_output=True, text=True, timeout=120)
                ok = "<p>ok</p>" in proc.stdout
                _REASON.append(None if ok else f"{found} does not start headless here (exit {proc.returncode}: "
                                               f"{proc.stderr.strip()[-300:]})")
            except (OSError, subprocess.TimeoutExpired) as e:
                _REASON.append(f"{found} does not start headless here ({type(e).__name__}: {e})")
    return _REASON[0]


class Page:
    def __init__(self, browser: "Chromium", session: str):
        self.browser, self.session = browser, session
        self.console: list[dict] = []  # {"source", "level", "text"}

    def send(self, method: str, **params):
        return self.browser.send(method, session=self.session, **params)

    def evaluate(self, expression: str):
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"evaluate failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, path: str, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = self.send("Page.captureScreenshot", format="png", clip={"x": 0, "y": 0, "width": width,
                                                                         "height": height, "scale": 1})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def pdf(self) -> bytes:
        return base64.b64decode(self.send("Page.printToPDF", printBackground=False)["data"])


STARTS = 3  # a browser that exits before its first answer (seen once on 2 loaded cores) is started again


class Chromium:
    def __init__(self):
        for start in range(STARTS):
            self._start()
            try:
                self.send("Browser.getVersion")
                return
            except (OSError, RuntimeError, TimeoutError) as e:
                self.close()
                if start == STARTS - 1:
                    raise RuntimeError(f"headless Chromium did not answer on its protocol pipe after {STARTS} "
                                       f"starts ({type(e).__name__}: {e})") from None

    def _start(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds():  # in the child: the protocol's fds 3 and 4
            # Moved above 4 first: a pipe end that is itself fd 3 or 4 would be overwritten by the
            # other's dup2.
            r, w = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4),  # kept open by the child after fds() set them
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next, self._buffer, self._events = 0, b"", []
        self.pages: dict[str, Page] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the protocol pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._on_event(message)
        return message

    def _on_event(self, message: dict) -> None:
        page = self.pages.get(message.get("sessionId"))
        params = message.get("params", {})
        if page is not None:
            if message["method"] == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                page.console.append({"source": "console", "level": params.get("type"), "text": text})
            elif message["method"] == "Runtime.exceptionThrown":
                page.console.append({"source": "exception", "level": "error",
                                     "text": json.dumps(params.get("exceptionDetails"))[:500]})
            elif message["method"] == "Log.entryAdded":
                e = params.get("entry", {})
                page.console.append({"source": e.get("source"), "level": e.get("level"), "text": e.get("text")})
        self._events.append(message)

    def send(self, method: str, session: str | None = None, **params):
        self._next += 1
        ident = self._next
        message = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def wait_event(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for k, e in enumerate(self._events):
            if e["method"] == method and e.get("sessionId") == session:
                return self._events.pop(k)
        while True:
            e = self._read_message(deadline)
            if e.get("method") == method and e.get("sessionId") == session:
                self._events.remove(e)
                return e

    def open(self, url: str, width: int = 1280, height: int = 900) -> Page:
        """A new tab at `url`, once its load event fired; console and log entries are collected
        from before the navigation starts."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = self.pages[session] = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        page.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", session)
        return page
