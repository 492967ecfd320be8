"""`gdn-matrix diff`: an upgrade that moves chunk_gated_delta_rule from ascendc to eager and breaks a
test is reported and fails the command; route-only changes, versions, added and removed cells,
expectations, benchmark slowdowns against the threshold, --no-fail, and unreadable reports."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gdn.matrix import diff as diff_mod
from gdn.matrix.config import parse_matrix
from gdn.matrix.jsonio import write_json
from gdn.matrix.report import write_report
from gdn.matrix.report_build import build_report
from gdn.matrix.schema import CellOutcome
from repo_paths import ROOT
from report_models import diff_typed

pytestmark = pytest.mark.tooling

CHUNK = "chunk_gated_delta_rule"
MATRIX = parse_matrix(
    {
        "schema": 1,
        "cells": [
            {
                "name": "npu-2610",
                "device": "npu",
                "runtime": "docker",
                "dockerfile": "docker/npu.Dockerfile",
                "base_image": "cann:9.1.0",
                "expect": [{"op": CHUNK, "backend": "ascendc"}],
            }
        ],
    }
)


def _record(route: str, rejected: tuple[str, str] | None = None) -> dict[str, Any]:
    return {
        "op": CHUNK,
        "device": "npu",
        "requested_mode": "auto",
        "backend": route.split(":")[0],
        "route": route,
        "strict": False,
        "probe": None,
        "rejected": [{"backend": rejected[0], "route": None, "reason": rejected[1], "probe": None}] if rejected else [],
    }


def _junit(failing: bool) -> str:
    failure = '<failure message="AssertionError: rel err 0.9">trace</failure>' if failing else ""
    cases = "".join(
        f'<testcase classname="tests.test_ops" name="{name}" time="0.1">'
        f'<properties><property name="family" value="single_op"/></properties>{body}</testcase>'
        for name, body in (("test_chunk[bf16]", failure), ("test_l2norm", ""))
    )
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'
    )


def _results(root: Path, *, route: str, failing: bool, fla_npu: str, rejected=None) -> Path:
    directory = root / "npu-2610"
    status = "failed" if failing else "passed"
    outcome = CellOutcome(
        cell="npu-2610", status=status, device="npu", runtime="docker", real_hardware=True, exit_code=int(failing)
    )
    outcome.write(directory)
    write_json(directory / "resolution.json", [_record(route, rejected)])
    write_json(directory / "manifest.json", {"fla_npu": {"distribution": {"name": "fla-npu", "version": fla_npu}}})
    (directory / "junit.xml").write_text(_junit(failing))
    return root


def test_ascendc_to_eager_and_a_new_failure_fail_the_diff(tmp_path, capsys):
    """The issue's must-show, through real results directories, report.json files and the command."""
    old = _results(tmp_path / "old", route="ascendc:stable-api", failing=False, fla_npu="26.6.0")
    new = _results(
        tmp_path / "new", route="eager", failing=True, fla_npu="26.10.0", rejected=("ascendc", "probe: all zeros")
    )
    old_json = write_report(build_report(old, MATRIX), tmp_path / "old-report")["json"]
    new_json = write_report(build_report(new, MATRIX), tmp_path / "new-report")["json"]

    assert diff_mod.main([str(old_json), str(new_json)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("## gdn-matrix diff\n\n**4 regression(s)**\n")
    assert (
        "- npu-2610: chunk_gated_delta_rule on npu moved from ascendc:stable-api to eager"
        " (ascendc rejected: probe: all zeros)\n" in out
    )
    assert "- npu-2610: tests.test_ops::test_chunk[bf16] newly failed" in out
    assert "- npu-2610: status passed → failed" in out
    assert "- npu-2610: expectation not met: chunk_gated_delta_rule: expected ascendc, resolved eager (eager)" in out
    assert (
        "| npu-2610 | chunk_gated_delta_rule | npu | ascendc:stable-api | eager | backend |"
        " ascendc rejected: probe: all zeros |" in out
    )
    assert "- npu-2610: `tests.test_ops::test_chunk[bf16]` (failed, not rerun) AssertionError: rel err 0.9" in out
    assert "| npu-2610 | fla_npu | 26.6.0 | 26.10.0 |" in out


def _cell(name: str, **fields: Any) -> dict[str, Any]:
    cell = {
        "name": name,
        "status": "passed",
        "device": "npu",
        "versions": {"torch": "2.9.0", "triton": "3.2.1"},
        "resolution": {CHUNK: {"npu": {"backend": "ascendc", "route": "ascendc:stable-api", "rejected": []}}},
        "families": {"single_op": {"passed": 2, "failed": 0, "error": 0, "skipped": 0, "total": 2}},
        "failures": [],
        "bench": None,
        "expectations": [],
    }
    cell.update(fields)
    return cell


def _report(*cells: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "generated_at": "2026-01-01T00:00:00+00:00", "ops": [CHUNK], "cells": list(cells)}


def test_identical_reports_have_no_changes():
    report = _report(_cell("a"), _cell("b", status="not_run", resolution={}))
    diff = diff_typed(report, copy.deepcopy(report))
    assert diff.regressions == []
    assert diff.to_markdown() == "## gdn-matrix diff\n\nNo regressions.\n"


def test_route_change_within_a_backend_is_reported_not_a_regression():
    old = _report(_cell("a"))
    new = _report(
        _cell(
            "a", resolution={CHUNK: {"npu": {"backend": "ascendc", "route": "ascendc:composite-fwd", "rejected": []}}}
        )
    )
    diff = diff_typed(old, new)
    [change] = diff.backend_changes
    assert (change.old_text, change.new_text, change.backend_changed) == (
        "ascendc:stable-api",
        "ascendc:composite-fwd",
        False,
    )
    assert diff.regressions == []
    assert (
        "| a | chunk_gated_delta_rule | npu | ascendc:stable-api | ascendc:composite-fwd | route | — |"
        in diff.to_markdown()
    )
    strict = diff_typed(old, new, route_changes_regress=True)
    assert strict.regressions == [
        "a: chunk_gated_delta_rule on npu moved from ascendc:stable-api to ascendc:composite-fwd"
    ]


def test_resolution_error_is_a_regression_and_a_recovery_is_not():
    broken = {CHUNK: {"npu": {"backend": None, "route": None, "error": "GdnBackendError: strict"}}}
    old, new = _report(_cell("a")), _report(_cell("a", resolution=broken))
    assert diff_typed(old, new).regressions == [
        "a: chunk_gated_delta_rule on npu moved from ascendc:stable-api to error: GdnBackendError: strict"
    ]
    recovered = diff_typed(new, old)
    assert len(recovered.backend_changes) == 1
    assert recovered.regressions == []


def test_versions_status_and_tests_that_pass_again():
    failure = {"test": "t::x", "family": "single_op", "outcome": "failed", "message": "boom"}
    old = _report(_cell("a", status="failed", failures=[failure]), _cell("b", status="failed", failures=[failure]))
    new = _report(
        _cell("a", versions={"torch": "2.9.0", "triton": "3.3.0"}),
        # b's tests did not run this time: its old failure is not known to pass now
        _cell("b", status="build_failed", families={}, resolution={}, versions={"torch": None, "triton": None}),
    )
    diff = diff_typed(old, new)
    # b left no manifest: its versions are unknown, not changed
    assert [(c.cell, c.package, c.old, c.new) for c in diff.version_changes] == [("a", "triton", "3.2.1", "3.3.0")]
    assert [(t.cell, t.test) for t in diff.newly_passing] == [("a", "t::x")]
    assert [(c.cell, c.old, c.new, c.regressed) for c in diff.status_changes] == [
        ("a", "failed", "passed", False),
        ("b", "failed", "build_failed", True),
    ]
    assert diff.regressions == ["b: status failed → build_failed"]
    md = diff.to_markdown()
    assert "### No longer failing\n\n- a: `t::x`\n" in md
    assert "- a: failed → passed\n- b: failed → build_failed (regression)" in md
    assert "| a | triton | 3.2.1 | 3.3.0 |" in md


def test_added_and_removed_cells():
    diff = diff_typed(_report(_cell("a"), _cell("gone")), _report(_cell("a"), _cell("fresh")))
    assert (diff.cells_added, diff.cells_removed) == (["fresh"], ["gone"])
    assert diff.regressions == ["gone: cell removed"]
    md = diff.to_markdown()
    assert "### Cells added\n\n- fresh\n" in md
    assert "### Cells removed\n\n- gone\n" in md


def test_expectation_violations_in_the_new_report():
    unmet = {"op": CHUNK, "backend": "ascendc", "route": None, "actual_backend": None, "actual_route": None}
    new = _report(
        _cell("ran", expectations=[{**unmet, "ok": False}]),
        # a cell that was not run says so through its status; its expectations were not tested
        _cell("skipped", status="not_run", resolution={}, expectations=[{**unmet, "ok": False}]),
        _cell("fine", expectations=[{**unmet, "actual_backend": "ascendc", "ok": True}]),
    )
    diff = diff_typed(new, copy.deepcopy(new))
    assert diff.regressions == ["ran: expectation not met: chunk_gated_delta_rule: expected ascendc, nothing resolved"]


def _bench(ms: float, other_ms: float) -> list[dict[str, Any]]:
    return [
        {"op": CHUNK, "impl": "triton", "shape": [1, 4096, 16, 128], "ms": ms},
        {"op": "l2norm", "impl": "triton", "shape": [4096, 128], "ms": other_ms},
    ]


def test_slowdowns_against_the_threshold(tmp_path, capsys):
    old = _report(_cell("cuda", bench=_bench(10.0, 1.0)))
    # the 35% a Triton upgrade once cost, and a 5% wobble
    new = _report(_cell("cuda", bench=_bench(13.5, 1.05)))
    diff = diff_typed(old, new)
    assert diff.regressions == ["cuda: chunk_gated_delta_rule · triton · 1×4096×16×128 slowed 35% (10 ms → 13.5 ms)"]
    assert "| cuda | chunk_gated_delta_rule · triton · 1×4096×16×128 | 10 | 13.5 | +35% |" in diff.to_markdown()
    assert [s.label for s in diff_typed(old, new, slowdown_threshold=0.01).slowdowns] == [
        "chunk_gated_delta_rule · triton · 1×4096×16×128",
        "l2norm · triton · 4096×128",
    ]

    old_path, new_path = tmp_path / "old.json", tmp_path / "new.json"
    write_json(old_path, old)
    write_json(new_path, new)
    assert diff_mod.main([str(old_path), str(new_path), "--threshold", "0.5"]) == 0
    assert "No regressions." in capsys.readouterr().out
    assert diff_mod.main([str(old_path), str(new_path)]) == 1


def test_no_fail_and_output_file(tmp_path, capsys):
    old_path, new_path, out = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "md" / "diff.md"
    write_json(old_path, _report(_cell("a")))
    write_json(new_path, _report(_cell("a", status="failed")))
    assert diff_mod.main([str(old_path), str(new_path), "--no-fail", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "- a: status passed → failed" in printed
    assert out.read_text() == printed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read report {path}: [Errno 2]"),
        ("{not json", "{path} is not JSON: Expecting property name"),
        ('{"schema": 1}', "{path}: generated_at: Field required (and 2 more)"),
        ('{"schema": 7, "cells": []}', "{path} has report schema 7; this gdn-matrix reads schema 1"),
        (
            '{"schema": 1, "generated_at": "now", "ops": [], "cells": [{"status": "passed"}]}',
            "{path}: cells[0].name: Field required",
        ),
    ],
)
def test_unreadable_report_exits_2_naming_the_file(tmp_path, capsys, content, message):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    write_json(good, _report(_cell("a")))
    if content is not None:
        bad.write_text(content)
    assert diff_mod.main([str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("gdn-matrix diff: error: " + message.format(path=bad))


def test_skip_not_run_leaves_cells_a_fork_could_not_run_out_of_the_comparison():
    old = _report(_cell("npu-2610", status="passed"), _cell("cpu", status="passed"))
    new = _report(_cell("npu-2610", status="not_run"), _cell("cpu", status="failed"))
    assert "npu-2610: status passed → not_run" in diff_typed(old, new).regressions
    diff = diff_typed(old, new, skip_not_run=True)
    assert diff.not_compared == ["npu-2610"]
    assert diff.regressions == ["cpu: status passed → failed"]
    assert "### Not compared (not run in the new report)\n\n- npu-2610\n" in diff.to_markdown()


def _lock(digest: str, **packages: str) -> dict[str, Any]:
    return {"digest": digest, "packages": packages}


def test_a_lock_change_is_listed_package_by_package_and_is_no_regression(tmp_path):
    old_lock = _lock("sha256:aa", torch="2.11.0", bar="2.0", numpy="2.4.6")
    new_lock = _lock("sha256:bb", torch="2.13.0", foo="1.0", numpy="2.4.6")
    # through cell.json and the report, as a cell run leaves them
    reports = []
    for name, lock in (("old", old_lock), ("new", new_lock)):
        directory = tmp_path / name / "cuda-triton36"
        CellOutcome(cell="cuda-triton36", status="passed", device="cuda", runtime="docker", lock=lock).write(directory)
        reports.append(build_report(tmp_path / name).to_json())
    assert [r["cells"][0]["lock"] for r in reports] == [old_lock, new_lock]
    diff = diff_typed(*reports)
    assert diff.regressions == []
    [change] = diff.lock_changes
    expected = "cell cuda-triton36: lock changed: torch 2.11.0 -> 2.13.0, + foo 1.0, - bar 2.0"
    assert change.text == expected
    assert f"### Locks\n\n- {expected}\n" in diff.to_markdown()


def test_same_lock_or_no_lock_is_no_change_and_other_hashes_are_named():
    same = _cell("a", lock=_lock("sha256:aa", torch="2.11.0"))
    assert diff_typed(_report(same), _report(copy.deepcopy(same))).lock_changes == []
    assert diff_typed(_report(_cell("a")), _report(same)).lock_changes == []
    rehashed = _cell("a", lock=_lock("sha256:bb", torch="2.11.0"))
    [change] = diff_typed(_report(same), _report(rehashed)).lock_changes
    assert change.text == ("cell a: lock changed: same versions, other files or hashes (sha256:aa -> sha256:bb)")


def test_reports_written_before_fla_was_asked_per_dtype_still_diff(capsys):
    """A report pulled from an older run holds fla's choice for one bf16 call (no per-dtype calls): the
    diff against it reads that as what it is, instead of failing on the missing key."""
    samples = ROOT / "docs" / "samples"
    before = samples / "h200-cuda-triton36-2026-12-01" / "report" / "report.json"
    after = samples / "h200-cuda-flashqla-2026-12-02" / "report" / "report.json"
    assert diff_mod.main([str(before), str(after), "--no-fail"]) == 0
    assert "bfloat16: chunk -> flash_qla" in capsys.readouterr().out
