"""Stand-in: fla 0.6.0's TileLang backend for the gated chunk_bwd_dqkwg, on by default on Hopper with
Triton >= 3.4 (where fla's Triton kernel is wrong), available when tilelang and nvcc are. Its verifier is
fla's (it accepts an fp32 call: h in q's dtype). Its kernel is a WRONG one on purpose, dg 20% too large,
so that a comparison that runs through it fails: the tests follow that failure to this sub-function."""

from fla.backends import BaseBackend, register
from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, has_usable_nvcc


@register("common")
class CommonTileLangBackend(BaseBackend):
    backend_type = "tilelang"
    package_name = "tilelang"
    env_var = "FLA_TILELANG"
    default_enable = IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0

    @classmethod
    def is_available(cls) -> bool:
        return super().is_available() and has_usable_nvcc()

    def chunk_bwd_dqkwg_verifier(self, q, k, v, do, h, dh, g=None, **kwargs):
        if g is None:
            return False, "TileLang backend only supports gated case (g != None)"
        if h.dtype != q.dtype:
            return False, "TileLang backend requires h.dtype == q.dtype"
        return True, None

    def chunk_bwd_dqkwg(self, *args, dg, **kwargs):
        return None, None, None, dg * 1.2
