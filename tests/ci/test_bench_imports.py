"""Every benchmark script under bench/ imports: the studies run on a lent device, where a broken import
costs the device time of a call, so a module that moved under them is found here first."""

from __future__ import annotations

import importlib

import pytest

from repo_paths import ROOT

pytestmark = pytest.mark.tooling

BENCH = ROOT / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_imports(script):
    try:
        importlib.import_module(f"bench.{script}")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] in ("bench", "gdn"):
            raise  # one of the project's own modules is missing: the script is broken
        pytest.skip(f"needs {exc.name}, which is not installed here")
