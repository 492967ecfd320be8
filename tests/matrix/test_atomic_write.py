"""Files the matrix writes atomically get the mode any file written here gets (a report served from a
web root or read by another user of the runner must not come out owner-only), and a rewrite keeps the
mode a file already has."""

from __future__ import annotations

import os
import stat

import pytest

from gdn.matrix.jsonio import atomic_write

pytestmark = pytest.mark.tooling


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "report.html", "<html></html>\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "report.html") == 0o644


def test_a_rewritten_file_keeps_its_mode(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("{}\n")
    target.chmod(0o640)
    atomic_write(target, '{"cells": []}\n')
    assert target.read_text() == '{"cells": []}\n'
    assert _mode(target) == 0o640
