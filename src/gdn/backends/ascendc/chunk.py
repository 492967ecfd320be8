"""chunk_gated_delta_rule on fla_npu's AscendC ops: the decomposed forward (three AscendC ops after
the torch chunk helpers) or the 26.10 composite forward, and one decomposed backward for both.

The decomposed chain is head-first ([B, H, T, D], g and beta [B, HV, T]); its forward transposes once
and saves exactly the head-first tensors the backward consumes (q, k, v, the cumulated gate, beta, A
and the initial state), so the backward recomputes w, u, h and v_new without another copy. The
composite forward is layout-native (token-major in, o token-major out) and returns the cumulated gate
and A itself; it saves the token-major inputs with those two, and the backward makes the head-first
copies the decomposed forward would have made. Nothing else is saved in either case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gdn._validate import GdnShapes
from gdn.backends.ascendc import chunk_prep, contracts
from gdn.backends.ascendc.knobs import kernel_dtype
from gdn.backends.ascendc.layout import CHUNK, Sequences, sequences
from gdn.backends.ascendc.raw import CHUNK_OPS, COMPOSITE_FWD, RawOps
from gdn.backends.eager.gated_delta import l2norm_fp32
from gdn.calls import GdnCall
from gdn.gates import floored

OP = "chunk_gated_delta_rule"
FWD_H = "npu_chunk_gated_delta_rule_fwd_h"
BWD_DHU = "npu_chunk_gated_delta_rule_bwd_dhu"
# dh0 and h laid out as the math below indexes them
STATE_AXES = "B HV NT K V"


@dataclass(frozen=True)
class ChunkKernels:
    """The AscendC ops of one route, bound once; `composite` is None when it is not used."""

    recompute_w_u: Callable
    fwd_h: Callable
    fwd_o: Callable
    bwd_dv_local: Callable
    bwd_dhu: Callable
    bwd_dqkwg: Callable
    wy_bwd_da: Callable
    wy_bwd_full: Callable
    route: str
    composite: Callable | None = None

    @classmethod
    def bind(cls, ops: RawOps, composite: RawOps | None = None) -> ChunkKernels:
        chain = [ops.get(name) for name in CHUNK_OPS]
        return cls(*chain, route=ops.route, composite=None if composite is None else composite.get(COMPOSITE_FWD))

    def contract(self, op: str) -> contracts.Contract:
        return contracts.contract(self.route, op)

    @property
    def dh_axes(self) -> str:
        return self.contract(BWD_DHU).output("dh").layout or STATE_AXES

    @property
    def final_needs_state(self) -> bool:
        """Whether fwd_h returns the final state in fp32 only when given one (26.6: k's dtype else)."""
        rule = self.contract(FWD_H).output("final_state").dtype or ""
        return contracts.output_dtype(rule, {"k": torch.empty(0, dtype=torch.bfloat16)}) != torch.float32

    def refusal(self, shapes: GdnShapes, final_needs_grad: bool) -> str | None:
        """Why this route cannot serve a call: a shape outside the chain's limits, or a gradient on the
        final state, which bwd_dhu drops on every fla_npu that predates fla_npu #312."""
        limits = contracts.refusal(self.route, (BWD_DHU,), {"K": shapes.K, "V": shapes.V})
        if limits:
            return limits
        if final_needs_grad and "dht" in self.contract(BWD_DHU).ignored:
            return f"{BWD_DHU} ignores dht on this fla_npu: the final state cannot carry a gradient"
        return None


@dataclass(frozen=True)
class _Run:
    kernels: ChunkKernels
    seqs: Sequences
    scale: float
    want_final: bool


def _forward_chain(kernels: ChunkKernels, lists: dict, k, v, g, beta, A, h0, want_final: bool):
    """w, u, then the state pass: (h, v_new, final)."""
    w, u = kernels.recompute_w_u(k, v, beta, A, CHUNK, g=g, **lists)
    h, v_new, final = kernels.fwd_h(
        k, w, u, g, initial_state=h0, output_final_state=want_final, chunk_size=CHUNK, **lists
    )
    return w, h, v_new, final


def _head_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).contiguous()


def _initial_state_grad(run: _Run, q, k, w, g, do, dh, dv2) -> torch.Tensor:
    """dh0 in torch: bwd_dhu leaves it uninitialised (it reads neither h0 nor dht before fla_npu
    #312), but the gradient entering each sequence's first chunk follows from that chunk alone:
    dh0 = exp(g_last) dh + scale (q exp(g))^T do - w^T dv2, with dh the gradient leaving the chunk."""
    dh = contracts.permute(dh, run.kernels.dh_axes, STATE_AXES)
    group = g.shape[1] // q.shape[1]
    grads = []
    for row, index, start, length in run.seqs.first_chunks():
        span = slice(start, start + length)
        gc = g[row, :, span]
        qc = q[row, :, span].float().repeat_interleave(group, 0) * gc.exp().unsqueeze(-1)
        grads.append(
            dh[row, :, index].float() * gc[:, -1].exp()[:, None, None]
            + run.scale * qc.transpose(-1, -2) @ do[row, :, span].float()
            - w[row, :, span].float().transpose(-1, -2) @ dv2[row, :, span].float()
        )
    return torch.stack(grads)


def _backward(run: _Run, q, k, v, g, beta, A, h0, do):
    """Head-first saved tensors -> token-major (dq, dk, dv, dg, dbeta, dh0)."""
    kernels, lists, scale = run.kernels, run.seqs.host_lists(), run.scale
    do = _head_first(do.to(v.dtype))
    w, h, v_new, _ = _forward_chain(kernels, lists, k, v, g, beta, A, h0, want_final=False)
    dv = kernels.bwd_dv_local(q, k, do, g, scale, CHUNK, A=A, **lists)
    # h0 and dht are not passed: the kernel would read neither (see _initial_state_grad)
    dh, _, dv = kernels.bwd_dhu(q, k, w, do, dv, scale, CHUNK, g=g, **lists)
    dh0 = None if h0 is None else _initial_state_grad(run, q, k, w, g, do, dh, dv)
    dq, dk, dw, dg = kernels.bwd_dqkwg(q, k, v_new, g, h, do, dh, dv, CHUNK, scale=scale, **lists)
    dA = kernels.wy_bwd_da(k, v, beta, A, dw, dv, g, chunk_size=CHUNK, **lists)
    dk_wy, dv, dbeta, dg_wy = kernels.wy_bwd_full(k, v, beta, A, dA, dw, dv, g, CHUNK, **lists)
    dk = (dk.float() + dk_wy.float()).to(k.dtype)
    dg = (dg.float() + dg_wy.float()).transpose(1, 2)  # gradient of the cumulated gate, token-major
    slots, chunks = run.seqs.chunk_slots(dg.device)
    dg = chunk_prep.reverse_local_cumsum(dg.reshape(-1, dg.shape[-1]), slots, chunks).view_as(dg)
    grads = (dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), dg, dbeta.float().transpose(1, 2))
    return (*grads, None if h0 is None else dh0.to(h0.dtype))


class _Decomposed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, run: _Run):
        seqs = run.seqs
        slots, chunks = seqs.chunk_slots(q.device)
        B, T, HV = g.shape
        g_cum = chunk_prep.local_cumsum(g.reshape(B * T, HV), slots, chunks)
        A = chunk_prep.wy_inverse(k.reshape(B * T, *k.shape[2:]).float(), beta.reshape(B * T, HV), g_cum, slots, chunks)
        A = A.view(B, T, HV, CHUNK).transpose(1, 2).to(k.dtype).contiguous()
        q, k, v = _head_first(q), _head_first(k), _head_first(v)
        g_cum, beta = _head_first(g_cum.view(B, T, HV)), _head_first(beta)
        lists = seqs.host_lists()
        _, h, v_new, final = _forward_chain(run.kernels, lists, k, v, g_cum, beta, A, h0, run.want_final)
        o = run.kernels.fwd_o(q, k, v_new, h, run.scale, g=g_cum, chunk_size=CHUNK, **lists)
        ctx.save_for_backward(q, k, v, g_cum, beta, A, h0)
        ctx.run = run
        return o.transpose(1, 2), final if run.want_final else None

    @staticmethod
    def backward(ctx, do, _dfinal):
        # a final state that needs a gradient never reaches this route (ChunkKernels.refusal)
        grads = _backward(ctx.run, *ctx.saved_tensors, do)
        return (*grads, None)


class _Composite(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, run: _Run):
        # layout-native means dense BSND: callers' views (a transpose upstream) are laid out first
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        outputs = run.kernels.composite(
            q,
            k,
            v,
            g,
            beta,
            initial_state=h0,
            output_final_state=run.want_final,
            chunk_size=CHUNK,
            scale=run.scale,
            layout="BSND",
            use_exp2=False,
            use_qk_l2norm_in_kernel=False,
            use_gate_in_kernel=False,
            use_beta_sigmoid_in_kernel=False,
            disable_recompute=True,
            return_intermediate_states=False,
            state_v_first=False,
            **run.seqs.host_lists(),
        )
        o, final, g_cum, A = outputs[:4]
        if g_cum is None or A is None:
            raise RuntimeError(
                f"{COMPOSITE_FWD} returned no g_cumsum / A although disable_recompute=True: this fla_npu's "
                "composite contract differs from the 26.10 one the adapter follows; set GDN_NPU_FUSED_FWD=0"
            )
        ctx.save_for_backward(q, k, v, g_cum, beta, A, h0)
        ctx.run = run
        return o, final if run.want_final else None

    @staticmethod
    def backward(ctx, do, _dfinal):
        q, k, v, g_cum, beta, A, h0 = ctx.saved_tensors
        heads = (_head_first(x) for x in (q, k, v, g_cum, beta))
        grads = _backward(ctx.run, *heads, A, h0, do)
        return (*grads, None)


def _final_needs_grad(call: GdnCall) -> bool:
    return call.output_final_state and torch.is_grad_enabled() and any(t.requires_grad for t in call.tensors())


def refusal_of(kernels: ChunkKernels) -> Callable[[GdnCall], str | None]:
    """Why the route cannot take one validated call of the chunk op, or None."""

    def refusal(call: GdnCall) -> str | None:
        return kernels.refusal(call.shapes, _final_needs_grad(call))

    return refusal


def make_chunk_gated_delta_rule(kernels: ChunkKernels) -> Callable:
    def chunk_gated_delta_rule(call: GdnCall):
        q, k, v, g, beta, shapes = call.q, call.k, call.v, call.g, call.beta, call.shapes
        initial_state, output_final_state = call.initial_state, call.output_final_state
        reason = kernels.refusal(shapes, _final_needs_grad(call))
        if reason is not None:
            # gdn.resolve hands such calls to the next backend (refusal_of below): only a direct call
            # gets here, and it must not silently lose a gradient or reach a kernel outside its limits
            raise contracts.ContractError(f"{OP}: the ascendc chunk route cannot take this call: {reason}")
        seqs = sequences(shapes.B, shapes.T, call.cu_seqlens)
        if call.use_qk_l2norm_in_kernel:
            q, k = l2norm_fp32(q), l2norm_fp32(k)
        dtype = kernel_dtype(v.dtype)
        h0 = None
        if initial_state is not None:
            h0 = initial_state.float()
            if seqs.drops_any:
                h0 = h0.index_select(0, seqs.kept_index(h0.device))
        elif output_final_state and kernels.final_needs_state:
            h0 = q.new_zeros(len(seqs.kept), shapes.HV, shapes.K, shapes.V, dtype=torch.float32)
        run = _Run(kernels, seqs, call.scale, output_final_state)
        function = _Composite if kernels.composite is not None else _Decomposed
        # the chain sums gates per chunk: a -inf gate is raised to the floor first (gdn.gates)
        gates = floored(g.float())
        o, final = function.apply(q.to(dtype), k.to(dtype), v.to(dtype), gates, beta.float(), h0, run)
        o = o.to(v.dtype)
        if not output_final_state or not seqs.drops_any:
            return o, final
        # an empty sequence passes its state through untouched
        start = initial_state.float() if initial_state is not None else final.new_zeros(shapes.N, *final.shape[1:])
        return o, start.index_copy(0, seqs.kept_index(final.device), final)

    return chunk_gated_delta_rule
