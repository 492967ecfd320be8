"""gdn.matrix.bench on a machine without an accelerator: it says it needs one and exits 0 without writing a
bench.json (a cell's bench runs only on accelerator cells); and the cell entry runs it as the bench."""

from __future__ import annotations

import pytest
import torch

from gdn.backends import fla as fla_backend
from gdn.matrix import entry

pytestmark = pytest.mark.tooling


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: gdn.matrix.bench would time it")
def test_without_an_accelerator_it_says_so_and_writes_nothing(tmp_path, capsys):
    from gdn.matrix import bench as cell

    if cell.accelerator() is not None:
        pytest.skip("an NPU is visible: gdn.matrix.bench would time it")
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
    [bench] = [c for c in commands if "-m" in c and c[c.index("-m") + 1].endswith("bench")]
    assert bench[bench.index("-m") + 1] == "gdn.matrix.bench"
    assert bench[bench.index("--matrix-out") + 1] == str(tmp_path / "bench.json")
    assert bench[bench.index("--kernels") + 1] == str(tmp_path / "kernels.json")


def test_peers_are_timed_after_gdns_own_backends():
    from gdn.matrix import bench as cell

    assert cell.timing_order(["triton", "fla", "flashqla", "eager"]) == ["triton", "eager", "fla", "flashqla"]


def test_the_budget_interrupts_a_call_in_progress_and_the_rest_say_so(monkeypatch):
    """A first call that autotunes for minutes must not hold the cell past its budget."""
    import time

    from gdn.matrix import bench as cell

    monkeypatch.setattr(fla_backend, "hopper_guard_blocks", lambda: False)
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
    from gdn.matrix import bench as cell

    monkeypatch.setattr(fla_backend, "hopper_guard_blocks", lambda: False)
    bench = cell.Cell("cpu", budget_s=0.0)
    bench.spent = True
    bench.measure("fla", cell.CHUNK, {"B": 1}, {"fwd": lambda: None}, None)
    bench.measure("eager", cell.CHUNK, {"B": 1}, {"fwd": lambda: None}, None)
    fla_row, eager_row = bench.rows
    assert fla_row.reason == cell.backends()["fla"].why_unavailable("cpu")
    assert fla_row.reason.startswith("serves devices")
    assert eager_row.reason == "not timed: the bench budget of 0 s was spent"


def _fake_warm_up(backend: str, rows_out, row: dict) -> list[str]:
    """A warm-up process per backend: triton's writes its row and exits, fla's never finishes, flashqla's
    exits 3 before writing anything."""
    import json
    import sys

    script = {
        "triton": f"import sys; open(sys.argv[1], 'a').write({json.dumps(json.dumps(row))} + '\\n')",
        "fla": "import time; time.sleep(60)",
        "flashqla": "raise SystemExit(3)",
    }[backend]
    return [sys.executable, "-c", script, str(rows_out)]


def test_the_warm_up_runs_first_calls_apart_ends_the_slow_and_the_timing_takes_its_first_call_times(monkeypatch):
    """Peers compile for minutes: their first calls run in parallel processes before the timing; a warm-up
    still running at its deadline is ended (the bench stays within its budgets), and the timing makes
    that workload's first calls itself, saying so; a warm-up that failed gives its rows the reason."""
    import time

    from gdn.matrix import bench as cell

    shape = {"B": 1}
    row = {"op": cell.CHUNK, "backend": "triton", "shape": shape, "pass": "fwd", "first_call_s": 97.5}
    monkeypatch.setattr(fla_backend, "hopper_guard_blocks", lambda: False)
    monkeypatch.setattr(cell, "WORKLOADS", (("chunk", (1,)),))
    monkeypatch.setattr(
        cell, "warm_up_command", lambda device, backend, workload, rows_out: _fake_warm_up(backend, rows_out, row)
    )
    bench = cell.Cell("cpu", budget_s=3.0)
    started = time.monotonic()
    cell.warm_up(bench, ["triton", "fla", "flashqla"], until_s=2.0)
    assert time.monotonic() - started < 15
    monkeypatch.setattr(bench, "implementation", lambda backend, op: (f"{backend}:route", None))
    monkeypatch.setattr(cell, "median_ms", lambda fn, grad_to_none, warmup, rep: 1.25)
    monkeypatch.setattr(cell, "peak_gib", lambda fn, device: 0.5)
    monkeypatch.setattr(cell.torch, "cpu", type("Cpu", (), {"synchronize": staticmethod(lambda: None)}), raising=False)
    for backend in ("triton", "fla", "flashqla", "eager"):
        bench.measure(backend, cell.CHUNK, shape, {"fwd": lambda: None}, None)
    quick, slow, broken, eager = bench.rows
    assert (quick.ms, quick.first_call_s, quick.reason) == (1.25, 97.5, None)
    assert (slow.ms, slow.reason) == (1.25, None) and slow.first_call_s is not None
    assert slow.note == "its warm-up's first calls were not done after 2 s: the timing made them"
    assert (broken.ms, broken.reason) == (None, "not timed: its warm-up process exited with status 3")
    # a backend without a warm-up process makes its first call in the timing process
    assert eager.ms == 1.25 and eager.first_call_s is not None and eager.reason is None


def test_a_warm_up_process_makes_only_first_calls_and_writes_each_row_as_it_goes(tmp_path, monkeypatch):
    import json

    from gdn.matrix import bench as cell

    monkeypatch.setattr(fla_backend, "hopper_guard_blocks", lambda: False)
    monkeypatch.setattr(cell, "median_ms", lambda *a, **k: pytest.fail("a warm-up process does not time"))
    monkeypatch.setattr(cell.torch, "cpu", type("Cpu", (), {"synchronize": staticmethod(lambda: None)}), raising=False)
    rows_out = tmp_path / "rows.jsonl"
    bench = cell.Cell("cpu", float("inf"), first_calls_only=True, rows_out=rows_out)
    monkeypatch.setattr(bench, "implementation", lambda backend, op: (f"{backend}:route", None))
    bench.measure("triton", cell.CHUNK, {"B": 2}, {"fwd": lambda: None, "fwd+bwd": lambda: None}, None)
    lines = [json.loads(line) for line in rows_out.read_text().splitlines()]
    assert [(r["pass"], r["ms"], r["implementation"]) for r in lines] == [
        ("fwd", None, "triton:route"),
        ("fwd+bwd", None, "triton:route"),
    ]
    assert all(isinstance(r["first_call_s"], float) for r in lines)


def test_the_budgets_come_from_the_environment_where_the_entry_runs_the_bench(monkeypatch):
    from gdn.matrix import bench as cell

    monkeypatch.setenv(cell.WARM_UP_ENV, "90")
    monkeypatch.setenv(cell.BUDGET_ENV, "60.5")
    args = cell.build_parser().parse_args([])
    assert (args.warm_up_s, args.budget_s) == (90.0, 60.5)
    assert cell.build_parser().parse_args(["--budget-s", "30"]).budget_s == 30.0


@pytest.mark.parametrize("text", ["soon", "0", "-5"])
def test_a_budget_that_is_not_a_positive_number_is_refused_by_name(monkeypatch, text):
    from gdn.matrix import bench as cell

    monkeypatch.setenv(cell.WARM_UP_ENV, text)
    with pytest.raises(SystemExit, match=f"GDN_BENCH_WARM_UP_S must be a positive number of seconds, got '{text}'"):
        cell.build_parser()
