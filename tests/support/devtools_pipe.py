"""Drive headless Chromium through its DevTools protocol over a pipe, for tests that measure a page's layout.

`--dump-dom` and `--screenshot` cannot show a phone: headless Chromium will not make its window narrower than
500 px. The DevTools protocol can emulate any screen (Emulation.setDeviceMetricsOverride), evaluate a script
in the page whatever the page's Content-Security-Policy says (Runtime.evaluate), and take a screenshot.

`--remote-debugging-pipe` makes the browser read protocol messages from its fd 3 and write them to its fd 4,
each a JSON object ended by a NUL byte: no port to pick, no websocket library. A small Python trampoline puts
our pipe ends at 3 and 4 in the child and then execs the browser.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pathlib
import select
import subprocess
import sys
import time
from typing import Any

_TRAMPOLINE = """
import os, sys
read, write = int(sys.argv[1]), int(sys.argv[2])
os.dup2(read, 3)
os.dup2(write, 4)
os.close(read)
os.close(write)
os.execv(sys.argv[3], sys.argv[3:])
"""


class DevToolsError(RuntimeError):
    pass


class Browser:
    """One headless Chromium; `timeout` bounds each wait for an answer or an event (a loaded 2-core machine
    can take many seconds to lay out a long page)."""

    def __init__(self, chromium: str, flags: list[str], log: pathlib.Path, timeout: float = 120.0):
        self.timeout = timeout
        self.log = log
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # the child's copies, kept above fd 9 so the trampoline's dup2 onto 3 and 4 cannot overwrite one of them
        child = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._write, self._read = to_browser_w, from_browser_r
        try:
            with open(log, "wb") as err:  # a file, not a pipe: a chatty browser must never block on stderr
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _TRAMPOLINE, str(child[0]), str(child[1]), chromium, *flags]
                    + ["--remote-debugging-pipe", "about:blank"],
                    pass_fds=child,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
        except BaseException:
            os.close(self._write)
            os.close(self._read)
            raise
        finally:
            for fd in child:
                os.close(fd)
        self._buf = b""
        self._last_id = 0
        self._events: list[dict] = []

    def _send(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._write, data) :]

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError(
                    f"Chromium did not answer within {self.timeout:g} s; its log: {self._tail()}"
                )
            if select.select([self._read], [], [], left)[0]:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise DevToolsError(f"Chromium closed the DevTools pipe; its log: {self._tail()}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are kept for `wait_event`."""
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str, session: str | None = None) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    return self._events.pop(i)
            reply = self._receive(deadline)
            if "method" in reply:
                self._events.append(reply)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self._send({"id": self._last_id + 1, "method": "Browser.close", "params": {}})
                self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._write)
            os.close(self._read)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Tab:
    """One page of the browser, shown on an emulated screen `width` x `height` CSS pixels. `mobile` emulates a
    phone: the page's `<meta name="viewport">` applies and a page wider than the screen is zoomed out to fit,
    as a phone's browser does (so window.innerWidth grows past `width`)."""

    def __init__(self, browser: Browser, width: int, height: int, scale: float = 1.0, mobile: bool = False):
        self.browser = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": scale, "mobile": mobile},
        )

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.browser.call(method, params, self.session)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event (styles laid out, inline SVG parsed)."""
        self.call("Page.navigate", {"url": url})
        self.browser.wait_event("Page.loadEventFired", self.session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise DevToolsError(f"the script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """A PNG of the whole page, as wide as its content and as tall as the page."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        return base64.b64decode(shot["data"])
