"""The cell's kernel record (gdn.matrix.kernels_plugin): a pytest run writes what its tests' calls ran to
kernels.json, and a failing test's line in tests.jsonl carries the calls that test made, with and
without pytest-xdist (whose workers send the calls with each report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gdn.matrix import kernels, outcomes
from repo_paths import SRC

pytestmark = pytest.mark.tooling

TESTS = """
import json
import torch
import gdn

def test_passes():
    gdn.l2norm(torch.randn(2, 4))

def test_fails(record_property):
    q = k = torch.randn(1, 5, 1, 8)
    v = torch.randn(1, 5, 2, 8)
    g = -torch.rand(1, 5, 2)
    beta = torch.rand(1, 5, 2)
    gdn.chunk_gated_delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta.bfloat16())
    record_property("gdn_comparison", json.dumps({"mode": "eager", "compared": {}, "fell_back": {}}))
    assert False, "fails on purpose"
"""


@pytest.mark.parametrize("workers", [None, "2"])
def test_kernels_json_and_the_failing_tests_kernels(tmp_path, workers):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_suite.py").write_text(TESTS)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pytest", str(tmp_path / "suite"), "-q", "-p", "no:cacheprovider"]
    command += ["-p", "gdn.matrix.outcomes", f"{outcomes.OPTION}={out / outcomes.FILE}"]
    command += ["-p", "gdn.matrix.kernels_plugin", f"{kernels.OPTION}={out / 'kernels.json'}"]
    command += ["-n", workers] if workers else ["-p", "no:xdist"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "GDN_COMPUTE_MODE": "eager"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]

    steps = json.loads((out / "kernels.json").read_text())["steps"]
    ran = {(r["level"], r["function"], r["dtype"], r["ran"]): r["calls"] for r in steps["tests"]}
    assert ran == {
        ("gdn", "l2norm", "float32", "eager"): 1,
        ("gdn", "chunk_gated_delta_rule", "bfloat16", "eager"): 1,
    }
    lines = {t.nodeid.split("::")[-1]: t for t in outcomes.read_finished(out / outcomes.FILE)}
    assert lines["test_passes"].kernels is None
    [call] = lines["test_fails"].kernels
    expected = ("chunk_gated_delta_rule", "bfloat16", "eager", 1)
    assert (call["function"], call["dtype"], call["ran"], call["calls"]) == expected
    assert lines["test_fails"].comparison == {"mode": "eager", "compared": {}, "fell_back": {}}
