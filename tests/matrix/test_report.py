"""The matrix report: fake results/<cell>/ directories of every outcome (passed, failed on stand-in
hardware, not run, malformed junit, build failure, timeout, a cell the matrix no longer names) merged
into report.json, report.md and report.html, and the HTML rendered in headless Chromium."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from browser import chromium, headless
from gdn.matrix import report as report_mod
from gdn.matrix import report_build, report_html, report_markdown, report_parts, versions
from gdn.matrix.config import parse_matrix
from gdn.matrix.jsonio import write_json
from gdn.matrix.schema import CellOutcome, PinDifference
from gdn.op_names import OP_NAMES
from report_models import typed, typed_cell, typed_entry

pytestmark = pytest.mark.tooling

MATRIX = {
    "schema": 1,
    "cells": [
        {
            "name": "cpu-ok",
            "device": "cpu",
            "runtime": "host",
            "expect": [{"op": "chunk_gated_delta_rule", "backend": "eager"}],
        },
        {
            "name": "npu-fail",
            "device": "npu",
            "runtime": "docker",
            "dockerfile": "docker/npu.Dockerfile",
            "base_image": "cann:9.1.0",
            "expect": [{"op": "chunk_gated_delta_rule", "backend": "ascendc"}],
        },
        {
            "name": "npu-absent",
            "device": "npu",
            "runtime": "docker",
            "dockerfile": "docker/npu.Dockerfile",
            "base_image": "cann:8.5.0",
            "expect": [{"op": "chunk_gated_delta_rule", "backend": "ascendc", "route": "ascendc:legacy-torch-ops"}],
        },
        {"name": "cpu-badjunit", "device": "cpu", "runtime": "host"},
        {
            "name": "cuda-build",
            "device": "cuda",
            "runtime": "docker",
            "dockerfile": "docker/cuda.Dockerfile",
            "base_image": "nvidia/cuda:13.0.1",
        },
        {"name": "cpu-timeout", "device": "cpu", "runtime": "host"},
    ],
}

CPU_MANIFEST: dict[str, Any] = {
    "schema": 1,
    "python": {"version": "3.11.2", "implementation": "CPython"},
    "torch": {"version": "2.13.0+cpu", "cuda": None},
    "triton": {
        "flavour": "triton",
        "distributions": {"triton": "3.9.0"},
        "import": {"ok": True, "version": "3.9.0"},
    },
    "torch_npu": {"distribution": None, "import": {"ok": False, "error": "ModuleNotFoundError: torch_npu"}},
    "cann": {"present": False, "toolkit": {"present": False, "reason": "not found"}, "driver": {"present": False}},
    "fla_npu": {"distribution": None, "import": {"ok": False, "error": "ModuleNotFoundError: fla_npu"}},
    "fla": {"error": "RuntimeError: broken"},
    "transformers": {"distribution": {"name": "transformers", "version": "5.24.0"}},
}

NPU_MANIFEST: dict[str, Any] = {
    "schema": 1,
    "python": {"version": "3.12.3"},
    "torch": {"version": "2.9.0"},
    # triton-ascend installed but not importable without a driver: the distribution gives the version
    "triton": {
        "flavour": "triton-ascend",
        "distributions": {"triton-ascend": "3.2.1"},
        "import": {"ok": False, "error": "ImportError: libascendcl.so"},
    },
    "torch_npu": {"distribution": {"name": "torch_npu", "version": "2.9.0.post3"}, "import": {"ok": True}},
    "cann": {
        "present": True,
        "toolkit": {"present": True, "version": "9.1.0"},
        "driver": {"present": True, "version": "25.2.0"},
    },
    "fla_npu": {
        "distribution": {"name": "flash-linear-attention-npu", "version": "26.10.0"},
        "import": {"ok": True},
        "api": {"generation": "26.10-stable"},
    },
    "fla": {"distribution": None},
    "transformers": {"distribution": {"name": "transformers", "version": "5.24.0"}},
}

ASCENDC_REJECTED = "probe: output is all zeros (relative error 1.0 > 0.001)"


def _record(
    op: str, device: str, route: str, rejected: list[tuple[str, str]] = (), not_candidates: list[dict[str, str]] = ()
) -> dict[str, Any]:
    record = {
        "op": op,
        "device": device,
        "requested_mode": "auto",
        "backend": route.split(":")[0],
        "route": route,
        "strict": False,
        "probe": None,
        "rejected": [{"backend": b, "route": None, "reason": r, "probe": None} for b, r in rejected],
    }
    # records written before the resolver named the backends it never tried have no such key
    return {**record, "not_candidates": list(not_candidates)} if not_candidates else record


# what gdn.resolve records on cpu in auto mode
CPU_NOT_CANDIDATES = [
    {"backend": "ascendc", "reason": "auto tries it on npu only; GDN_COMPUTE_MODE=ascendc selects it"},
    {"backend": "triton", "reason": "auto tries it on cuda, npu only; GDN_COMPUTE_MODE=triton selects it"},
    {"backend": "fla", "reason": "serves cuda, npu, not cpu"},
    {"backend": "flashqla", "reason": "serves cuda, not cpu"},
]
CPU_RESOLUTION = [_record(op, "cpu", "eager", not_candidates=CPU_NOT_CANDIDATES) for op in OP_NAMES]
NPU_RESOLUTION = [
    *CPU_RESOLUTION,
    _record("chunk_gated_delta_rule", "npu", "eager", [("ascendc", ASCENDC_REJECTED)]),
    _record("l2norm", "npu", "triton:bundled"),
    {"op": "fused_gdn_gating", "device": "npu", "error": "GdnBackendError: strict mode"},
]

BENCH = {
    "rows": [
        {"op": "chunk_gated_delta_rule", "impl": "eager", "shape": [1, 4096, 16, 128], "ms": 12.5},
        {"op": "l2norm", "impl": "eager", "shape": "T=4096", "ms": 0.75},
        {"op": "l2norm", "impl": "eager", "shape": "T=8", "ms": "n/a"},
    ]
}


def _case(name: str, family: str, body: str = "") -> str:
    return (
        f'<testcase classname="tests.test_ops" name="{name}" time="0.010">'
        f'<properties><property name="family" value="{family}"/></properties>{body}</testcase>'
    )


def _junit(*cases: str) -> str:
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" errors="0" failures="0" skipped="0" tests="0" time="1.0" hostname="h">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )


FAILING_JUNIT = _junit(
    _case("test_probe_runs", "probe"),
    _case("test_chunk[fp32]", "single_op", '<failure message="AssertionError: rel err 0.9">trace</failure>'),
    _case("test_grid[T=1]", "shape_grid"),
    _case("test_grid[T=64]", "shape_grid", '<error message="RuntimeError: ACL error 507015">trace</error>'),
)

LOG_TAIL = "Step 4/9 : RUN pip install torch\nERROR: No matching distribution for torch==2.11.0\n<b>not bold</b>"


def _write_cell(root: Path, outcome: CellOutcome, files: dict[str, Any]) -> None:
    directory = root / outcome.cell
    outcome.write(directory)
    for name, content in files.items():
        if isinstance(content, str):
            (directory / name).write_text(content)
        else:
            write_json(directory / name, content)


# The passing cell's junit.xml is written by pytest itself, family properties included the way
# tests/conftest.py records them, so the report is checked against what pytest really emits.
PASSING_TESTS = """
import pytest


def test_probe_runs(record_property):
    record_property("family", "probe")


@pytest.mark.parametrize("dtype", ["fp32"])
def test_chunk(record_property, dtype):
    record_property("family", "single_op")


def test_l2norm(record_property):
    record_property("family", "single_op")


def test_npu_only(record_property):
    record_property("family", "single_op")
    pytest.skip("no npu")
"""


@pytest.fixture(scope="module")
def passing_junit(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("pytest-run")
    (directory / "test_ops.py").write_text(PASSING_TESTS)
    junit = directory / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    result = subprocess.run(
        [*command, f"--junitxml={junit}", "test_ops.py"], cwd=directory, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return junit.read_text()


@pytest.fixture
def results_root(tmp_path: Path, passing_junit: str) -> Path:
    root = tmp_path / "results"
    _write_cell(
        root,
        CellOutcome(cell="cpu-ok", status="passed", device="cpu", runtime="host", duration_s=42.0, exit_code=0),
        {
            "manifest.json": CPU_MANIFEST,
            "resolution.json": CPU_RESOLUTION,
            "junit.xml": passing_junit,
            "bench.json": BENCH,
        },
    )
    _write_cell(
        root,
        CellOutcome(
            cell="npu-fail",
            status="failed",
            device="npu",
            runtime="docker",
            reason="pytest exited 1",
            image="gdn-matrix/npu-fail:0123abcd",
            image_built=False,
            exit_code=1,
            stand_ins=["torch_npu stub"],
        ),
        {"manifest.json": NPU_MANIFEST, "resolution.json": NPU_RESOLUTION, "junit.xml": FAILING_JUNIT},
    )
    _write_cell(
        root,
        CellOutcome(cell="cpu-badjunit", status="passed", device="cpu", runtime="host", exit_code=0),
        {"manifest.json": CPU_MANIFEST, "resolution.json": CPU_RESOLUTION, "junit.xml": "<testsuites><testsuite"},
    )
    _write_cell(
        root,
        CellOutcome(
            cell="cuda-build",
            status="build_failed",
            device="cuda",
            runtime="docker",
            reason="docker build exited 1",
            image="gdn-matrix/cuda-build:feedbeef",
            image_built=False,
            log_tail=LOG_TAIL,
        ),
        {},
    )
    _write_cell(
        root,
        CellOutcome(
            cell="cpu-timeout",
            status="timeout",
            device="cpu",
            runtime="host",
            reason="timed out after 60 s",
            duration_s=60.0,
            exit_code=-9,
            log_tail="collected 40 items\ntests/test_grpo.py ....",
        ),
        {"manifest.json": CPU_MANIFEST},
    )
    _write_cell(
        root,
        # a CUDA cell run where no GPU was visible: it resolved ops on cpu only
        CellOutcome(cell="orphan", status="passed", device="cuda", runtime="host", exit_code=0),
        {"resolution.json": CPU_RESOLUTION, "junit.xml": _junit(_case("test_probe_runs", "probe"))},
    )
    return root


@pytest.fixture
def report(results_root: Path) -> dict[str, Any]:
    return report_build.build_report(results_root, parse_matrix(MATRIX)).to_json()


def _cell(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["cells"] if c["name"] == name)


NO_VERSIONS = dict.fromkeys(versions.VERSION_KEYS)
CPU_VERSIONS = {
    **NO_VERSIONS,
    "python": "3.11.2",
    "torch": "2.13.0+cpu",
    "triton": "3.9.0",
    "triton_flavour": "triton",
    "transformers": "5.24.0",
}
CPU_RESOLUTION_MAP = {
    op: {"cpu": {"backend": "eager", "route": "eager", "rejected": [], "not_candidates": CPU_NOT_CANDIDATES}}
    for op in OP_NAMES
}


def test_report_header_and_cell_order(report):
    assert report["schema"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", report["generated_at"])
    assert report["ops"] == list(OP_NAMES)
    # the matrix's order, then cells the matrix does not name
    assert [c["name"] for c in report["cells"]] == [
        "cpu-ok",
        "npu-fail",
        "npu-absent",
        "cpu-badjunit",
        "cuda-build",
        "cpu-timeout",
        "orphan",
    ]


def test_passed_cell(report):
    assert _cell(report, "cpu-ok") == {
        "name": "cpu-ok",
        "status": "passed",
        "reason": None,
        "verdict": "PASSED",
        "device": "cpu",
        "runtime": "host",
        "matrix_runtime": "host",
        "real_hardware": False,
        "cards": [],
        "stand_ins": [],
        "duration_s": 42.0,
        "image": None,
        "image_built": None,
        "exit_code": 0,
        "log_tail": None,
        "lock": None,
        "versions": CPU_VERSIONS,
        "pin_differences": None,
        "resolution": CPU_RESOLUTION_MAP,
        "families": {
            "probe": {"passed": 1, "failed": 0, "error": 0, "skipped": 0, "total": 1},
            "single_op": {"passed": 2, "failed": 0, "error": 0, "skipped": 1, "total": 3},
        },
        "failures": [],
        "bench": BENCH["rows"],
        "peer_kernels": {"fla": None},
        "kernels": {},
        "comparisons": [],
        "accuracy": None,
        "expectations": [
            {
                "op": "chunk_gated_delta_rule",
                "backend": "eager",
                "route": None,
                "actual_backend": "eager",
                "actual_route": "eager",
                "ok": True,
            }
        ],
        "problems": [],
        "interrupted": None,
    }


def test_failed_cell_on_stand_ins(report):
    cell = _cell(report, "npu-fail")
    assert (cell["status"], cell["reason"], cell["device"], cell["real_hardware"], cell["stand_ins"]) == (
        "failed",
        "pytest exited 1",
        "npu",
        False,
        ["torch_npu stub"],
    )
    assert (cell["image"], cell["image_built"], cell["exit_code"]) == ("gdn-matrix/npu-fail:0123abcd", False, 1)
    assert cell["versions"] == {
        "python": "3.12.3",
        "torch": "2.9.0",
        "cuda": None,
        "triton": "3.2.1",
        "triton_flavour": "triton-ascend",
        "torch_npu": "2.9.0.post3",
        "cann": "9.1.0",
        "driver": "25.2.0",
        "fla_npu": "26.10.0",
        "fla_npu_generation": "26.10-stable",
        "fla": None,
        "flash_qla": None,
        "tilelang": None,
        "transformers": "5.24.0",
    }
    assert cell["resolution"]["chunk_gated_delta_rule"] == {
        "cpu": {"backend": "eager", "route": "eager", "rejected": [], "not_candidates": CPU_NOT_CANDIDATES},
        "npu": {
            "backend": "eager",
            "route": "eager",
            "rejected": [{"backend": "ascendc", "reason": ASCENDC_REJECTED}],
            "not_candidates": [],
        },
    }
    assert cell["resolution"]["l2norm"]["npu"] == {
        "backend": "triton",
        "route": "triton:bundled",
        "rejected": [],
        "not_candidates": [],
    }
    assert cell["resolution"]["fused_gdn_gating"]["npu"] == {
        "backend": None,
        "route": None,
        "error": "GdnBackendError: strict mode",
    }
    assert list(cell["resolution"]) == list(OP_NAMES)
    assert cell["families"] == {
        "probe": {"passed": 1, "failed": 0, "error": 0, "skipped": 0, "total": 1},
        "single_op": {"passed": 0, "failed": 1, "error": 0, "skipped": 0, "total": 1},
        "shape_grid": {"passed": 1, "failed": 0, "error": 1, "skipped": 0, "total": 2},
    }
    assert cell["failures"] == [
        {
            "test": "tests.test_ops::test_chunk[fp32]",
            "family": "single_op",
            "outcome": "failed",
            "message": "AssertionError: rel err 0.9",
            # no reruns.json: its reruns were never recorded, so nothing shows it is not real
            "seed": None,
            "label": "not_rerun",
            "label_reason": "no reruns.json",
            "reruns": [],
            "kernels": [],
        },
        {
            "test": "tests.test_ops::test_grid[T=64]",
            "family": "shape_grid",
            "outcome": "error",
            "message": "RuntimeError: ACL error 507015",
            # no reruns.json: its reruns were never recorded, so nothing shows it is not real
            "seed": None,
            "label": "not_rerun",
            "label_reason": "no reruns.json",
            "reruns": [],
            "kernels": [],
        },
    ]
    # judged on the npu, where ascendc was rejected by its probe
    assert cell["expectations"] == [
        {
            "op": "chunk_gated_delta_rule",
            "backend": "ascendc",
            "route": None,
            "actual_backend": "eager",
            "actual_route": "eager",
            "ok": False,
        }
    ]
    assert (cell["bench"], cell["problems"]) == (None, [])


def test_not_run_cell(report):
    # never tried: what it needs comes from the device table; what it would have shown is not known
    assert _cell(report, "npu-absent") == {
        "name": "npu-absent",
        "status": "not_run",
        "reason": "no results: never run; needs an Ascend NPU runner (/dev/davinci_manager) and a docker engine",
        "verdict": "MISSING",
        "device": "npu",
        "runtime": "docker",
        "matrix_runtime": "docker",
        "real_hardware": None,
        "cards": [],
        "stand_ins": [],
        "duration_s": None,
        "image": None,
        "image_built": None,
        "exit_code": None,
        "log_tail": None,
        "lock": None,
        "versions": NO_VERSIONS,
        "pin_differences": None,
        "resolution": {},
        "families": {},
        "failures": [],
        "bench": None,
        "peer_kernels": {"fla": None},
        "kernels": {},
        "comparisons": [],
        "accuracy": None,
        "expectations": [
            {
                "op": "chunk_gated_delta_rule",
                "backend": "ascendc",
                "route": "ascendc:legacy-torch-ops",
                "actual_backend": None,
                "actual_route": None,
                "ok": None,
            }
        ],
        "problems": [],
        "interrupted": None,
    }


def test_malformed_junit_is_named_and_the_rest_of_the_cell_survives(report):
    cell = _cell(report, "cpu-badjunit")
    assert cell["status"] == "error"
    assert len(cell["problems"]) == 1
    assert cell["problems"][0].startswith("junit.xml is not valid JUnit XML")
    assert cell["reason"] == f"cell.json says passed but {cell['problems'][0]}"
    assert (cell["families"], cell["failures"]) == ({}, [])
    assert (cell["versions"], cell["resolution"]) == (CPU_VERSIONS, CPU_RESOLUTION_MAP)


def test_build_failed_and_timeout_cells(report):
    build = _cell(report, "cuda-build")
    assert (build["status"], build["reason"], build["log_tail"]) == ("build_failed", "docker build exited 1", LOG_TAIL)
    assert (build["image"], build["versions"], build["resolution"], build["families"]) == (
        "gdn-matrix/cuda-build:feedbeef",
        NO_VERSIONS,
        {},
        {},
    )
    timeout = _cell(report, "cpu-timeout")
    assert (timeout["status"], timeout["reason"], timeout["exit_code"], timeout["duration_s"]) == (
        "timeout",
        "timed out after 60 s",
        -9,
        60.0,
    )
    assert timeout["versions"] == CPU_VERSIONS
    assert timeout["problems"] == []


def test_cell_outside_the_matrix_is_kept(report):
    orphan = _cell(report, "orphan")
    assert (orphan["status"], orphan["device"], orphan["expectations"]) == ("passed", "cuda", [])
    assert orphan["resolution"] == CPU_RESOLUTION_MAP


def test_report_without_a_matrix_lists_what_ran(results_root):
    # a report kept under the results root, as nox keeps results/report/, is not read as a cell
    report_mod.write_report(report_build.build_report(results_root), results_root / "report")
    report = report_build.build_report(results_root).to_json()
    assert [c["name"] for c in report["cells"]] == sorted(
        ["cpu-ok", "npu-fail", "cpu-badjunit", "cuda-build", "cpu-timeout", "orphan"]
    )


def test_unreadable_files_and_bad_records_become_problems(tmp_path):
    root = tmp_path / "results"
    _write_cell(
        root,
        CellOutcome(cell="odd", status="passed", device="cpu", runtime="host"),
        {"resolution.json": [{"device": "cpu"}, *CPU_RESOLUTION], "bench.json": {"timings": []}},
    )
    (root / "nocell").mkdir()
    (root / "nocell" / "manifest.json").write_text("{not json")
    report = report_build.build_report(root).to_json()
    odd, nocell = report["cells"][1], report["cells"][0]
    assert odd["problems"] == ["resolution.json: [0].op: Field required", "bench.json: rows: Field required"]
    assert (odd["status"], odd["reason"]) == ("error", "invalid results: resolution.json: [0].op: Field required")
    assert odd["resolution"] == {}
    assert (nocell["status"], nocell["reason"]) == ("error", "cell.json is missing: the cell never recorded an outcome")
    assert nocell["problems"][0] == nocell["reason"]
    assert nocell["problems"][1].startswith("manifest.json is not JSON: ")
    assert '<section class="cell s-error" id="cell-nocell"' in report_html.render_html(typed(report))


def test_route_text_marks_fallbacks():
    entry = {"backend": "eager", "route": "eager", "rejected": [{"backend": "triton", "reason": "x"}]}
    assert report_parts.route_text(typed_entry(entry)) == "eager (triton rejected)"
    assert report_parts.route_text(typed_entry({"backend": None, "route": None, "error": "boom"})) == "error"
    assert report_parts.route_text(None) == "—"


def _md_section(markdown: str, heading: str) -> str:
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _md_row(section: str, first: str) -> str:
    return next(line for line in section.splitlines() if line.startswith(f"| {first} |"))


def test_markdown(report):
    md = report_markdown.render_markdown(typed(report))
    assert md.startswith(f"# gdn-matrix report\n\nGenerated {report['generated_at']}.")
    cells = _md_section(md, "Cells")
    assert "| cell | status | device | card | runtime | lock | duration | reason |" in cells
    assert _md_row(cells, "npu-absent") == (
        "| npu-absent | ⚪ not run | npu | — | docker | — | — | no results: never run; "
        "needs an Ascend NPU runner (/dev/davinci_manager) and a docker engine |"
    )
    assert (
        _md_row(cells, "cuda-build")
        == "| cuda-build | 🧱 build failed | cuda | — | docker | — | — | docker build exited 1 |"
    )
    timeout_row = "| cpu-timeout | ⏱️ timeout | cpu | — | host | — | 60 s | timed out after 60 s |"
    assert _md_row(cells, "cpu-timeout") == timeout_row

    routes = _md_section(md, "Resolved backends")
    assert "| cell | " + " | ".join(OP_NAMES) + " | not candidates |" in routes
    # why each backend was never tried, once per backend though every op says it
    assert _md_row(routes, "cpu-ok (cpu)") == (
        "| cpu-ok (cpu) | "
        + " | ".join(["eager"] * len(OP_NAMES))
        + " | ascendc: auto tries it on npu only; GDN_COMPUTE_MODE=ascendc selects it; triton: auto tries it on "
        "cuda, npu only; GDN_COMPUTE_MODE=triton selects it; fla: serves cuda, npu, not cpu; flashqla: serves "
        "cuda, not cpu |"
    )
    # the npu cell is shown on its npu, where ascendc was rejected and one op failed to resolve
    npu = _md_row(routes, "npu-fail (npu)")
    assert npu.startswith("| npu-fail (npu) | eager (ascendc rejected) | — | — | — | — | triton:bundled | error |")
    nothing = " | ".join(["—"] * (len(OP_NAMES) + 1))  # every op, and no backend passed over
    assert _md_row(routes, "npu-absent (npu)") == f"| npu-absent (npu) | {nothing} |"
    assert _md_row(routes, "orphan (cpu) †").startswith("| orphan (cpu) † | eager |")
    assert "† the cell's accelerator was not visible" in routes

    tests = _md_section(md, "Tests")
    assert "| cell | probe | single_op | shape_grid | grpo |" in tests
    assert _md_row(tests, "cpu-ok") == "| cpu-ok | 1/1 ✅ | 2/2 (1 skipped) ✅ | — | — |"
    assert _md_row(tests, "npu-fail") == "| npu-fail | 1/1 ✅ | 0/1 ❌ | 1/2 ❌ | — |"
    assert _md_row(tests, "npu-absent") == "| npu-absent | not run | not run | not run | not run |"

    versions = _md_section(md, "Versions")
    assert "| cell | python | torch | triton | triton_flavour | torch_npu | cann | driver | fla_npu |" in versions
    assert _md_row(versions, "npu-fail").startswith(
        "| npu-fail | 3.12.3 | 2.9.0 | 3.2.1 | triton-ascend | 2.9.0.post3 |"
    )

    assert _md_section(md, "Not run") == (
        "\n- **npu-absent**: no results: never run; "
        "needs an Ascend NPU runner (/dev/davinci_manager) and a docker engine\n"
    )
    problems = _md_section(md, "Problems")
    assert "- **cpu-badjunit**: problem: junit.xml is not valid JUnit XML" in problems
    assert (
        "- **npu-fail**: expectation not met: chunk_gated_delta_rule: expected ascendc, resolved eager (eager)"
        in problems
    )
    assert "- **npu-fail**: not run on real npu hardware; stand-ins: torch_npu stub" in problems
    assert "- **orphan**: not run on real cuda hardware" in problems
    assert "cuda-build**: not run" not in problems
    # a cell that was not run is listed under "Not run", not once more per expectation
    assert "npu-absent" not in problems
    failures = _md_section(md, "Failures")
    assert (
        "- `tests.test_ops::test_grid[T=64]` (error, not rerun: no reruns.json): RuntimeError: ACL error 507015"
        in failures
    )
    logs = _md_section(md, "Logs")
    assert "ERROR: No matching distribution for torch==2.11.0" in logs
    assert "cpu-timeout: log tail" in logs


def test_markdown_caps_failures_and_escapes_pipes(report):
    cell = _cell(report, "npu-fail")
    cell["failures"] = [
        {"test": f"t::case{i}", "family": "single_op", "outcome": "failed", "message": "a | b"} for i in range(25)
    ]
    md = report_markdown.render_markdown(typed(report))
    assert "- `t::case19` (failed): a \\| b" in md
    assert "t::case20" not in md
    assert "- … and 5 more (see report.json)" in md


def test_html_caps_failures(report):
    cell = _cell(report, "npu-fail")
    cell["failures"] = [
        {"test": f"t::case{i}", "family": "shape_grid", "outcome": "failed", "message": None} for i in range(205)
    ]
    html = report_html.render_html(typed(report))
    assert "<code>t::case199</code>" in html
    assert "t::case200" not in html
    assert "… and 5 more in report.json" in html


def test_bench_svg_skips_untimed_rows():
    svg = report_html.bench_svg(BENCH["rows"])
    assert svg.count("<rect ") == 2
    assert "chunk_gated_delta_rule · eager · 1×4096×16×128" in svg
    assert "12.5 ms" in svg
    assert report_html.bench_svg([{"op": "x", "ms": None}]) is None


def test_write_report_files(report, tmp_path):
    paths = report_mod.write_report(typed(report), tmp_path / "out")
    assert json.loads(paths["json"].read_text()) == report
    assert paths["md"].read_text() == report_markdown.render_markdown(typed(report))
    html = paths["html"].read_text()
    # self-contained: nothing is fetched from anywhere
    assert "http" not in html
    assert "<script" not in html
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html


def test_html_renders_in_headless_chromium(report, tmp_path):
    browser = chromium()
    html = report_mod.write_report(typed(report), tmp_path / "out")["html"]
    dom = headless(browser, tmp_path / "profile", "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr
    for cell in report["cells"]:
        assert f'<section class="cell s-{cell["status"]}" id="cell-{cell["name"]}"' in dom.stdout
    assert dom.stdout.count('<svg class="bench"') == 1
    assert re.search(r'<section class="cell s-passed" id="cell-cpu-ok".*?<svg class="bench"', dom.stdout, re.S)
    assert "junit.xml is not valid JUnit XML" in dom.stdout
    assert "<b>not bold</b>" not in dom.stdout
    assert '<span class="warn">(cpu: no cuda visible)</span>' in dom.stdout

    png = tmp_path / "report.png"
    shot = headless(browser, tmp_path / "profile", f"--screenshot={png}", "--window-size=1400,2400", html.as_uri())
    assert shot.returncode == 0, shot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000


def _report_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    report_mod.add_arguments(parser)
    return report_mod.run(parser.parse_args(argv))


def test_report_command(results_root, tmp_path, capsys):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(json.dumps(MATRIX))  # JSON is YAML
    out = tmp_path / "site"
    assert _report_command("--results", str(results_root), "--matrix", str(matrix), "--output", str(out)) == 0
    assert capsys.readouterr().out.split() == [str(out / f"report.{ext}") for ext in ("json", "md", "html")]
    written = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in written["cells"]][:3] == ["cpu-ok", "npu-fail", "npu-absent"]

    assert _report_command("--results", str(results_root), "--matrix", str(matrix)) == 0
    assert capsys.readouterr().out.split()[0] == str(results_root / "report" / "report.json")

    matrix.write_text("schema: 1\ncells: [{name: x}]\n")
    assert _report_command("--results", str(results_root), "--matrix", str(matrix)) == 2
    assert "cell 'x': key 'device': missing field" in capsys.readouterr().err


# ---------------------------------------------------------------- host runtime, cards, never-run needs

HONEST_MATRIX = {
    "schema": 1,
    "cells": [
        {
            "name": "cuda-36",
            "device": "cuda",
            "runtime": "docker",
            "dockerfile": "docker/cuda.Dockerfile",
            "base_image": "nvidia/cuda:13.0.1",
            "versions": {"python": "3.12", "torch": "2.13.0", "fla": "0.6.0"},
        },
        {
            "name": "cuda-broken",
            "device": "cuda",
            "runtime": "docker",
            "dockerfile": "docker/cuda.Dockerfile",
            "base_image": "nvidia/cuda:13.0.1",
            "expect": [{"op": "chunk_gated_delta_rule", "backend": "triton"}],
        },
        {"name": "cpu-image", "device": "cpu", "runtime": "docker", "dockerfile": "d", "base_image": "b"},
        {"name": "cpu-here", "device": "cpu", "runtime": "host"},
    ],
}
H200_MANIFEST = {
    **CPU_MANIFEST,
    "python": {"version": "3.12.3"},
    "torch": {"version": "2.11.0+cu130", "cuda": "13.0"},
    "devices": {
        "cpu_count": 16,
        "cuda": {"available": True, "count": 2, "devices": [{"name": "NVIDIA H200", "capability": "9.0"}] * 2},
        "npu": {"count": 0, "devices": []},
    },
}
H200_DIFFERENCES = [
    {"package": "torch", "pinned": "2.13.0", "found": "2.11.0+cu130"},
    {"package": "fla", "pinned": "0.6.0", "found": "not installed"},
]


@pytest.fixture
def honest(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "results"
    cuda_records = [_record(op, device, "eager") for op in OP_NAMES for device in ("cpu", "cuda")]
    _write_cell(
        root,
        CellOutcome(
            cell="cuda-36",
            status="passed",
            device="cuda",
            runtime="host",
            matrix_runtime="docker",
            real_hardware=True,
            exit_code=0,
            pin_differences=[PinDifference(**d) for d in H200_DIFFERENCES],
        ),
        {
            "manifest.json": H200_MANIFEST,
            "resolution.json": cuda_records,
            "junit.xml": _junit(_case("test_x", "probe")),
        },
    )
    _write_cell(
        root,
        CellOutcome(cell="cuda-broken", status="build_failed", device="cuda", runtime="docker", reason="pip failed"),
        {},
    )
    return report_build.build_report(root, parse_matrix(HONEST_MATRIX)).to_json()


def test_a_cell_run_outside_its_image_shows_runtime_card_and_pin_differences(honest):
    cell = _cell(honest, "cuda-36")
    assert (cell["runtime"], cell["matrix_runtime"], cell["real_hardware"]) == ("host", "docker", True)
    assert cell["cards"] == ["NVIDIA H200", "NVIDIA H200"]
    assert cell["pin_differences"] == H200_DIFFERENCES
    md = report_markdown.render_markdown(typed(honest))
    assert _md_row(_md_section(md, "Cells"), "cuda-36") == (
        "| cuda-36 | ✅ passed | cuda | 2 × NVIDIA H200 | host (matrix.yaml: docker) | — | — | — |"
    )
    assert _md_section(md, "Differences from the pins") == (
        "\n- **cuda-36** (runtime host (matrix.yaml: docker)): "
        "host torch 2.11.0+cu130, cell pins 2.13.0; host fla not installed, cell pins 0.6.0\n"
    )
    html = report_html.render_html(typed(honest))
    assert '<td class="warn">host (matrix.yaml: docker)</td>' in html
    assert "<td>2 × NVIDIA H200</td>" in html
    assert '<tr title="host torch 2.11.0+cu130, cell pins 2.13.0"><td>torch</td><td>2.13.0</td>' in html


def test_cells_that_did_not_run_are_not_checked_and_say_what_they_need(honest):
    broken = _cell(honest, "cuda-broken")
    assert broken["expectations"][0]["ok"] is None and broken["real_hardware"] is None
    assert broken["cards"] == [] and broken["pin_differences"] is None
    assert _cell(honest, "cpu-image")["reason"] == "no results: never run; needs a docker engine"
    assert _cell(honest, "cpu-here")["reason"] == (
        "no results: never run; needs only a Python environment with gdn installed"
    )
    md = report_markdown.render_markdown(typed(honest))
    assert "expectation not met" not in md
    assert "cuda-broken" not in _md_section(md, "Differences from the pins")
    html = report_html.render_html(typed(honest))
    section = html.split('id="cell-cuda-broken"', 1)[1].split("</section>", 1)[0]
    assert '<td class="s-not_run">not checked</td>' in section
    assert "real hardware" not in section and "not met" not in section
    ran = html.split('id="cell-cuda-36"', 1)[1].split("</section>", 1)[0]
    assert "<dt>real hardware</dt>" in ran and "<dt>card</dt><dd>2 × NVIDIA H200</dd>" in ran


def test_the_cells_table_shows_the_lock_digest_of_an_image_cell(tmp_path):
    digest = "sha256:" + "0123456789ab" + "f" * 52
    lock = {"digest": digest, "packages": {"torch": "2.13.0", "triton": "3.9.0"}}
    _write_cell(
        tmp_path,
        CellOutcome(cell="cpu-image", status="passed", device="cpu", runtime="docker", exit_code=0, lock=lock),
        {},
    )
    report = report_build.build_report(tmp_path, parse_matrix(HONEST_MATRIX)).to_json()
    assert _cell(report, "cpu-image")["lock"] == lock
    row = _md_row(_md_section(report_markdown.render_markdown(typed(report)), "Cells"), "cpu-image")
    assert "| docker | 0123456789ab |" in row
    assert f'<td title="{digest}">0123456789ab</td>' in report_html.render_html(typed(report))


def test_each_state_reads_as_one_word_and_why_a_backend_was_not_tried_is_shown(report):
    """A cell not run shows "not run" everywhere (torch_npu's MISSING stays in report.json's verdict),
    and the resolution table says why the backends that were never candidates were not tried."""
    html = report_html.render_html(typed(report))
    assert _cell(report, "npu-absent")["verdict"] == "MISSING"
    assert "MISSING" not in html and ">not_run<" not in html and ">build_failed<" not in html
    assert '<span class="badge s-not_run">not run</span>' in html
    assert "<th>not candidates</th>" in html
    assert "fla: serves cuda, npu, not cpu" in html


def test_unmarked_records_that_are_only_skips_get_no_family_column(report):
    """Modules a cell cannot import are skipped at collection, before any marker is read: those records
    are no family's tests. An unmarked test that ran is shown."""
    cell = _cell(report, "cpu-ok")
    cell["families"]["unmarked"] = {"passed": 0, "failed": 0, "error": 0, "skipped": 3, "total": 3}
    assert "unmarked" not in report_parts.report_families(typed(report))
    assert "| unmarked |" not in report_markdown.render_markdown(typed(report))
    cell["families"]["unmarked"] = {"passed": 1, "failed": 0, "error": 0, "skipped": 3, "total": 4}
    assert report_parts.report_families(typed(report))[-1] == "unmarked"


def test_a_cpu_cell_that_ran_beside_a_gpu_is_shown_and_checked_on_the_gpu():
    """The host cell on a GPU machine: its kernels ran on the GPU, where its expectations are read;
    on a machine without one it stays a cpu cell."""
    resolution = {"l2norm": {"cpu": {"backend": "eager"}, "cuda": {"backend": "triton", "route": "triton:bundled"}}}
    assert report_build.primary_device("cpu", resolution) == "cuda"
    assert report_build.primary_device("cpu", {"l2norm": {"cpu": {"backend": "triton"}}}) == "cpu"
    cell = parse_matrix(
        {
            "schema": 1,
            "cells": [
                {
                    "name": "local",
                    "device": "cpu",
                    "runtime": "host",
                    "compute_mode": "triton",
                    "expect": [{"op": "l2norm", "backend": "triton"}],
                }
            ],
        }
    ).cells[0]
    entry = typed_cell({"name": "local", "device": "cpu", "status": "passed", "resolution": resolution})
    assert report_build.expectations(cell, entry)[0].ok is True
