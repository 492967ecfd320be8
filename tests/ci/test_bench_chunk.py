"""bench.chunk's row and sweep selection (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
from bench import chunk

pytestmark = pytest.mark.tooling


def test_rows_the_arguments_select():
    dense_first = (1, 8192, 16, 32, 128, 0)
    assert chunk.selected_rows(chunk.arguments([]))[0] == dense_first
    assert chunk.selected_rows(chunk.arguments([])) == chunk.ROWS
    assert chunk.selected_rows(chunk.arguments(["--quick"])) == [dense_first]
    # the rows' indices as they were before 4 and 5 came: 3 the packed row of 64 sequences
    assert chunk.selected_rows(chunk.arguments(["--rows", "3"])) == [(1, 32768, 16, 32, 128, 64)]
    assert chunk.selected_rows(chunk.arguments(["--rows", "4", "5"])) == [
        (1, 65536, 16, 32, 128, 0),
        (1, 65536, 16, 32, 128, 512),
    ]
    rank = ["--shape", "1", "32768", "2", "4", "128"]
    assert chunk.selected_rows(chunk.arguments(rank)) == [(1, 32768, 2, 4, 128, 0)]
    assert chunk.selected_rows(chunk.arguments([*rank, "--rows", "0"])) == [dense_first, (1, 32768, 2, 4, 128, 0)]


def test_the_split_flag_selects_its_rows_and_settings():
    """--split: few-sequence rows at the model's and one rank's heads, under the rule, never, and forced
    (the SM count the rule reads) at two and four programs an SM."""
    args = chunk.arguments(["--split"])
    rows = chunk.selected_rows(args)
    assert {(B, T) for B, T, *_ in rows} == {(1, 32768), (1, 65536), (2, 16384)}
    assert {(H, HV) for _, _, H, HV, _, _ in rows} == {(16, 32), (4, 8), (2, 4)} and len(rows) == 9
    settings = chunk.selected_settings(args)
    assert settings[0] == {} and {"segment_programs": 0} in settings
    assert [s.get("segment_programs", 2) for s in settings if "sms" in s] == [2, 4]


def test_overrides_set_the_knobs_and_the_sm_count_and_restore_them(monkeypatch):
    pytest.importorskip("triton", reason="the knobs are the triton backend's tiling config")
    from gdn.backends.triton.common import config

    monkeypatch.setattr(config, "OVERRIDES", {"state_bv": 32})
    counted = config.processors
    with chunk.overrides({"sms": 1000, "segment_programs": 4}):
        assert config.OVERRIDES == {"segment_programs": 4}
        assert config.processors("cuda") == 1000
    assert config.OVERRIDES == {"state_bv": 32} and config.processors is counted


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
        chunk.arguments(["--rows", "0", "6"])
    assert "--rows: indices 0-5, got [0, 6]" in capsys.readouterr().err


def test_results_of_a_run_cut_short_list_the_rows_not_run():
    env = {"date": "2026-12-02T00:00:00"}
    rows = [{"shape": "s", "impl": "triton", "fwd_ms": 1.0, "fwd_bwd_ms": 4.0}]
    payload = chunk.results_payload(env, rows, [], [], pending=[(1, 32768, 16, 32, 128, 64)])
    assert payload["not_run"] == [[1, 32768, 16, 32, 128, 64]] and payload["rows"] == rows
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


def test_a_forward_only_peer_is_compared_by_its_forward():
    """FlashInfer has no backward: gdn's forward+backward is not divided by its forward, and gdn's forward
    kernels (profiled alone) are set against its kernels."""
    rows = [
        {"shape": "a", "impl": "triton", "fwd_ms": 1.0, "fwd_bwd_ms": 4.0},
        {"shape": "a", "impl": "flashinfer", "fwd_ms": 0.5},
    ]
    kernels = [
        {"shape": "a", "impl": "triton", "ms": 4.0},
        {"shape": "a", "impl": "triton-forward", "ms": 0.9},
        {"shape": "a", "impl": "flashinfer", "ms": 0.45},
    ]
    row, _ = chunk.compared(rows, kernels)
    assert row["fwd_vs_flashinfer"] == 2.0 and "fwd_bwd_vs_flashinfer" not in row
    assert "kernel_vs_flashinfer" not in row  # forward+backward kernels against a forward's: not a ratio
    assert (row["fwd_kernel_ms"], row["fwd_kernel_vs_flashinfer"]) == (0.9, 2.0)


def test_flashinfer_is_called_packed_with_the_gate_as_a_factor(monkeypatch):
    """FlashInfer's GDN prefill takes [T, heads, D] with cu_seqlens, the gate as exp(g) and beta in fp32:
    a dense batch goes as B sequences of T, and its output comes back as [B, T, HV, V]."""
    import sys
    import types

    import torch

    seen = {}

    def prefill(q, k, v, g, beta, *, cu_seqlens, use_qk_l2norm_in_kernel):
        seen.update(q=q.shape, v=v.shape, g=g, beta=beta.dtype, cu=cu_seqlens.tolist(), l2norm=use_qk_l2norm_in_kernel)
        return torch.zeros(v.shape)

    package = types.ModuleType("flashinfer")
    package.gdn_prefill = types.SimpleNamespace(chunk_gated_delta_rule=prefill)
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", package.gdn_prefill)
    run = chunk.flashinfer_impl()
    q, k = torch.randn(2, 5, 1, 8), torch.randn(2, 5, 1, 8)
    v, g, beta = torch.randn(2, 5, 2, 8), -torch.rand(2, 5, 2), torch.rand(2, 5, 2).bfloat16()
    o, final = run(q, k, v, g, beta)
    assert o.shape == (2, 5, 2, 8) and final is None
    assert seen["q"] == (10, 1, 8) and seen["v"] == (10, 2, 8) and seen["cu"] == [0, 5, 10]
    assert torch.equal(seen["g"], g.reshape(10, 2).exp()) and seen["beta"] == torch.float32 and seen["l2norm"]
    run(q[:1], k[:1], v[:1], g[:1], beta[:1], cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32))
    assert seen["cu"] == [0, 2, 5]
