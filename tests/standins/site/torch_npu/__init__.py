"""STAND-IN for torch_npu (tests/standins), NOT the real package: there is no NPU here.

It declares __gdn_stand_in_device__ = "cpu", the one signal on which the ascendc backend serves cpu
tensors in an NPU's place. With GDN_STAND_IN_TORCH_NPU=missing-cann its import fails the way the
real one does on a machine without CANN.
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
