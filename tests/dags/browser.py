"""Headless Chromium (Debian's package) driven through the DevTools protocol: a real browser that
keeps its cookies between pages, so a test can log in through a real form and then open a page."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_S = 60


class Browser:
    """One Chromium process with one tab; `with Browser(folder) as b: b.open(url); b.evaluate(js)`."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM, "Chromium is not installed: `make test` installs Debian's chromium package (needs root)"
        self.profile = profile
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._connect()
        except BaseException:
            self.process.kill()
            raise
        return self

    def _connect(self) -> None:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT_S
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.process.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        self._stack = ExitStack()
        self.socket = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None,
                                                        open_timeout=WAIT_S))

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def call(self, method: str, **params: Any) -> dict:
        """One DevTools command; its result (events arriving meanwhile are skipped)."""
        message_id = next(self._ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=WAIT_S))
            if message.get("id") == message_id:
                assert "error" not in message, message["error"]
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """Navigates and waits until the document has loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def wait_for(self, condition: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not self.evaluate(f"Boolean({condition})"):
            assert time.monotonic() < deadline, f"timed out waiting for {condition} at {self.evaluate('location.href')}"
            time.sleep(0.2)

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def fill(self, selector: str, value: str) -> None:
        """Types into a (React-controlled) input: the native setter, then the input event React listens to."""
        self.evaluate(f"""(() => {{
            const input = document.querySelector({json.dumps(selector)});
            const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
            setter.call(input, {json.dumps(value)});
            input.dispatchEvent(new Event('input', {{bubbles: true}}));
        }})()""")

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the whole page (beyond the window), written to `path`; its bytes."""
        import base64

        size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        self.call("Emulation.setDeviceMetricsOverride", width=max(1280, size[0]), height=size[1],
                  deviceScaleFactor=1, mobile=False)
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        path.write_bytes(png)
        return png

    def cookie_names(self) -> list[str]:
        return [c["name"] for c in self.call("Network.getCookies")["cookies"]]
