"""The `ascendc` backend: chunk_gated_delta_rule (forward and backward), causal_conv1d_fn (forward
and backward) and the recurrent decode ops on fla_npu's AscendC kernels, on Ascend NPUs.

Routes (resolved once per process, recorded per op, see routes.py): "ascendc:stable-api" (fla_npu
26.10 `fla_npu.ops.ascendc`), "ascendc:legacy-torch-ops" (the torch.ops.npu ops of 26.6, or of 26.10
with its legacy extension) and, for the chunk op, "ascendc:composite-fwd" (26.10's composite forward
with the decomposed backward). Nothing is imported from torch_npu or fla_npu until the backend is
first asked to serve.
"""

from __future__ import annotations

from gdn.backends.ascendc.backend import AscendcBackend

__all__ = ["AscendcBackend"]
