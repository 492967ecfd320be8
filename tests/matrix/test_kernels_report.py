"""What ran, from a cell's run to its report and to the diff of two reports, on labelled stand-ins.

Two cells run the same small suite through the cell entry (gdn.matrix.entry), with the stand-in fla 0.6.0
registry of tests/peer_standins on their path: the `tilelang` cell also has tilelang installed (the
stand-in flashqla_site), which makes fla's TileLang backend take the fp32 `common.chunk_bwd_dqkwg` of
fla's chunk backward, with a wrong kernel; the `triton` cell runs fla's own function there. The suite:

- `test_fla_kernel_matches_eager`: fla's adapter without its numeric probe, an fp32 forward+backward
  against eager: fails on the `tilelang` cell, passes on the other;
- `test_fla_through_the_resolver`: under compute mode fla, as the grpo family compares: on the
  `tilelang` cell fla's probe rejects its chunk op, which falls back to eager, so the test passes while
  comparing nothing of fla: its recorded comparison says so.

The cell's kernels.json, the failing test's kernel lines and the report name the TileLang dispatch; the
diff from the `triton` cell to the `tilelang` cell names the sub-function's change and the comparison's
loss, and exits 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdn.matrix import diff, report_build, report_html, report_markdown
from gdn.matrix.jsonio import write_json
from gdn.matrix.schema import CellOutcome
from repo_paths import SRC, TESTS
from report_models import typed

pytestmark = pytest.mark.tooling

STANDINS = TESTS / "peer_standins"
SUITE = """
import dataclasses, json
import pytest, torch
import gdn
import gdn.backends.fla as fla_backend
import gdn.resolve as resolver
from gdn.matrix.outcomes import COMPARISON

OP = "chunk_gated_delta_rule"
pytestmark = pytest.mark.single_op


def inputs():
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 70, 2, 128, generator=gen).requires_grad_() for _ in range(2))
    v = torch.randn(1, 70, 4, 128, generator=gen).requires_grad_()
    g = torch.nn.functional.logsigmoid(torch.randn(1, 70, 4, generator=gen)).requires_grad_()
    beta = torch.rand(1, 70, 4, generator=gen).requires_grad_()
    return q, k, v, g, beta


def dg_under(mode):
    q, k, v, g, beta = inputs()
    with resolver.compute_mode_override(mode):
        o, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    o.sum().backward()
    return g.grad


def widen(**fields):
    fla = fla_backend.FlaBackend()
    gdn.register_backend(dataclasses.replace(fla, devices=("cpu",), auto_rank={"cpu": 0}, **fields), replace=True)


def test_fla_kernel_matches_eager():
    widen(needs_probe=False)
    got, want = dg_under("fla"), dg_under("eager")
    assert ((got - want).norm() / want.norm()).item() < 1e-4


def test_fla_through_the_resolver(record_property):
    widen()
    dg_under("fla")
    with resolver.compute_mode_override("fla"):
        res = resolver.decided(OP, "cpu")
    compared = {OP: res.route} if res.backend == "fla" else {}
    fell_back = {} if compared else {OP: res.route + ": " + "; ".join(r.reason for r in res.rejected)}
    record_property(COMPARISON, json.dumps({"mode": "fla", "compared": compared, "fell_back": fell_back}))
"""


def run_cell(root: Path, name: str, *sites: str) -> Path:
    """The cell entry on the suite with the stand-in sites on the path; cell.json as the runner writes it."""
    suite = root / "suite"
    if not suite.exists():
        suite.mkdir()
        (suite / "test_fla_suite.py").write_text(SUITE)
    out = root / "results" / name
    path = os.pathsep.join([*(str(STANDINS / s) for s in sites), str(SRC)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLA_", "GDN_"))} | {"PYTHONPATH": path}
    command = [sys.executable, "-m", "gdn.matrix.entry", "--cell", name, "--out", str(out)]
    command += ["--families", "single_op", "--tests", str(suite)]
    done = subprocess.run(command, env=env | {"GDN_TEST_WORKERS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    status = "passed" if done.returncode == 0 else "failed"
    CellOutcome(name, status, "cpu", "host", "host", exit_code=done.returncode, families=["single_op"]).write(out)
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels")
    run_cell(root, "triton", "fla_registry")
    run_cell(root, "tilelang", "fla_registry", "flashqla_site")
    built = report_build.build_report(root / "results").to_json()
    old = {**built, "cells": [c for c in built["cells"] if c["name"] == "triton"]}
    new = {**built, "cells": [c for c in built["cells"] if c["name"] == "tilelang"]}
    write_json(root / "old.json", {**old, "cells": [{**c, "name": "cpu"} for c in old["cells"]]})
    write_json(root / "new.json", {**new, "cells": [{**c, "name": "cpu"} for c in new["cells"]]})
    return root, {c["name"]: c for c in built["cells"]}, built


def test_kernels_json_names_the_tilelang_dispatch(reports):
    root, _, _ = reports
    steps = json.loads((root / "results" / "tilelang" / "kernels.json").read_text())["steps"]
    ran = {(k["function"], k["dtype"], k["ran"]) for k in steps["tests"] if k["level"] == "fla" and not k["during"]}
    assert ("common.chunk_bwd_dqkwg", "float32", "tilelang") in ran
    assert ("gated_delta_rule.chunk_gated_delta_rule", "float32", "triton") in ran
    other = json.loads((root / "results" / "triton" / "kernels.json").read_text())["steps"]
    assert ("common.chunk_bwd_dqkwg", "float32", "triton") in {
        (k["function"], k["dtype"], k["ran"]) for k in other["tests"] if k["level"] == "fla"
    }


def test_the_failing_test_carries_its_kernels_into_the_report(reports):
    _, cells, built = reports
    assert cells["triton"]["status"] == "passed" and cells["tilelang"]["status"] == "failed"
    [failure] = cells["tilelang"]["failures"]
    assert failure["test"].endswith("test_fla_kernel_matches_eager")
    lines = [f"{k['level']} {k['function']} {k['dtype']} -> {k['ran']}" for k in failure["kernels"]]
    assert "fla common.chunk_bwd_dqkwg float32 -> tilelang" in lines
    markdown = report_markdown.render_markdown(typed(built))
    assert "  - ran: fla common.chunk_bwd_dqkwg float32 -> tilelang (x1)" in markdown
    assert "| tilelang | tests | fla | common.chunk_bwd_dqkwg | float32 | tilelang |" in markdown
    html = report_html.render_html(typed(built))
    assert "ran: fla common.chunk_bwd_dqkwg float32 -&gt; tilelang" in html


def test_a_comparison_that_fell_back_says_so(reports):
    _, cells, built = reports
    [compared] = cells["tilelang"]["comparisons"]
    assert compared["outcome"] == "passed" and compared["compared"] == {}
    assert "numeric probe failed" in compared["fell_back"]["chunk_gated_delta_rule"]
    [full] = cells["triton"]["comparisons"]
    assert full["compared"] == {"chunk_gated_delta_rule": "fla:0.6.0"}
    markdown = report_markdown.render_markdown(typed(built))
    assert "fla compared on 0 of 1 ops; fell back: chunk_gated_delta_rule to eager: numeric probe failed" in markdown
    assert "fla compared on 1 of 1 ops (chunk_gated_delta_rule)" in markdown


def test_the_diff_names_the_sub_functions_change(reports, capsys):
    root, _, _ = reports
    assert diff.main([str(root / "old.json"), str(root / "new.json")]) == 1
    out = capsys.readouterr().out
    assert "| cpu | tests | fla | common.chunk_bwd_dqkwg | float32 | triton | tilelang |" in out
    assert "kernel changed: cpu (tests): fla common.chunk_bwd_dqkwg float32: triton → tilelang, with" in out
    assert "no longer compares chunk_gated_delta_rule (chunk_gated_delta_rule: eager: numeric probe failed" in out
