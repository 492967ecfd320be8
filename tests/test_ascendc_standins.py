"""The stand-in kernels refuse what the AscendC ops refuse. The adapter tests prove the plumbing only
because of this: an adapter that passed fp32 operands, a device tensor for an int[] host list, an empty
sequence or chunk indices that disagree with cu_seqlens would fail there as it fails on the NPU."""

from __future__ import annotations

import pytest
import torch

from standins import kernels_chunk, kernels_conv, kernels_recurrent

pytestmark = pytest.mark.single_op

B, H, HV, T, K, V = 1, 2, 4, 70, 32, 32


def head_first(dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, T, K, generator=gen).to(dtype)
    w = torch.randn(B, HV, T, K, generator=gen).to(dtype)
    u = torch.randn(B, HV, T, V, generator=gen).to(dtype)
    g = -torch.rand(B, HV, T, generator=gen)
    return k, w, u, g


def test_fp32_operands_are_refused():
    with pytest.raises(TypeError, match="k must be bfloat16 or float16"):
        kernels_chunk.npu_chunk_gated_delta_rule_fwd_h(*head_first(torch.float32), chunk_size=64)


def test_a_device_tensor_is_not_a_host_list():
    with pytest.raises(TypeError, match="cu_seqlens must be a host list of ints"):
        kernels_chunk.npu_chunk_gated_delta_rule_fwd_h(*head_first(), chunk_size=64, cu_seqlens=torch.tensor([0, T]))


def test_empty_sequences_are_refused():
    with pytest.raises(RuntimeError, match=r"seqlens\[2\] should be larger than seqlens\[1\]"):
        kernels_chunk.npu_chunk_gated_delta_rule_fwd_h(*head_first(), chunk_size=64, cu_seqlens=[0, 30, 30, T])


def test_chunk_indices_must_match_cu_seqlens():
    with pytest.raises(RuntimeError, match="do not match cu_seqlens"):
        kernels_chunk.npu_chunk_gated_delta_rule_fwd_h(
            *head_first(), chunk_size=64, cu_seqlens=[0, 30, T], chunk_indices=[0, 0, 1, 1]
        )


def test_composite_refuses_shapes_it_does_not_support():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, 64, generator=gen).bfloat16()
    v = torch.randn(B, T, HV, 128, generator=gen).bfloat16()
    g, beta = -torch.rand(B, T, HV, generator=gen), torch.rand(B, T, HV, generator=gen)
    with pytest.raises(RuntimeError, match=r"supports K = 128 and V in \{128, 256\}"):
        kernels_chunk.npu_chunk_gated_delta_rule_fwd(q, q, v, g, beta, layout="BSND")


def test_conv_fn_host_twins_must_agree_with_the_device_metadata():
    x = torch.randn(10, 8).bfloat16()
    with pytest.raises(RuntimeError, match="disagrees"):
        kernels_conv.npu_causal_conv1d_fn(
            x,
            torch.randn(4, 8).bfloat16(),
            None,
            query_start_loc=torch.tensor([0, 4, 10]),
            query_start_loc_cpu=[0, 5, 10],
        )


def test_recurrent_takes_bf16_only():
    q = torch.randn(3, 1, 16, dtype=torch.float16)
    state = torch.zeros(1, 1, 16, 16)
    with pytest.raises(TypeError, match="query dtype"):
        kernels_recurrent.npu_recurrent_gated_delta_rule(
            q,
            q,
            q,
            state,
            beta=torch.ones(3, 1).bfloat16(),
            actual_seq_lengths=torch.tensor([0, 3], dtype=torch.int32),
            ssm_state_indices=torch.zeros(3, dtype=torch.int32),
            g=torch.zeros(3, 1),
        )
