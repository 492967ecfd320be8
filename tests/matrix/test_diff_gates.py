"""What `gdn-matrix diff` gates: a newly failing test by its label (deterministic and not rerun gate,
flaky and seed-dependent are news unless --gate-flaky), and a benchmark row by the trailing median of
the history and its spread where the history has enough reports of it, else by the old report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gdn.matrix import diff, speed_gate
from gdn.matrix.history_store import add_report
from report_models import diff_typed

pytestmark = pytest.mark.tooling

CHUNK = "chunk_gated_delta_rule"
SHAPE = {"B": 1, "T": 2048, "H": 16, "HV": 16, "K": 128, "V": 128}


def _row(ms: float) -> dict[str, Any]:
    return {"op": CHUNK, "backend": "triton", "shape": SHAPE, "pass": "fwd", "implementation": "triton", "ms": ms}


def _cell(status: str = "passed", failures: list[dict[str, Any]] = (), ms: float | None = None) -> dict[str, Any]:
    return {
        "name": "cuda",
        "status": status,
        "device": "cuda",
        "runtime": "host",
        "families": {"single_op": {"passed": 3, "failed": len(failures), "error": 0, "skipped": 0, "total": 3}},
        "failures": list(failures),
        "bench": None if ms is None else [_row(ms)],
    }


def _report(cell: dict[str, Any], generated_at: str = "2026-12-05T00:00:00+00:00") -> dict[str, Any]:
    return {"schema": 1, "generated_at": generated_at, "ops": [CHUNK], "cells": [cell]}


def _failure(label: str | None) -> dict[str, Any]:
    return {
        "test": "tests.test_ops::test_tail",
        "outcome": "failed",
        "message": "rel err 0.0141 > 0.012",
        "label": label,
    }


@pytest.mark.parametrize(
    ("label", "status", "gated"),
    [
        ("deterministic", "failed", True),
        ("not_rerun", "failed", True),
        (None, "failed", True),  # a report made before failures were labelled: nothing shows it is not real
        ("seed_dependent", "failed", False),
        ("flaky", "flaky", False),
    ],
)
def test_only_failures_not_shown_flaky_or_seed_dependent_gate_by_default(label, status, gated):
    old, new = _report(_cell()), _report(_cell(status, [_failure(label)]))
    default = diff_typed(old, new)
    assert bool(default.regressions) is gated, default.regressions
    markdown = default.to_markdown()
    if not gated:
        assert "### Newly failing, flaky or seed-dependent (not gated; --gate-flaky gates them)" in markdown
        assert f"(failed, {label.replace('_', '-')})" in markdown
        assert "(on flaky or seed-dependent failures alone)" in markdown
    gate_all = diff_typed(old, new, gate_flaky=True)
    assert any("test_tail newly failed" in r for r in gate_all.regressions)
    assert any(f"status passed → {status}" in r for r in gate_all.regressions)


def test_gate_flaky_on_the_command_line(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_report(_cell())))
    new.write_text(json.dumps(_report(_cell("flaky", [_failure("flaky")]))))
    assert diff.main([str(old), str(new)]) == diff.EXIT_OK
    assert diff.main([str(old), str(new), "--gate-flaky"]) == diff.EXIT_REGRESSION
    assert "tests.test_ops::test_tail newly failed, flaky" in capsys.readouterr().out


# ---------------------------------------------------------------- speed against the history


def _history(tmp_path: Path, times: list[float]) -> Path:
    """A history of one report per time, a day apart, kept by the history store as `history add` keeps them."""
    history = tmp_path / "history"
    for day, ms in enumerate(times, start=1):
        report_dir = tmp_path / "reports" / f"{day}" / "report"
        report_dir.mkdir(parents=True)
        report = _report(_cell(ms=ms), f"2026-11-{day:02d}T00:00:00+00:00")
        (report_dir / "report.json").write_text(json.dumps(report))
        add_report(report_dir, history)
    return history


def _diff(tmp_path: Path, old_ms: float, new_ms: float, history: Path | None, capsys) -> tuple[int, str, str]:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_report(_cell(ms=old_ms), "2026-11-30T00:00:00+00:00")))
    new.write_text(json.dumps(_report(_cell(ms=new_ms))))
    args = [str(old), str(new)] + (["--history", str(history)] if history else [])
    capsys.readouterr()
    code = diff.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_slow_old_run_no_longer_hides_a_slowdown_the_median_shows(tmp_path, capsys):
    """The old report was itself slow (1.15 ms, a noisy run): against it 1.20 ms is +4%, no regression;
    against the median of seven reports (1.00 ms, MAD 0.01) it is +20%, past the 10% threshold."""
    history = _history(tmp_path, [1.00, 1.01, 0.99, 1.00, 1.02, 1.00, 1.15])
    code, out, _ = _diff(tmp_path, 1.15, 1.20, None, capsys)
    assert code == diff.EXIT_OK, out
    code, out, _ = _diff(tmp_path, 1.15, 1.20, history, capsys)
    assert code == diff.EXIT_REGRESSION, out
    assert "slowed 20% (1 ms → 1.2 ms, against the median of 7 reports (MAD 0.01 ms))" in out
    assert "1 row(s) judged against the trailing median" in out


def test_a_fast_old_run_no_longer_flags_a_time_within_the_historys_spread(tmp_path, capsys):
    """The old report was a fast outlier (0.70 ms): against it 0.90 ms is +29%, a regression; the
    median of five reports (1.00 ms) says 0.90 ms is no slower."""
    history = _history(tmp_path, [1.00, 0.98, 1.03, 1.01, 0.70])
    code, out, _ = _diff(tmp_path, 0.70, 0.90, None, capsys)
    assert code == diff.EXIT_REGRESSION and "slowed 29%" in out and "against the old report" in out
    code, out, _ = _diff(tmp_path, 0.70, 0.90, history, capsys)
    assert code == diff.EXIT_OK, out
    assert "1 row(s) judged against the trailing median" in out


def test_the_spread_of_a_noisy_row_widens_its_margin():
    """A row whose history spreads +-20% is not slower at +25% of its median; a quiet one is."""
    noisy = speed_gate.judge(1.0, [0.8, 1.2, 1.0, 0.8, 1.2, 1.0], 0.10)
    assert noisy.baseline_ms == 1.0 and noisy.allowed == pytest.approx(0.6)
    quiet = speed_gate.judge(1.0, [1.0, 1.01, 0.99, 1.0, 1.0], 0.10)
    assert quiet.allowed == pytest.approx(0.10)


def test_too_few_reports_in_the_history_fall_back_to_the_old_report_and_say_so(tmp_path, capsys):
    history = _history(tmp_path, [1.00, 1.00, 1.00, 1.15])
    code, out, _ = _diff(tmp_path, 1.15, 1.20, history, capsys)
    assert code == diff.EXIT_OK, out
    assert "1 row(s) judged against the old report" in out
    assert "history: 4 report(s) before the new one; a row needs 5" in out
    code, out, _ = _diff(tmp_path, 0.70, 0.90, history, capsys)
    assert "against the old report (history has 4 of 5 reports)" in out


def test_reports_at_or_after_the_new_one_are_not_its_history(tmp_path, capsys):
    """The new report, or a later one, kept already is not part of its own baseline."""
    history = _history(tmp_path, [1.00, 1.01, 0.99, 1.00, 1.02])
    later = copy.deepcopy(_report(_cell(ms=5.0), "2026-12-06T00:00:00+00:00"))
    report_dir = tmp_path / "later" / "report"
    report_dir.mkdir(parents=True)
    (report_dir / "report.json").write_text(json.dumps(later))
    add_report(report_dir, history)
    reports, problems = speed_gate.trailing_reports(history, "2026-12-05T00:00:00+00:00")
    assert len(reports) == 5 and not problems


def test_a_history_that_is_not_a_directory_is_unusable_input(tmp_path, capsys):
    code, _, err = _diff(tmp_path, 1.0, 1.0, tmp_path / "missing", capsys)
    assert code == diff.EXIT_UNUSABLE
    assert f"--history {tmp_path / 'missing'}: no such directory" in err
