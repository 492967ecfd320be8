"""Headless Chromium for the tests that render a page. A developer's machine may have no browser: there
such a check is skipped, with the install hint. CI installs Chromium and sets GDN_REQUIRE_CHROMIUM=1,
so that there the check can never pass as skipped: a missing browser fails it."""

from __future__ import annotations

import os
import shutil

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
