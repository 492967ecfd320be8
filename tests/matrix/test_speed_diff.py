"""The report's speed table and peer-kernel lines, and what `gdn-matrix diff` says about them: a
slowdown per (op, backend, shape, pass), the fastest backend's change per (op, shape, pass), and a
change of the kernel fla itself runs (a regression only with a slowdown or a resolution loss)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gdn.matrix import diff as diff_mod
from gdn.matrix import speed
from gdn.matrix.jsonio import write_json
from gdn.matrix.report_html import render_html
from gdn.matrix.report_markdown import render_markdown
from report_models import diff_typed, typed, typed_cell

pytestmark = pytest.mark.tooling

CHUNK = "chunk_gated_delta_rule"
BIG = {"B": 4, "T": 4096, "H": 16, "HV": 32, "K": 128, "V": 128}
GROUP = "chunk_gated_delta_rule fwd+bwd (B=4 T=4096 H=16 HV=32 K=V=128)"
# fla's kernel lines of the two stacks: its own Triton path, and its chunk op handed to FlashQLA
OWN = "bfloat16: chunk -> triton, chunk_bwd_dqkwg -> triton"
QLA = "bfloat16: chunk -> flash_qla"


def row(backend: str, ms: float | None, *, impl: str | None = None, reason: str | None = None, fastest: float = 1.0):
    return {
        "op": CHUNK,
        "backend": backend,
        "shape": BIG,
        "pass": "fwd+bwd",
        "implementation": impl or (None if ms is None else backend),
        "ms": ms,
        "peak_gib": None if ms is None else 1.5,
        "ratio_to_fastest": None if ms is None else round(ms / fastest, 3),
        "first_call_s": None,
        "reason": reason,
        "note": None,
    }


def fla(chunk: str) -> dict[str, Any]:
    dqkwg = "triton" if chunk == "triton" else None  # fla's own chunk function dispatches its dqkwg
    choices = {"chunk": chunk, "chunk_bwd_dqkwg": dqkwg, "hopper_guard_blocks": False, "error": None}
    return {
        "version": "0.6.0",
        "import_error": None,
        "calls": {"bfloat16": choices},
        "peer_packages": {"flash-qla": "0.1.3"} if chunk == "flash_qla" else {},
        "stand_in": None,
    }


def cell(bench: list[dict[str, Any]], kernel: str, backend: str = "triton") -> dict[str, Any]:
    return {
        "name": "cuda-h200",
        "status": "passed",
        "reason": None,
        "device": "cuda",
        "runtime": "host",
        "matrix_runtime": "host",
        "real_hardware": True,
        "cards": ["NVIDIA H200"],
        "stand_ins": [],
        "duration_s": 200.0,
        "image": None,
        "image_built": None,
        "exit_code": 0,
        "log_tail": None,
        "lock": None,
        "versions": {"torch": "2.11.0"},
        "pin_differences": [],
        "resolution": {CHUNK: {"cuda": {"backend": backend, "route": f"{backend}:x", "rejected": []}}},
        "families": {},
        "failures": [],
        "bench": bench,
        "peer_kernels": {"fla": fla(kernel)},
        "expectations": [],
        "problems": [],
    }


def report(*cells: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "generated_at": "2026-12-01T00:00:00+00:00", "ops": [CHUNK], "cells": list(cells)}


OLD_BENCH = [
    row("triton", 3.71, fastest=3.71),
    row("fla", 4.24, impl="fla:0.6.0 -> triton", fastest=3.71),
    row("flashqla", None, reason="ModuleNotFoundError: No module named 'flash_qla'"),
]
NEW_BENCH = [
    row("triton", 3.72, fastest=1.89),
    row("fla", 1.91, impl="fla:0.6.0 -> flash_qla", fastest=1.89),
    row("flashqla", 1.89, impl="flashqla:0.1.3", fastest=1.89),
]


def test_speed_table_is_fastest_first_with_ratios_and_reasons():
    text = "\n".join(speed.markdown(typed(report(cell(OLD_BENCH, "triton")))))
    lines = [line for line in text.splitlines() if line.startswith(f"| {CHUNK}")]
    assert lines == [
        f"| {CHUNK} | B=4 T=4096 H=16 HV=32 K=V=128 | fwd+bwd | **triton** | triton | 3.710 | 1.00× | 1.50 | — | — |",
        f"| {CHUNK} | B=4 T=4096 H=16 HV=32 K=V=128 | fwd+bwd | fla | fla:0.6.0 -> triton | 4.240 | 1.14× | 1.50 | — "
        "| — |",
        f"| {CHUNK} | B=4 T=4096 H=16 HV=32 K=V=128 | fwd+bwd | flashqla | — | — | — | — | — | "
        "ModuleNotFoundError: No module named 'flash_qla' |",
    ]


def test_report_shows_speed_and_peer_kernels_in_md_and_html():
    rendered = report(cell(NEW_BENCH, "flash_qla"))
    markdown = render_markdown(typed(rendered))
    assert "## Speed" in markdown and "## Peer kernels" in markdown
    assert f"| cuda-h200 | fla 0.6.0 | {QLA} | flash-qla 0.1.3 |" in markdown
    html = render_html(typed(rendered))
    assert '<table class="speed">' in html
    assert '<tr class="fastest"><td>chunk_gated_delta_rule</td>' in html
    assert "<td>flashqla</td><td>flashqla:0.1.3</td><td>1.890</td><td>1.00×</td>" in html


def test_bench_rows_that_do_not_validate_are_problems():
    bad = [{**row("triton", 1.0), "pass": "sideways"}]
    assert speed.row_problems(bad)[0].startswith("bench.json row #0 is not a bench row")
    assert speed.cell_rows(typed_cell({"name": "c", "status": "passed", "bench": bad})) == []


def test_kernel_change_without_slowdown_is_reported_and_not_a_regression(tmp_path, capsys):
    old, new = report(cell(OLD_BENCH, "triton")), report(cell(NEW_BENCH, "flash_qla"))
    diff = diff_typed(old, new)
    assert diff.regressions == []
    [change] = diff.kernel_changes
    assert (change.peer, change.old, change.new, change.with_) == ("fla", OWN, QLA, [])
    speed_change = f"{CHUNK} · fla · B=4, T=4096, H=16, HV=32, K=128, V=128 · fwd+bwd: 4.24 → 1.91 ms (-55%)"
    assert change.speed == [speed_change]
    markdown = diff.to_markdown()
    assert f"| cuda-h200 | fla | {OWN} | {QLA} | {speed_change} | no slowdown, no resolution loss |" in markdown
    assert f"- cuda-h200: fastest at {GROUP}: triton -> flashqla" in markdown
    old_path, new_path = tmp_path / "old.json", tmp_path / "new.json"
    write_json(old_path, old)
    write_json(new_path, new)
    assert diff_mod.main([str(old_path), str(new_path)]) == 0
    assert "fastest at" in capsys.readouterr().out


def test_kernel_change_with_a_slowdown_is_a_regression():
    slower = copy.deepcopy(OLD_BENCH)
    slower[1]["ms"] = 5.0  # fla went from 4.24 to 5.0 ms (+18%) when its kernel changed
    diff = diff_typed(report(cell(OLD_BENCH, "flash_qla")), report(cell(slower, "triton")))
    label = f"{CHUNK} · fla · B=4, T=4096, H=16, HV=32, K=128, V=128 · fwd+bwd"
    assert diff.regressions == [
        f"cuda-h200: {label} slowed 18% (4.24 ms → 5 ms)",
        f"cuda-h200: fla's kernel changed ({QLA} → {OWN}) with {label} slowed 18%",
    ]


def test_kernel_change_with_a_resolution_loss_is_a_regression():
    diff = diff_typed(report(cell(OLD_BENCH, "triton")), report(cell(OLD_BENCH, "flash_qla", backend="eager")))
    assert any("fla's kernel changed" in r and "moved from triton:x to eager:x" in r for r in diff.regressions)


def test_slowdowns_are_per_pass():
    fwd = {**row("triton", 1.0), "pass": "fwd"}
    old = report(cell([fwd, row("triton", 3.0)], "triton"))
    new = report(cell([{**fwd, "ms": 1.5}, row("triton", 3.0)], "triton"))
    [slow] = diff_typed(old, new).slowdowns
    assert slow.label.endswith("· fwd") and slow.ratio == pytest.approx(0.5)


def test_pair_compares_two_differently_named_cells(tmp_path, capsys):
    """The stack in use against the candidate cell that adds FlashQLA: two cells of one matrix, compared
    as an upgrade (without --pair they are a cell removed and a cell added, nothing compared)."""
    old = report({**cell(OLD_BENCH, "triton"), "name": "cuda-triton36"})
    new = report({**cell(NEW_BENCH, "flash_qla"), "name": "cuda-flashqla"})
    unpaired = diff_typed(old, new)
    assert unpaired.kernel_changes == [] and unpaired.cells_removed == ["cuda-triton36"]
    paired = diff_typed(old, new, pairs=[("cuda-triton36", "cuda-flashqla")])
    [change] = paired.kernel_changes
    assert (change.cell, change.old, change.new) == (
        "cuda-triton36 → cuda-flashqla",
        OWN,
        QLA,
    )
    assert paired.regressions == [] and paired.cells_removed == paired.cells_added == []
    old_path, new_path = tmp_path / "old.json", tmp_path / "new.json"
    write_json(old_path, old)
    write_json(new_path, new)
    assert diff_mod.main([str(old_path), str(new_path), "--pair", "cuda-triton36=cuda-flashqla"]) == 0
    assert f"| cuda-triton36 → cuda-flashqla | fla | {OWN} | {QLA} |" in capsys.readouterr().out
    assert diff_mod.main([str(old_path), str(new_path), "--pair", "cuda-triton36=cuda-triton39"]) == 2
    assert "the new report has no cell 'cuda-triton39'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        diff_mod.main([str(old_path), str(new_path), "--pair", "cuda-triton36"])
