"""The stand-in kernels refuse what the AscendC ops refuse. The adapter tests prove the plumbing only
because of this: an adapter that passed fp32 operands, a device tensor for an int[] host list, an empty
sequence or chunk indices that disagree with cu_seqlens would fail there as it fails on the NPU. The
interface checks come from the op contracts (standins.conform), so they are asked of the ops a
generation exposes (standins.support.stable_ops); the math kernels check what the math needs."""

from __future__ import annotations

import pytest
import torch

from gdn.backends.ascendc.contracts import ContractError
from standins import kernels_chunk
from standins.support import stable_ops

pytestmark = pytest.mark.single_op

B, H, HV, T, K, V = 1, 2, 4, 70, 128, 128
OPS = stable_ops()


def head_first(dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(B, H, T, K, generator=gen).to(dtype)
    w = torch.randn(B, HV, T, K, generator=gen).to(dtype)
    u = torch.randn(B, HV, T, V, generator=gen).to(dtype)
    g = -torch.rand(B, HV, T, generator=gen)
    return k, w, u, g


def test_fp32_operands_are_refused():
    with pytest.raises(ContractError, match=r"k must be half \(torch.bfloat16, torch.float16\), got torch.float32"):
        OPS["npu_chunk_gated_delta_rule_fwd_h"](*head_first(torch.float32), chunk_size=64)


def test_a_device_tensor_is_not_a_host_list():
    with pytest.raises(ContractError, match=r"cu_seqlens must be a host list of ints \(int\[\]\), got Tensor"):
        OPS["npu_chunk_gated_delta_rule_fwd_h"](*head_first(), chunk_size=64, cu_seqlens=torch.tensor([0, T]))


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


def test_conv_fn_device_metadata_and_its_host_twin_are_mutually_exclusive():
    x = torch.randn(10, 16).bfloat16()
    with pytest.raises(ContractError, match="query_start_loc and query_start_loc_cpu are mutually exclusive"):
        OPS["npu_causal_conv1d_fn"](
            x,
            torch.randn(4, 16).bfloat16(),
            None,
            query_start_loc=torch.tensor([0, 4, 10]),
            query_start_loc_cpu=[0, 4, 10],
        )


def test_recurrent_takes_bf16_only():
    q = torch.randn(3, 1, 128, dtype=torch.float16)
    state = torch.zeros(1, 1, 128, 128)
    with pytest.raises(ContractError, match=r"query must be bf16 \(torch.bfloat16\), got torch.float16"):
        OPS["npu_recurrent_gated_delta_rule"](
            q,
            q,
            q,
            state,
            beta=torch.ones(3, 1).bfloat16(),
            actual_seq_lengths=torch.tensor([0, 3], dtype=torch.int32),
            ssm_state_indices=torch.zeros(3, dtype=torch.int32),
            g=torch.zeros(3, 1),
        )
