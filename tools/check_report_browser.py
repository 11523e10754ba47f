"""Open a marginface report in headless Chromium and check that it works in a real browser.

For each width (default: a laptop at 1366 px and a phone at 390 px) the script loads the
report from disk, waits until every interactive figure is drawn, and fails (exit status 1) on:

* a JavaScript exception, a ``console.error`` or a browser log entry of level error;
* a request for anything that is not in the file itself (the report must work offline:
  only ``file:``, ``data:`` and ``blob:`` URLs are allowed);
* an interactive figure that was not drawn, or drawn without WebGL (the 3-D scenes need it);
* no hover label with the sample's angle when the mouse moves over the first figure;
* a page wider than the window (something that does not wrap or scale at a phone's width).

It saves a full-page screenshot per width, and one of the first interactive figure with its
hover label showing.

Not part of ``make test`` (it needs Chromium: ``apt-get install chromium``). Chromium is driven
through its DevTools protocol over a pipe (``--remote-debugging-pipe``): no extra Python
package, no network port. Usage (from the repository root)::

    .venv/bin/python tools/check_report_browser.py runs/demo/report.html --out runs/browser-check
    .venv/bin/python tools/check_report_browser.py REPORT --width 1366 --width 390 --width 768

The screenshots of the demo's report are described in docs/report.md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_WIDTHS = (1366, 390)
HEIGHTS = {1366: 768, 390: 844}  # a common laptop screen, a common phone screen
PHONE_BELOW = 600  # widths under this are emulated as a mobile device (touch, DPR 2)
MAX_HOVER_ATTEMPTS = 1500  # mouse positions tried (10 px apart) before giving up on a hover
ALLOWED_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")


class BrowserError(RuntimeError):
    """Chromium failed or did not answer in time."""


class DevTools:
    """A minimal client of Chromium's DevTools protocol over ``--remote-debugging-pipe``:
    JSON messages ended by a NUL byte, commands on fd 3, replies and events on fd 4."""

    def __init__(self, chromium: str, user_dir: Path, log_path: Path) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def attach_pipes() -> None:  # runs in the child, before exec
            # copies above 10 first: a pipe end may itself be fd 3 or 4
            high_read = fcntl.fcntl(to_browser_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(from_browser_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        args = [
            chromium,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # root in a container has no user namespace for the sandbox
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--use-angle=swiftshader",  # software WebGL: no GPU needed
            "--enable-unsafe-swiftshader",
            "--hide-scrollbars",
            f"--user-data-dir={user_dir}",
            "about:blank",
        ]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=attach_pipes,
            pass_fds=(3, 4),  # kept open by Popen: the pipes attach_pipes put there
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._condition = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as stream:
            while chunk := stream.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        with self._condition:
                            self._replies[message["id"]] = message
                            self._condition.notify_all()
                    else:
                        self.events.put(message)
        with self._condition:
            self._condition.notify_all()

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Send one command and return its result (``BrowserError`` on an error reply)."""
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._condition:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise BrowserError(f"no reply to {method} (Chromium exited or hung)")
                self._condition.wait(min(left, 0.5))
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        """Ask Chromium to quit; kill it if it does not within 10 s."""
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close", timeout=10.0)
        try:
            self.process.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        self._log.close()


def _evaluate(tools: DevTools, session: str, expression: str) -> Any:
    result = tools.call(
        "Runtime.evaluate",
        {"expression": expression, "returnByValue": True, "awaitPromise": True},
        session,
    )
    if "exceptionDetails" in result:
        raise BrowserError(f"evaluating {expression!r}: {result['exceptionDetails']}")
    return result["result"].get("value")


def _problems_from_events(tools: DevTools, session: str) -> list[str]:
    """The failures among the events received so far for ``session``."""
    problems = []
    while True:
        try:
            event = tools.events.get_nowait()
        except queue.Empty:
            return problems
        if event.get("sessionId") != session:
            continue
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            problems.append(f"JavaScript exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            problems.append(f"console.error: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            problems.append(f"browser error ({entry['source']}): {entry['text']}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(ALLOWED_SCHEMES):
                problems.append(f"network request (the report must work offline): {url}")
        elif method == "Inspector.targetCrashed":
            problems.append("the page crashed")


def check_width(
    tools: DevTools, url: str, width: int, out: Path, stem: str, timeout: float
) -> tuple[list[str], dict[str, Any]]:
    """Load ``url`` at ``width`` CSS pixels; return (problems, facts) and save screenshots."""
    target = tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    for domain in ("Runtime", "Log", "Page", "Network", "Inspector"):
        tools.call(f"{domain}.enable", session=session)
    mobile = width < PHONE_BELOW
    height = HEIGHTS.get(width, 900)
    tools.call(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": width,
            "height": height,
            "deviceScaleFactor": 2 if mobile else 1,
            "mobile": mobile,
        },
        session,
    )
    if mobile:
        tools.call("Emulation.setTouchEmulationEnabled", {"enabled": True}, session)
    tools.call("Page.bringToFront", session=session)  # a background tab draws no frames
    tools.call("Page.navigate", {"url": url}, session)
    problems: list[str] = []
    deadline = time.monotonic() + timeout
    expected = drawn = None
    while time.monotonic() < deadline:
        state = _evaluate(
            tools,
            session,
            "document.readyState === 'complete' ? [document.querySelectorAll("
            "'div.plotly-figure').length, document.body.getAttribute('data-figures-drawn')]"
            " : null",
        )
        if state is not None:
            expected, drawn = state
            if expected == 0 or drawn is not None:
                break
        time.sleep(0.25)
    else:
        problems.append(f"timed out after {timeout:.0f} s waiting for the figures to be drawn")
    time.sleep(1.0)  # let WebGL finish its first frames
    facts = _evaluate(
        tools,
        session,
        """(() => {
          const figures = Array.from(document.querySelectorAll('div.plotly-figure'));
          const gl = document.createElement('canvas').getContext('webgl');
          return {
            figures: figures.length,
            figures_with_canvas: figures.filter(f => f.querySelector('canvas')).length,
            webgl_missing_notice: document.body.innerText.includes('WebGL is not supported'),
            webgl: gl !== null,
            images: document.images.length,
            images_loaded: Array.from(document.images).filter(i => i.naturalWidth > 0).length,
            scroll_width: document.documentElement.scrollWidth,
            inner_width: window.innerWidth,
            page_height: document.documentElement.scrollHeight,
          };
        })()""",
    )
    facts["drawn"] = drawn
    if expected and str(drawn) != str(expected):
        problems.append(f"{drawn} of {expected} interactive figures drawn")
    if facts["figures_with_canvas"] < facts["figures"]:
        problems.append(
            f"only {facts['figures_with_canvas']} of {facts['figures']} figures have a canvas"
        )
    if facts["webgl_missing_notice"] or (facts["figures"] and not facts["webgl"]):
        problems.append("WebGL is not available: the 3-D figures cannot be drawn")
    if facts["images_loaded"] < facts["images"]:
        problems.append(f"only {facts['images_loaded']} of {facts['images']} pictures loaded")
    if facts["scroll_width"] > facts["inner_width"]:
        problems.append(
            f"the page is {facts['scroll_width']} px wide in a {facts['inner_width']} px "
            "window (something does not wrap or scale)"
        )
    shots = {}
    full = tools.call(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": facts["page_height"], "scale": 1},
        },
        session,
        timeout=120.0,
    )
    shots["full"] = out / f"{stem}-{width}-full.png"
    shots["full"].write_bytes(base64.b64decode(full["data"]))
    if facts["figures"]:
        box = _evaluate(
            tools,
            session,
            "(() => { const f = document.querySelector('div.plotly-figure').closest('figure');"
            " f.scrollIntoView(); const r = f.getBoundingClientRect();"
            " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width,"
            " height: r.height}; })()",
        )
        time.sleep(0.5)
        facts["hover"] = _hover_some_point(tools, session)
        if facts["hover"] is None:
            problems.append("no hover label appeared over the first interactive figure")
        elif "θ to its center" not in facts["hover"] and "mean direction" not in facts["hover"]:
            problems.append(f"the hover label lacks the angle: {facts['hover']!r}")
        figure = tools.call(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": False, "clip": {**box, "scale": 1}},
            session,
        )
        shots["figure"] = out / f"{stem}-{width}-figure.png"
        shots["figure"].write_bytes(base64.b64decode(figure["data"]))
    problems += _problems_from_events(tools, session)
    tools.call("Target.closeTarget", {"targetId": target})
    facts["screenshots"] = {k: str(v) for k, v in shots.items()}
    return problems, facts


def _hover_some_point(tools: DevTools, session: str) -> str | None:
    """Move the mouse over the first interactive figure's scene, on a grid around its center,
    until plotly shows a hover label; return the label's text (None if none appeared)."""
    box = _evaluate(
        tools,
        session,
        "(() => { const r = document.querySelector('div.plotly-figure')"
        ".getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; })()",
    )
    left, top, width, height = box
    step, attempts = 10, 0
    for y in range(int(top + 0.15 * height), int(top + 0.9 * height), step):
        for x in range(int(left + 0.1 * width), int(left + 0.75 * width), step):
            attempts += 1
            if attempts > MAX_HOVER_ATTEMPTS:
                return None
            tools.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, session)
            text = _evaluate(  # after two frames: the 3-D scene picks in its render loop
                tools,
                session,
                "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() =>"
                " { const t = document.querySelector('div.plotly-figure .hovertext');"
                " const lines = t ? Array.from(t.querySelectorAll('tspan.line')) : [];"
                " done(t ? (lines.length ? lines.map(l => l.textContent).join(' | ')"
                " : t.textContent) : null); })))",
            )
            if text:
                return text
    return None


def find_chromium(name: str | None) -> str:
    """The Chromium executable: ``name``, else the first of chromium, chromium-browser,
    google-chrome on PATH."""
    for candidate in [name] if name else ["chromium", "chromium-browser", "google-chrome"]:
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit(
        "check_report_browser: Chromium not found; install it (Debian: apt-get install "
        "chromium) or pass --chromium PATH"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the report.html to check")
    parser.add_argument("--out", type=Path, default=Path("runs/browser-check"))
    parser.add_argument(
        "--width", type=int, action="append", help="CSS pixels (repeatable; default 1366, 390)"
    )
    parser.add_argument("--chromium", help="the browser executable (default: found on PATH)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per width")
    args = parser.parse_args(argv)
    report = args.report.resolve()
    if not report.is_file():
        parser.error(f"no such file: {args.report}")
    chromium = find_chromium(args.chromium)
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [chromium, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"{version}; {report} ({report.stat().st_size / 1e6:.2f} MB)")
    failed = False
    with tempfile.TemporaryDirectory(prefix="marginface-chromium-") as user_dir:
        tools = DevTools(chromium, Path(user_dir), args.out / "chromium.log")
        try:
            for width in args.width or DEFAULT_WIDTHS:
                problems, facts = check_width(
                    tools, report.as_uri(), width, args.out, report.stem, args.timeout
                )
                status = "FAIL" if problems else "ok"
                print(
                    f"[{status}] width {width}: {facts['drawn'] or 0}/{facts['figures']} "
                    f"interactive figures drawn (WebGL {'yes' if facts['webgl'] else 'no'}), "
                    f"{facts['images_loaded']}/{facts['images']} pictures, page "
                    f"{facts['scroll_width']}x{facts['page_height']} px"
                )
                for problem in problems:
                    print(f"    {problem}")
                if facts.get("hover"):
                    print(f"    hover label: {facts['hover']}")
                for kind, path in facts["screenshots"].items():
                    print(f"    screenshot ({kind}): {path}")
                failed = failed or bool(problems)
        finally:
            tools.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
