"""A headless chromium driven by the tests over the Chrome DevTools Protocol, with the standard library only.

    with Chromium.start(profile_dir) as browser:          # or pytest.skip(reason) where no chromium is installed
        page = browser.new_page()
        page.goto("file:///.../explorer.html")
        page.click(".token:nth-child(3)")                  # a real mouse click at the element's centre
        page.evaluate("document.querySelectorAll('.token').length")
        page.screenshot("page.png")
        page.problems()                                     # console errors, uncaught exceptions, failed requests

The protocol travels on a pipe (``--remote-debugging-pipe``: chromium reads commands from its fd 3 and writes
replies and events to its fd 4, each a JSON text ended by a NUL byte), so no port is opened and no websocket
library is needed. The browser is Debian's ``chromium`` (``apt-get install chromium``; ``make test`` installs it
when run as root), never a download. POSIX only (the pipe is handed over as fds 3 and 4).
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--window-size=1280,1000", "--remote-debugging-pipe")
TIMEOUT = 60.0


def find_chromium():
    """The chromium binary to drive (``NUMFORMER_CHROMIUM`` first), or None."""
    for name in filter(None, (os.environ.get("NUMFORMER_CHROMIUM"), *CANDIDATES)):
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def skip_reason():
    """Why the browser tests cannot run here, or None."""
    if os.name != "posix":
        return "the headless-browser tests hand chromium a pipe as fds 3 and 4 (POSIX only)"
    if find_chromium() is None:
        return ("no chromium installed (Debian/Ubuntu: `apt-get install chromium`; `make test` installs it when run "
                "as root; or set NUMFORMER_CHROMIUM to a Chrome or Chromium binary)")
    return None


class ProtocolError(RuntimeError):
    pass


class Chromium:
    """One headless chromium process and its DevTools pipe."""

    def __init__(self, process, to_browser, from_browser):
        self.process, self._out, self._in = process, to_browser, from_browser
        self._buffer, self._next_id, self.events = b"", 0, []

    @classmethod
    def start(cls, profile_dir):
        binary = find_chromium()
        to_r, to_w = os.pipe()          # we write commands -> chromium's fd 3
        from_r, from_w = os.pipe()      # chromium's fd 4 -> we read replies and events

        def hand_over():                # in the child, before exec: the pipe ends become fds 3 and 4
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                   preexec_fn=hand_over, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        return cls(process, to_w, from_r)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self.send("Browser.close")
        except (ProtocolError, OSError, TimeoutError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._out, self._in):
            os.close(fd)

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ProtocolError("chromium closed its DevTools pipe (it exited)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None, timeout=TIMEOUT):
        """The result of one protocol command; events that arrive meanwhile are kept in ``events``."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ProtocolError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, session=None, timeout=TIMEOUT):
        """The first event ``method`` (of ``session``) not seen yet; it is removed from ``events``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method and (session is None or event.get("sessionId") == session):
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def new_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        return page


class Page:
    """One tab: navigate, evaluate JavaScript, click, take screenshots, list what went wrong."""

    def __init__(self, browser, session):
        self.browser, self.session = browser, session

    def send(self, method, params=None):
        return self.browser.send(method, params, self.session)

    def goto(self, url):
        self.send("Page.navigate", {"url": url})
        self.browser.wait_for("Page.loadEventFired", self.session)

    def evaluate(self, expression):
        """The value of a JavaScript expression (a promise is awaited), as JSON gives it back."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise ProtocolError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def click(self, selector):
        """A real mouse click (pressed, released) at the centre of the first element ``selector`` finds."""
        box = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                            f"e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                            f"return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def screenshot(self, path, full_page=True):
        params = {"format": "png", "captureBeyondViewport": full_page}
        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))
        return path

    def _events(self, method):
        return [e["params"] for e in self.browser.events
                if e.get("method") == method and e.get("sessionId") == self.session]

    def requested_urls(self):
        return [p["request"]["url"] for p in self._events("Network.requestWillBeSent")]

    def problems(self):
        """Console errors and warnings, uncaught exceptions, log errors and failed requests, as text."""
        self.evaluate("0")                              # let events already sent arrive
        out = [f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p['args']]}"
               for p in self._events("Runtime.consoleAPICalled") if p["type"] in ("error", "warning", "assert")]
        out += [f"exception: {p['exceptionDetails']}" for p in self._events("Runtime.exceptionThrown")]
        out += [f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}"
                for p in self._events("Log.entryAdded") if p["entry"]["level"] in ("error", "warning")]
        out += [f"request failed: {p.get('errorText')}" for p in self._events("Network.loadingFailed")]
        return out
