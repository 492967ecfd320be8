"""The cheap chunk-local steps around the AscendC chain, in torch: the chunk-local cumsum of the
gate, the WY matrix A = (I + L)^-1 with L_ij = beta_i k_i.k_j exp(g_i - g_j) (j < i), and the reverse
cumsum that turns the gradient of the cumulated gate into the gate's. (xtuner runs these three as
Triton helpers; torch keeps them identical on both fla_npu generations.) Tensors are token-major
with rows flattened, [tokens, heads, ...]; `slots` places each token in its chunk (layout.py).
"""

from __future__ import annotations

import torch

from gdn.backends.ascendc.layout import CHUNK


def to_chunks(x: torch.Tensor, slots: torch.Tensor, chunks: int) -> torch.Tensor:
    """[tokens, ...] -> [chunks, CHUNK, ...], zero-padded."""
    padded = x.new_zeros((chunks * CHUNK, *x.shape[1:])).index_copy(0, slots, x)
    return padded.view(chunks, CHUNK, *x.shape[1:])


def from_chunks(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:]).index_select(0, slots)


def local_cumsum(g: torch.Tensor, slots: torch.Tensor, chunks: int) -> torch.Tensor:
    return from_chunks(to_chunks(g, slots, chunks).cumsum(1), slots)


def reverse_local_cumsum(dg: torch.Tensor, slots: torch.Tensor, chunks: int) -> torch.Tensor:
    """d/dg_s of a loss over G_t = sum of g over the chunk up to t: the sum of dG_t for t >= s."""
    return from_chunks(to_chunks(dg, slots, chunks).flip(1).cumsum(1).flip(1), slots)


def wy_inverse(
    k: torch.Tensor, beta: torch.Tensor, g_cum: torch.Tensor, slots: torch.Tensor, chunks: int
) -> torch.Tensor:
    """k [tokens, H, K], beta and g_cum [tokens, HV] (fp32) -> each token's row of its chunk's
    (I + L)^-1, [tokens, HV, CHUNK]. Padding tokens have k = 0, so their rows and columns are zero."""
    group = beta.shape[1] // k.shape[1]
    kc = to_chunks(k, slots, chunks).transpose(1, 2)  # [chunks, H, C, K]
    kk = (kc @ kc.transpose(-1, -2)).repeat_interleave(group, dim=1)  # [chunks, HV, C, C]
    gc = to_chunks(g_cum, slots, chunks).transpose(1, 2)  # [chunks, HV, C]
    bc = to_chunks(beta, slots, chunks).transpose(1, 2)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=k.device).tril(-1)
    # masked before exp: the upper triangle's positive differences must not overflow
    decay = torch.where(lower, gc.unsqueeze(-1) - gc.unsqueeze(-2), float("-inf")).exp()
    eye = torch.eye(CHUNK, dtype=k.dtype, device=k.device)
    system = eye + kk * decay * bc.unsqueeze(-1)
    inverse = torch.linalg.solve_triangular(system, eye.expand_as(system), upper=False, unitriangular=True)
    return from_chunks(inverse.transpose(1, 2), slots)
