"""bench.cell on a machine without an accelerator: it says it needs one and exits 0 without writing a
bench.json (a cell's bench runs only on accelerator cells); and the cell entry runs it as the bench."""

from __future__ import annotations

import pytest
import torch

from gdn.matrix import entry

pytestmark = pytest.mark.tooling


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: bench.cell would time it")
def test_without_an_accelerator_it_says_so_and_writes_nothing(tmp_path, capsys):
    from bench import cell

    if cell.accelerator() is not None:
        pytest.skip("an NPU is visible: bench.cell would time it")
    out = tmp_path / "bench.json"
    assert cell.main(["--matrix-out", str(out)]) == 0
    assert "needs a GPU or an NPU" in capsys.readouterr().out
    assert not out.exists()


def test_the_cell_entry_runs_bench_cell(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(
        entry,
        "_step",
        lambda name, command, cwd, env: commands.append(command) or {"step": name, "exit_code": 0, "duration_s": 0},
    )
    entry.main(["--cell", "c", "--out", str(tmp_path), "--families", "probe", "--bench"])
    [bench] = [c for c in commands if "-m" in c and c[c.index("-m") + 1].startswith("bench")]
    assert bench[bench.index("-m") + 1] == "bench.cell"
    assert bench[-2:] == ["--matrix-out", str(tmp_path / "bench.json")]


def test_peers_are_timed_after_gdns_own_backends():
    from bench import cell

    assert cell.timing_order(["triton", "fla", "flashqla", "eager"]) == ["triton", "eager", "fla", "flashqla"]


def test_the_budget_interrupts_a_call_in_progress_and_the_rest_say_so(monkeypatch):
    """A first call that autotunes for minutes must not hold the cell past its budget."""
    import time

    from bench import cell

    monkeypatch.setattr(cell, "fla_kernel", lambda: (None, False))
    bench = cell.Cell("cpu", budget_s=0.5)
    monkeypatch.setattr(bench, "implementation", lambda backend, op: (f"{backend}:route", None))
    slow = {"fwd": lambda: time.sleep(30), "fwd+bwd": lambda: None}
    started = time.monotonic()
    with bench.deadline():
        bench.measure("eager", cell.CHUNK, {"B": 1}, slow, None)
        bench.measure("eager", cell.CHUNK, {"B": 4}, {"fwd": lambda: None}, None)
    assert time.monotonic() - started < 5
    assert [(r.shape, r.pass_, r.ms) for r in bench.rows] == [
        ({"B": 1}, "fwd", None),
        ({"B": 1}, "fwd+bwd", None),
        ({"B": 4}, "fwd", None),
    ]
    assert all(r.reason == "not timed: the bench budget of 0 s was spent" for r in bench.rows)
    assert bench.rows[0].implementation == "eager:route"


def test_a_missing_peer_says_so_even_after_the_budget(monkeypatch):
    from bench import cell

    monkeypatch.setattr(cell, "fla_kernel", lambda: (None, False))
    bench = cell.Cell("cpu", budget_s=0.0)
    bench.spent = True
    bench.measure("fla", cell.CHUNK, {"B": 1}, {"fwd": lambda: None}, None)
    bench.measure("eager", cell.CHUNK, {"B": 1}, {"fwd": lambda: None}, None)
    fla_row, eager_row = bench.rows
    assert fla_row.reason == cell.backends()["fla"].why_unavailable("cpu")
    assert fla_row.reason.startswith("serves devices")
    assert eager_row.reason == "not timed: the bench budget of 0 s was spent"
