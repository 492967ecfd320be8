"""STAND-IN for torch_npu (tests/standins), NOT the real package: there is no NPU here.

It declares __gdn_stand_in_device__ = "cpu", the one signal on which the ascendc and torch_npu
backends serve cpu tensors in an NPU's place. With GDN_STAND_IN_TORCH_NPU=missing-cann its import fails
the way the real one does on a machine without CANN.

`npu_chunk_gated_delta_rule` stands in for torch_npu's fused CANN op: it checks its arguments against
the op's contract (gdn.backends.torch_npu_chunk.CONTRACT: required arguments, layouts, dtypes, limits),
computes the recurrence in fp32 with gdn's eager op and returns bf16, as the op's contract says.
"""

import os
import types

import torch

from standins import profiles

if os.environ.get(profiles.TORCH_NPU_ENV) == "missing-cann":
    raise ImportError(
        "libhccl.so: cannot open shared object file: No such file or directory. "
        "Please check that the cann package is installed. Please run 'source set_env.sh' in the CANN installed path."
    )

__gdn_stand_in__ = "torch_npu stand-in (cpu stands in for the NPU)"
__gdn_stand_in_device__ = "cpu"

# the real torch_npu adds torch.npu; no NPU is visible here
torch.npu = types.SimpleNamespace(device_count=lambda: 0, is_available=lambda: False)
__version__ = "2.10.0.post4+standin"
CALLS = []  # every npu_chunk_gated_delta_rule call's arguments, for the adapter's tests


def npu_chunk_gated_delta_rule(
    query, key, value, *, beta=None, initial_state=None, actual_seq_lengths=None, scale=None, g=None
):
    from standins.fused_chunk import run_fused_chunk

    CALLS.append(dict(query=query, key=key, value=value, beta=beta, initial_state=initial_state,
                      actual_seq_lengths=actual_seq_lengths, scale=scale, g=g))  # fmt: skip
    return run_fused_chunk(query, key, value, beta, initial_state, actual_seq_lengths, scale, g)
