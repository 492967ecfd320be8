"""bench.chunk's row and sweep selection (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
from bench import chunk

pytestmark = pytest.mark.tooling


def test_rows_the_arguments_select():
    dense_first = (1, 8192, 16, 32, 128, False)
    assert chunk.selected_rows(chunk.arguments([]))[0] == dense_first
    assert len(chunk.selected_rows(chunk.arguments([]))) == len(chunk.SHAPES) + 1  # and the packed row
    assert chunk.selected_rows(chunk.arguments(["--quick"])) == [dense_first]
    assert chunk.selected_rows(chunk.arguments(["--rows", "3"]))[0][-1] is True
    rank = ["--shape", "1", "32768", "2", "4", "128"]
    assert chunk.selected_rows(chunk.arguments(rank)) == [(1, 32768, 2, 4, 128, False)]
    assert chunk.selected_rows(chunk.arguments([*rank, "--rows", "0"])) == [dense_first, (1, 32768, 2, 4, 128, False)]


def test_sweep_settings_the_arguments_select():
    assert chunk.selected_settings(chunk.arguments([])) is None
    assert chunk.selected_settings(chunk.arguments(["--sweep"])) == chunk.SWEEP
    only = chunk.selected_settings(chunk.arguments(["--sweep", "segment_programs"]))
    assert only == [s for s in chunk.SWEEP if set(s) == {"segment_programs"}] and len(only) >= 2
    # a setting of two knobs runs only where both are named
    stages = chunk.selected_settings(chunk.arguments(["--sweep", "state_stages"]))
    assert {"state_stages": 2} in stages and all(set(s) == {"state_stages"} for s in stages)
    both = chunk.selected_settings(chunk.arguments(["--sweep", "state_stages", "state_bwd_stages"]))
    assert {"state_stages": 2, "state_bwd_stages": 2} in both


def test_a_knob_no_setting_touches_is_refused(capsys):
    with pytest.raises(SystemExit):
        chunk.arguments(["--sweep", "no_such_knob"])
    assert "no setting touches ['no_such_knob']" in capsys.readouterr().err


def test_a_row_index_out_of_range_is_refused(capsys):
    with pytest.raises(SystemExit):
        chunk.arguments(["--rows", "0", "4"])
    assert "--rows: indices 0-3, got [0, 4]" in capsys.readouterr().err


def test_results_of_a_run_cut_short_list_the_rows_not_run():
    env = {"date": "2026-12-02T00:00:00"}
    rows = [{"shape": "s", "impl": "triton", "fwd_ms": 1.0, "fwd_bwd_ms": 4.0}]
    payload = chunk.results_payload(env, rows, [], [], pending=[(1, 32768, 16, 32, 128, True)])
    assert payload["not_run"] == [[1, 32768, 16, 32, 128, True]] and payload["rows"] == rows
    assert "not_run" not in chunk.results_payload(env, rows, [], [], pending=[])


def test_rows_compared_with_their_peers_per_shape():
    rows = [
        {"shape": "a", "impl": "triton", "fwd_ms": 1.0, "fwd_bwd_ms": 4.0},
        {"shape": "a", "impl": "flashqla", "fwd_ms": 0.5, "fwd_bwd_ms": 2.0},
        {"shape": "b", "impl": "triton", "fwd_ms": 3.0, "fwd_bwd_ms": 9.0},
    ]
    kernels = [
        {"shape": "a", "impl": "triton", "ms": 1.5},
        {"shape": "a", "impl": "triton", "ms": 0.5},
        {"shape": "a", "impl": "flashqla", "ms": 1.0},
    ]
    a, peer, b = chunk.compared(rows, kernels)
    assert (a["kernel_ms"], peer["kernel_ms"]) == (2.0, 1.0)
    assert (a["fwd_vs_flashqla"], a["fwd_bwd_vs_flashqla"], a["kernel_vs_flashqla"]) == (2.0, 2.0, 2.0)
    assert "fwd_vs_flashqla" not in b and "kernel_ms" not in b  # no peer, no profile for that shape
    assert "kernel_ms" not in rows[0]  # the rows handed in are left as they were
