"""The report's browser check: skipped with the install hint where no Chromium is installed, failed
instead where GDN_REQUIRE_CHROMIUM=1 (CI, which installs Chromium) so that it never skips there."""

from __future__ import annotations

import re

import pytest
import yaml

import browser
from repo_paths import ROOT

pytestmark = pytest.mark.tooling


def test_no_browser_skips_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.delenv(browser.REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape("apt-get install chromium")):
        browser.chromium()


def test_no_browser_fails_where_it_is_required(monkeypatch):
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setenv(browser.REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=re.escape("apt-get install chromium")):
        browser.chromium()


@pytest.mark.parametrize("required", [None, "1"])
def test_an_installed_browser_is_used(monkeypatch, required):
    monkeypatch.setattr(browser.shutil, "which", {"chromium-browser": "/usr/bin/chromium-browser"}.get)
    if required is None:
        monkeypatch.delenv(browser.REQUIRE, raising=False)
    else:
        monkeypatch.setenv(browser.REQUIRE, required)
    assert browser.chromium() == "/usr/bin/chromium-browser"


def test_ci_installs_chromium_and_requires_the_check():
    run = (ROOT / ".ci" / "run").read_text()
    tests_at = run.index('eval "$test_command"')  # the README's test command
    assert re.search(r"^apt-get install .*\bchromium\b", run[:tests_at], re.M)
    assert re.search(rf"^export {browser.REQUIRE}=1\b", run[:tests_at], re.M)
    job = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["tests"]
    assert job["env"][browser.REQUIRE] == "1"
    assert any("chromium" in step.get("run", "") for step in job["steps"])
