"""`gdn-matrix diff` on the accuracy table: an error that grows past --accuracy-factor times its old value
and past its dtype's floor is a regression naming op, backend, dtype, regime, layout and quantity; so is
an error that becomes non-finite and a row no longer measured; growth under the floor, or within the
factor, is not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gdn.matrix import diff
from gdn.matrix.jsonio import write_json
from report_models import diff_typed

pytestmark = pytest.mark.tooling

OP = "chunk_gated_delta_rule"


def row(backend: str, dtype: str, regime: str, **errors: float | None) -> dict[str, Any]:
    return {
        "op": OP,
        "backend": backend,
        "dtype": dtype,
        "status": "measured",
        "regime": regime,
        "layout": "dense",
        "route": f"{backend}:x",
        "errors": errors,
        "reason": None,
        "kernels": [],
    }


ROWS = [
    row("fla", "float32", "qwen", o=1.4e-3, dg=1.2e-3, dq=1.4e-3),
    row("triton", "float32", "qwen", o=7e-7, dg=2e-6, dq=7e-7),
    row("triton", "bfloat16", "mild", o=3.9e-3, dg=3.4e-3, dq=3.9e-3),
]


def cell(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "cuda-h200",
        "status": "passed",
        "resolution": {OP: {"cuda": {"backend": "triton", "route": "triton:bundled", "rejected": []}}},
        "failures": [],
        "accuracy": {"device": "cuda", "shape": {"T": 1024}, "rows": rows, "unavailable": {}},
    }


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": 1, "generated_at": "2026-12-04T00:00:00+00:00", "ops": [OP], "cells": [cell(rows)]}


def changed(mutate) -> tuple[dict, dict]:
    new = copy.deepcopy(ROWS)
    mutate(new)
    return report(ROWS), report(new)


def test_flas_dg_grown_50x_fails_the_diff_naming_it(tmp_path, capsys):
    def grow(rows):
        rows[0]["errors"]["dg"] = 50 * 1.2e-3

    old, new = changed(grow)
    write_json(tmp_path / "old.json", old)
    write_json(tmp_path / "new.json", new)
    assert diff.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 1
    out = capsys.readouterr().out
    assert "accuracy: cuda-h200: chunk_gated_delta_rule · fla · float32 qwen dense · dg: 1.2e-03 → 6.0e-02 (50x" in out
    assert "| cuda-h200 | chunk_gated_delta_rule | fla | float32 | qwen | dense | dg |" in out
    # a factor that admits it
    assert diff.main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--accuracy-factor", "60"]) == 0


def test_growth_under_the_floor_or_the_factor_is_not_a_regression():
    def grow(rows):
        rows[1]["errors"]["dg"] = 5e-6  # 2.5x, but fp32 under the 1e-5 floor
        rows[2]["errors"]["o"] = 7e-3  # bf16 over the floor, but under 2x

    assert diff_typed(*changed(grow)).accuracy_regressions == []


def test_an_error_that_became_non_finite_or_a_row_no_longer_measured_regresses():
    def break_rows(rows):
        rows[1]["errors"]["o"] = None
        rows[2].update(status="error", errors={}, reason="RuntimeError: ACL error")

    found = diff_typed(*changed(break_rows)).accuracy_regressions
    assert [(r.backend, r.dtype, r.quantity, r.why) for r in found] == [
        ("triton", "float32", "o", "7.0e-07 → not finite"),
        ("triton", "bfloat16", None, "no longer measured (error: RuntimeError: ACL error)"),
    ]


@pytest.mark.parametrize("factor", ["0.5", "nan", "inf", "x"])
def test_a_factor_that_is_not_a_finite_number_of_at_least_1_is_refused(tmp_path, capsys, factor):
    write_json(tmp_path / "r.json", report(ROWS))
    with pytest.raises(SystemExit) as exited:
        diff.main([str(tmp_path / "r.json"), str(tmp_path / "r.json"), "--accuracy-factor", factor])
    assert exited.value.code == 2
    assert "--accuracy-factor" in capsys.readouterr().err
