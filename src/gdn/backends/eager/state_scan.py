"""The chunk-to-chunk state pass as one autograd Function.

Between chunks the state follows a linear recurrence S_out = M S_in + c, with M [K, K] and
c [K, V] per (chunk, value head) computed in batch beforehand. Written as autograd ops, each of
the T / 64 steps would cost several kernel launches forward and backward and keep a copy of every
state; here forward is one batched matmul per step writing straight into the buffer of entering
states, and backward is one per step the other way (dS_in = dS_in_direct + M^T dS_out), with dM
taken for all chunks in one matmul afterwards.

Steps follow the BlockPlan: at step j the first active[j] sorted sequences run, reading chunk slots
[step_offsets[j], + active[j]); a sequence that runs no further step leaves its state in `final`.
"""

from __future__ import annotations

import torch

from gdn.backends.eager._blocks import BlockPlan


def _bounds(plan: BlockPlan, heads: int) -> list[tuple[int, int, int]]:
    """(first row, running count, next step's running count) per step, rows = slot * heads."""
    nxt = [*plan.active[1:], 0]
    return [(off * heads, a, n) for off, a, n in zip(plan.step_offsets, plan.active, nxt, strict=True)]


class StateScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, M, c, start, plan: BlockPlan):
        chunks, heads, K, V = c.shape
        M3, c3 = M.reshape(-1, K, K), c.reshape(-1, K, V)
        entering = c.new_empty(chunks, heads, K, V)
        final = start.clone()
        s3, f3 = entering.view(-1, K, V), final.view(-1, K, V)
        steps = _bounds(plan, heads)
        if steps:
            s3[: steps[0][1] * heads] = f3[: steps[0][1] * heads]
        for j, (row, a, n) in enumerate(steps):
            rows = slice(row, row + a * heads)
            if n == a:  # nobody finishes: write straight into the next step's entering slots
                nrow = steps[j + 1][0]
                torch.baddbmm(c3[rows], M3[rows], s3[rows], out=s3[nrow : nrow + n * heads])
                continue
            leaving = torch.baddbmm(c3[rows], M3[rows], s3[rows])
            if n:
                nrow = steps[j + 1][0]
                s3[nrow : nrow + n * heads] = leaving[: n * heads]
            f3[n * heads : a * heads] = leaving[n * heads :]
        ctx.save_for_backward(M, entering)
        ctx.plan = plan
        return entering, final

    @staticmethod
    def backward(ctx, d_entering, d_final):
        M, entering = ctx.saved_tensors
        heads, K, V = entering.shape[1:]
        M3, de3, df3 = M.reshape(-1, K, K), d_entering.reshape(-1, K, V), d_final.reshape(-1, K, V)
        d_leaving = torch.empty_like(entering)  # gradient w.r.t. each step's output state
        dl3 = d_leaving.view(-1, K, V)
        d_start = d_final.clone()
        ds3 = d_start.view(-1, K, V)
        steps = _bounds(ctx.plan, heads)
        for j in range(len(steps) - 1, -1, -1):
            row, a, n = steps[j]
            rows = slice(row, row + a * heads)
            if n < a:  # sequences whose last chunk this is: their output is the final state
                dl3[row + n * heads : row + a * heads] = df3[n * heads : a * heads]
            # The entering state's gradient is the previous step's output gradient (or d_start).
            if j:
                prow = steps[j - 1][0]
                target = dl3[prow : prow + a * heads]
            else:
                target = ds3[: a * heads]
            torch.baddbmm(de3[rows], M3[rows].transpose(1, 2), dl3[rows], out=target)
        d_M = d_leaving @ entering.transpose(-1, -2)
        return d_M, d_leaving, d_start, None
