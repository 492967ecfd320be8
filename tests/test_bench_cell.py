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
