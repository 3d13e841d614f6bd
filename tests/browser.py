"""Open an HTML file in a real headless browser (Debian's ``chromium``) from tests.

Without a browser the calling test skips, unless ``PACKER_REQUIRE_BROWSER=1`` (CI, set by
scripts/test.sh when scripts/install.sh installed chromium), where it fails.

What a page is checked for (``load``):

* the DOM after load (``--dump-dom``), with a probe script appended to a COPY of the page that
  records every image that failed to decode in ``<body data-broken-images=N>`` and logs it as
  a console error (the page itself has no script);
* console messages (``--enable-logging=stderr``: chromium prints ``INFO:CONSOLE`` lines);
* a screenshot (``--screenshot``, same run) for pixel checks.

Every browser call runs under a timeout.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REQUIRE_ENV = "PACKER_REQUIRE_BROWSER"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 90

_PROBE = """<script>
window.addEventListener("load", function () {
  var broken = 0;
  document.querySelectorAll("img").forEach(function (img) {
    if (!img.complete || img.naturalWidth === 0) { broken++; console.error("image did not load: " + img.alt); }
  });
  document.body.setAttribute("data-broken-images", String(broken));
  document.body.setAttribute("data-probe", "done");
});
</script>"""


def find_browser() -> str:
    """Path of a headless-capable chromium, or skip (fail with PACKER_REQUIRE_BROWSER=1)."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    why = f"no headless browser found (looked for {', '.join(CANDIDATES)}; apt-get install chromium)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}", pytrace=False)
    pytest.skip(why)


@dataclass
class Page:
    dom: str
    console: list        # console messages (text of each INFO:CONSOLE line)
    screenshot: Path

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.dom))


def _run(browser: str, args: list, profile: Path) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=dict(os.environ, HOME=str(profile)))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"browser did not finish within {TIMEOUT_S} s: {' '.join(cmd)}\n{exc.stderr}")


def _console(stderr: str) -> list:
    return [line.split("CONSOLE", 1)[1] for line in stderr.splitlines() if ":CONSOLE" in line]


def load(html: Path, workdir: Path, width: int = 1400, height: int = 4000) -> Page:
    """Render ``html`` in headless chromium: DOM (with the image probe), console, screenshot."""
    browser = find_browser()
    workdir.mkdir(parents=True, exist_ok=True)
    probed = workdir / "probed.html"
    text = html.read_text(encoding="utf-8")
    probed.write_text(text.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    shot = workdir / "shot.png"
    run = _run(browser, ["--virtual-time-budget=10000", f"--window-size={width},{height}",
                         f"--screenshot={shot}", "--dump-dom", probed.as_uri()], workdir / "profile")
    assert run.returncode == 0 and shot.exists(), run.stderr[-3000:]
    return Page(run.stdout, _console(run.stderr), shot)
