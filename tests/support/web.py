"""The schedules page for the tests and the screenshots: ``celery anarchon web`` started as a
real process (its port read from its first lines), and a real headless Chromium driven by
Playwright (Debian's ``/usr/bin/chromium``: nothing is downloaded)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .processes import start_celery

__all__ = ["CHROMIUM", "browser", "start_web", "web_port"]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
#: Chromium headless, without a sandbox (containers), and without any traffic of its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_SERVING = re.compile(r"anarchon web: serving http://\S+?:(\d+)/")


def start_web(env: dict[str, str], log: Path, *args: str, app: str) -> subprocess.Popen[bytes]:
    """``celery -A app anarchon web --port 0 ARGS...``, its output in ``log``."""
    return start_celery(["anarchon", "web", "--port", "0", *args], log, env, app=app, cwd=ROOT)


def web_port(log: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """The port the page is served on, once it says so; RuntimeError, with its output, when it
    stops first or does not say it within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _SERVING.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"the page stopped ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"the page did not start within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
