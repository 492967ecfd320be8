"""Headless Chromium for the tests that render a page. A developer's machine may have no browser: there
such a check is skipped, with the install hint. CI installs Chromium and sets GDN_REQUIRE_CHROMIUM=1,
so that there the check can never pass as skipped: a missing browser fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REQUIRE = "GDN_REQUIRE_CHROMIUM"
INSTALL_HINT = "apt-get install chromium (chromium-browser on Ubuntu)"


def chromium() -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser:
        return browser
    missing = f"headless Chromium is not installed: {INSTALL_HINT}"
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{missing} ({REQUIRE}=1: this check must run here)")
    pytest.skip(missing)


def headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium once (a page's DOM with --dump-dom, a --screenshot), offline and quiet."""
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
