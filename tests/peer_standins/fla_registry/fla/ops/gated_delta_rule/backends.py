"""Stand-in: fla 0.6.0's FlashQLA backend for the chunk op (priority 3, on by default, FLA_FLASH_QLA)."""

import torch

from fla.backends import BaseBackend, register
from fla.utils import IS_NVIDIA_HOPPER


@register("gated_delta_rule")
class FlashQLABackend(BaseBackend):
    backend_type = "flash_qla"
    package_name = "flash_qla"
    env_var = "FLA_FLASH_QLA"
    default_enable = True
    priority = 3

    def chunk_gated_delta_rule_verifier(self, q, k, v, g, beta, **kwargs):
        if not IS_NVIDIA_HOPPER:
            return False, "FlashQLA requires NVIDIA SM90, SM100/SM103 or SM120"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return False, f"FlashQLA requires dtype float16 or bfloat16, got {q.dtype}"
        if q.shape[-1] != 128 or v.shape[-1] != 128:
            return False, "FlashQLA requires K=V=128"
        return True, None

    def chunk_gated_delta_rule(self, *args, **kwargs):
        import flash_qla

        return flash_qla.chunk_gated_delta_rule(*args, **kwargs)
