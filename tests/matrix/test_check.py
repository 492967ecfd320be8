"""`gdn-matrix check`: a manifest made in process (the probe's, with its versions, device and resolution
set to a stack where a test needs one) matched against the checked-in reports: the three CPU reports of
tests/data/history/ (kept in a history) and the two H200 reports of tests/data/report_golden/. Covered,
not covered with the nearest cell, and an upgrade (--to) that is safe or that regresses."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from gdn.matrix import check, cli, diff
from gdn.matrix.history_store import add_report
from gdn.matrix.schema import ReportCell
from gdn.matrix.versions import VERSION_PATHS, versions
from repo_paths import ROOT, TESTS

pytestmark = pytest.mark.tooling

HISTORY_DATA = TESTS / "data" / "history"
GOLDEN = TESTS / "data" / "report_golden"
TRITONS = ("3.2.0", "3.6.0", "3.9.0")
TRITON36 = GOLDEN / "h200-cuda-triton36-2026-12-01"
FLASHQLA = GOLDEN / "h200-cuda-flashqla-2026-12-02"


@pytest.fixture(scope="module")
def environment() -> dict[str, Any]:
    """This environment's manifest, as `gdn-matrix check` probes it."""
    return check.collect_environment()


def _set(manifest: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    section = manifest
    for key in path[:-1]:
        if not isinstance(section.get(key), dict):
            section[key] = {}
        section = section[key]
    section[path[-1]] = value


def stack_manifest(manifest: dict[str, Any], cell: ReportCell, *, resolution: bool = False) -> dict[str, Any]:
    """The manifest with the cell's versions and device (and with `resolution`, the cell's resolution
    as its own): an environment that has the cell's stack, whatever this machine has."""
    made = copy.deepcopy(manifest)
    for key, path in {**VERSION_PATHS, "triton": ("triton", "import", "version")}.items():
        if key in cell.versions:
            _set(made, path, cell.versions[key])
    for kind in ("cuda", "npu"):
        _set(made, ("devices", kind), {"count": int(cell.device == kind), "devices": []})
    if resolution:
        made["resolution"] = [
            {"op": op, "device": device, "backend": entry.backend, "route": entry.route, "error": entry.error}
            for op, per_device in cell.resolution.items()
            for device, entry in per_device.items()
        ]
    assert {key: versions(made)[key] for key in cell.versions} == cell.versions
    return made


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    """The three CPU reports kept in a history (their cells' files from their results roots)."""
    directory = tmp_path_factory.mktemp("history")
    for version in TRITONS:
        add_report(HISTORY_DATA / f"triton-{version}" / "report", directory)
    return directory


def _cpu_cell(version: str) -> ReportCell:
    return diff.load_report(HISTORY_DATA / f"triton-{version}" / "report" / "report.json").cells[0]


def test_a_stack_the_history_ran_is_covered_by_its_cell_with_the_report_it_comes_from(environment, history):
    cell = _cpu_cell("3.6.0")
    sources, last_good = check.history_sources(history)
    answer = check.check(stack_manifest(environment, cell, resolution=True), sources, last_good=last_good)
    (covered,) = answer.here.covered
    assert covered is not None and covered.cell == "local" and covered.versions["triton"] == "3.6.0"
    kept = next(s for s in sources if s.report.cells[0].versions["triton"] == "3.6.0")
    assert (covered.report, covered.generated_at) == (kept.name, kept.report.generated_at)
    assert covered.status == "passed" and covered.families["probe"].passed == 155
    assert [r.op for r in covered.resolution] == kept.report.ops
    assert all(r.same for r in covered.resolution)
    assert covered.accuracy and not covered.speed  # the CPU runs measured accuracy, no benchmark
    # the history's last known good of the cell: the newest report (by generated time) where it passed
    newest = max(sources, key=lambda s: s.report.generated_at)
    assert covered.last_good is not None and covered.last_good.entry == newest.name
    assert (answer.verdict, answer.exit_code) == ("covered: this stack's cell passed", check.EXIT_SAFE)


def test_a_resolution_that_differs_from_the_cells_is_named_per_op(environment, history):
    cell = _cpu_cell("3.9.0")
    manifest = stack_manifest(environment, cell, resolution=True)
    moved = next(r for r in manifest["resolution"] if r["op"] == "l2norm" and r["device"] == "cpu")
    moved.update(backend="eager", route="eager")
    answer = check.check(manifest, check.history_sources(history)[0])
    rows = {r.op: r for r in answer.here.covered[0].resolution}
    assert not rows["l2norm"].same and rows["l2norm"].compared == "eager"
    assert rows["l2norm"].cell == "triton:bundled(interpreter)"
    assert all(r.same for op, r in rows.items() if op != "l2norm")
    assert "l2norm on cpu: triton:bundled(interpreter): changed (this environment: eager)" in check.render_text(answer)


def test_this_machines_own_manifest_is_matched_on_every_version_the_report_records(environment, history):
    """Whatever this machine has: covered means no recorded version differs; otherwise the nearest
    cell's differences are exactly the versions where this stack and that cell part."""
    sources, _ = check.history_sources(history)
    answer = check.check(environment, sources)
    stack = versions(environment)
    if answer.here.covered:
        for covered in answer.here.covered:
            assert all(check.same_version(k, stack[k], v) for k, v in covered.versions.items())
        return
    assert answer.exit_code == check.EXIT_NOT_COVERED
    near = answer.here.nearest
    cell = next(c for s in sources if s.name == near.report for c in s.report.cells if c.name == near.cell)
    assert near.differences == check.differences(stack, check.environment_device(environment), cell) != []


def test_a_stack_no_cell_covers_gets_the_nearest_cell_and_what_differs(environment):
    """The CPU stack of the history against the H200 reports: no cell is a CPU one; the nearest is the
    cell with the fewest differences, and each difference is named."""
    cpu = _cpu_cell("3.9.0")
    sources = [check.read_report(str(TRITON36)), check.read_report(str(FLASHQLA))]
    answer = check.check(stack_manifest(environment, cpu), sources)
    assert answer.here.covered == [] and answer.exit_code == check.EXIT_NOT_COVERED
    near = answer.here.nearest
    assert (near.cell, near.report) == ("cuda-triton36", str(TRITON36))
    differing = {d.key: (d.stack, d.cell) for d in near.differences}
    assert differing["device"] == ("cpu", "cuda")
    assert differing["torch"] == ("2.13.0+cpu", "2.11.0+cu130") and differing["fla"] == (None, "0.6.0")
    assert "python" in differing and "flash_qla" not in differing  # neither stack has flash-qla
    text = check.render_text(answer)
    assert "no cell covers this stack" in text and "fla: not installed here, 0.6.0 in the cell" in text


def test_an_upgrade_whose_cell_fails_exits_1_with_the_regressions_and_both_cells_sources(environment, tmp_path):
    """On the cuda-triton36 stack (kept in the history), --to flash-qla==0.1.3 --to tilelang==0.1.15 is
    the cuda-flashqla cell of the latest report, which failed two GRPO tests."""
    add_report(TRITON36, tmp_path / "history", results_root=tmp_path)
    sources, last_good = check.history_sources(tmp_path / "history")
    latest = check.read_report(str(FLASHQLA / "report.json"))
    here_cell = sources[0].report.cells[0]
    manifest = stack_manifest(environment, here_cell, resolution=True)
    targets = check.parse_targets(["flash-qla==0.1.3", "tilelang==0.1.15"])
    answer = check.check(manifest, [latest, *sources], targets=targets, last_good=last_good)
    (here,) = answer.here.covered
    assert here.cell == "cuda-triton36" and here.report == sources[0].name and here.last_good.entry == sources[0].name
    (target,) = answer.target.covered
    assert (target.cell, target.report, target.status) == ("cuda-flashqla", str(FLASHQLA / "report.json"), "failed")
    assert target.last_good is None  # never kept in the history
    assert len(target.failures) == 2 and target.speed
    expected = diff.diff_reports(sources[0].report, latest.report, pairs=[("cuda-triton36", "cuda-flashqla")])
    assert answer.regressions == expected.regressions and any("newly failed" in r for r in answer.regressions)
    assert answer.exit_code == check.EXIT_REGRESSES
    assert "regression: cuda-triton36 → cuda-flashqla:" in check.render_text(answer)


def test_an_upgrade_the_history_ran_and_passed_is_safe(environment, history):
    sources, last_good = check.history_sources(history)
    manifest = stack_manifest(environment, _cpu_cell("3.9.0"), resolution=True)
    answer = check.check(manifest, sources, targets={"triton": "3.6.0"}, last_good=last_good)
    (here,), (target,) = answer.here.covered, answer.target.covered
    assert here.versions["triton"] == "3.9.0"
    assert target.versions["triton"] == "3.6.0" and target.status == "passed"
    assert all(r.same for r in target.resolution)  # against the 3.9.0 cell's resolution
    assert answer.regressions == [] and answer.exit_code == check.EXIT_SAFE


def test_an_upgrade_no_cell_ran_exits_3_with_the_nearest(environment, history):
    sources, _ = check.history_sources(history)
    manifest = stack_manifest(environment, _cpu_cell("3.9.0"))
    answer = check.check(manifest, sources, targets={"triton": "3.7.1"})
    assert answer.here.covered and answer.target.covered == []
    # every kept cell differs from it in its Triton alone: the newest report's is the nearest
    newest = max(sources, key=lambda s: s.report.generated_at)
    assert answer.target.nearest.report == newest.name
    assert answer.target.nearest.differences == [check.Difference("triton", "3.7.1", "3.6.0")]
    assert answer.exit_code == check.EXIT_NOT_COVERED


def test_matrix_yaml_cells_that_pin_the_stack_are_named(environment):
    cell = diff.load_report(TRITON36 / "report.json").cells[0]
    answer = check.check(
        stack_manifest(environment, cell), [check.read_report(str(FLASHQLA))], matrix=ROOT / "matrix.yaml"
    )
    assert answer.here.pinned_by == ["cuda-triton36"]


@pytest.mark.parametrize(
    ("key", "stack", "cell", "same"),
    [
        ("python", "3.12.7", "3.12.3", True),  # a series: any 3.12
        ("python", "3.11.7", "3.12.3", False),
        ("torch", "2.11.0+cu130", "2.11.0+cu130", True),
        ("torch", "2.11.0+cpu", "2.11.0+cu130", False),  # another build
        ("triton", "3.6.0", "3.6", True),
        ("triton", "3.6.0.post1", "3.6.0", False),
        ("fla", None, "0.6.0", False),
        ("fla", None, None, True),
        ("fla_npu_generation", "stable", "stable", True),
    ],
)
def test_versions_match_as_releases_and_python_as_a_series(key, stack, cell, same):
    assert check.same_version(key, stack, cell) is same


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["triton>=3.6"], "one exact version"),
        (["triton==3.*"], "one exact version"),
        (["triton"], "one exact version"),
        (["numpy==2.0"], "records no package 'numpy'"),
        (["--index-url=https://example.org"], "expected PKG==VERSION"),
        (["triton[extra]==3.6.0"], "PKG==VERSION alone"),
        (["triton==3.6.0; python_version<'3'"], "PKG==VERSION alone"),
    ],
)
def test_a_to_that_is_not_one_exact_version_of_a_recorded_package_is_refused(values, message):
    with pytest.raises(check.CheckError, match=message.replace("[", r"\[")):
        check.parse_targets(values)


def test_to_names_take_the_distributions_spelling():
    assert check.parse_targets(["flash-qla==0.1.3", "Triton==3.6.0", "torch==2.11.0+cu130"]) == {
        "flash_qla": "0.1.3",
        "triton": "3.6.0",
        "torch": "2.11.0+cu130",
    }


def test_the_command_prints_json_and_exits_with_the_answers_status(environment, history, monkeypatch, capsys):
    manifest = stack_manifest(environment, _cpu_cell("3.9.0"), resolution=True)
    monkeypatch.setattr(check, "collect_environment", lambda: manifest)
    assert cli.main(["check", "--history", str(history), "--to", "triton==3.2.0", "--json"]) == check.EXIT_SAFE
    printed = json.loads(capsys.readouterr().out)
    assert printed["target"]["covered"][0]["versions"]["triton"] == "3.2.0"
    assert printed["here"]["covered"][0]["report"] and printed["exit_code"] == 0
    assert cli.main(["check", "--report", str(TRITON36), "--to", "triton==3.2.0"]) == check.EXIT_NOT_COVERED
    assert "verdict: no cell covers the target stack" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "triton>=3"], "--to: expected one exact version"),
        (["--history", "no-such-dir"], "--history: no history directory"),
        (["--report", "no-such.json"], "cannot read report no-such.json"),
        (["--report", "http://example.org/report.json"], "expected a file or an https URL"),
        ([], "no report to check against"),
    ],
)
def test_unusable_input_exits_2_before_probing(argv, message, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(check, "collect_environment", lambda: pytest.fail("probed before the input was read"))
    assert cli.main(["check", *argv]) == check.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_a_report_that_does_not_validate_exits_2(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"schema": 1, "generated_at": "x", "ops": [], "cells": 3}))
    assert cli.main(["check", "--report", str(tmp_path)]) == check.EXIT_BAD_INPUT
    assert "cells" in capsys.readouterr().err


def test_a_cell_that_recorded_no_versions_covers_no_stack(environment, tmp_path):
    """A cell that never got to its probe (here the H200 cell with its versions gone, as a not-run cell
    has them) is no evidence for any stack, so it neither covers one nor is the nearest."""
    data = json.loads((TRITON36 / "report.json").read_text())
    cell = diff.load_report(TRITON36 / "report.json").cells[0]
    data["cells"][0].update(status="not_run", versions={key: None for key in data["cells"][0]["versions"]})
    (tmp_path / "report.json").write_text(json.dumps(data))
    answer = check.check(stack_manifest(environment, cell), [check.read_report(str(tmp_path))])
    assert answer.here.covered == [] and answer.here.nearest is None
    assert answer.exit_code == check.EXIT_NOT_COVERED


def test_a_report_given_as_an_https_url_is_read_within_the_report_cap(environment, monkeypatch):
    requested = []

    def urlopen(url, timeout):
        requested.append((url, timeout))
        return io.BytesIO((TRITON36 / "report.json").read_bytes())

    monkeypatch.setattr(check.urllib.request, "urlopen", urlopen)
    source = check.read_report("https://example.org/matrix/report.json")
    assert requested == [("https://example.org/matrix/report.json", 60)]
    assert source.name == "https://example.org/matrix/report.json" and source.report.cells[0].name == "cuda-triton36"


def test_every_cell_of_the_report_that_covers_the_stack_is_answered(environment, tmp_path):
    """Two cells of one stack (another runtime, say): both are answered, and one that failed fails it."""
    data = json.loads((HISTORY_DATA / "triton-3.9.0" / "report" / "report.json").read_text())
    twin = copy.deepcopy(data["cells"][0])
    twin.update(name="cpu-twin", status="failed", reason="1 test failed")
    data["cells"].append(twin)
    (tmp_path / "report.json").write_text(json.dumps(data))
    answer = check.check(stack_manifest(environment, _cpu_cell("3.9.0")), [check.read_report(str(tmp_path))])
    assert [(c.cell, c.status) for c in answer.here.covered] == [("local", "passed"), ("cpu-twin", "failed")]
    assert (answer.verdict, answer.exit_code) == ("this stack's cell did not pass: cpu-twin failed", 1)


def test_an_environment_whose_resolution_failed_is_never_said_to_resolve_the_same(environment, history):
    manifest = stack_manifest(environment, _cpu_cell("3.9.0"))
    manifest["resolution"] = {"error": "RuntimeError: no backend could be listed"}
    (covered,) = check.check(manifest, check.history_sources(history)[0]).here.covered
    assert [(r.compared, r.same) for r in covered.resolution] == [("—", False)] * len(covered.resolution)
