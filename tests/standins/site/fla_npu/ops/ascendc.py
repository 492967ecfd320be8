"""STAND-IN for fla_npu.ops.ascendc (tests/standins), NOT the real module.

26.6: thin wrappers that forward to torch.ops.npu, as the real 26.6 module does. 26.10: the raw ops
as plain functions computing through standins.kernels_*, each held to its stable contract
(gdn.backends.ascendc.contracts, through standins.conform), plus npu_causal_conv1d_fn, the recurrent
op and, in the composite profile, npu_chunk_gated_delta_rule_fwd. The broken-conv profiles reproduce
the 26.10 dev wheel's stable conv: zeros for all-ones input, large garbage otherwise.
"""

import torch

from fla_npu import PROFILE
from standins import broken, legacy, support

__gdn_stand_in__ = PROFILE.label


def _forwarding(name):
    def call(*args, **kwargs):
        return getattr(torch.ops.npu, name)(*args, **kwargs)

    call.__name__ = name
    return call


if not PROFILE.decoupled:
    for _name in legacy.SCHEMAS:
        globals()[_name] = _forwarding(_name)
else:
    globals().update(support.stable_ops(composite=PROFILE.composite))
    if PROFILE.broken_conv:
        npu_causal_conv1d = npu_causal_conv1d_fn = broken.dev_wheel
