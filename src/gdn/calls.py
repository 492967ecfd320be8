"""The GDN ops, each declared here once with everything gdn needs of it: its spec (gdn.op_specs: the
arguments, outputs, gradients and what it writes in place), its call type, the build that validates a
call bound to the spec and makes the typed call every backend implementation takes (one dataclass per
op family: GdnCall, PoolDecodeCall, ConvCall, ConvUpdateCall, L2NormCall, GatingCall), and the numeric
probe's cases (gdn.probe_cases). Its public function (gdn.ops), its export (gdn), its custom ops and
fakes (gdn.library) and its eager table entry follow from the spec. Layout follows flash-linear-attention:
q, k [B, T, H, K]; v [B, T, HV, V] with HV a multiple of H; g (log-space decay) and beta [B, T, HV];
states [N, HV, K, V] in fp32. The public ops (gdn.ops) run these, then the backend gdn.resolve chose.

The op names are read from this file's `OpSpec(...)` declarations without importing it
(gdn.op_names), so configuration code lists them where torch is absent: a built-in op's spec is
declared here, its name a literal."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gdn import _validate as check
from gdn import op_specs
from gdn._validate import GdnShapes
from gdn.op_specs import Arg, CustomOp, OpSpec, Output, refused_feature
from gdn.probe_cases import CASES, Case, ProbeCases, ProbeClass


class Call:
    """A validated call, as every backend implementation of its op takes it. Built once per user call
    and not changed afterwards (plain slots, not frozen: a decode step builds one per token)."""

    __slots__ = ()

    @property
    def device(self) -> torch.device:
        return getattr(self, _field_names(type(self))[0]).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the call's first input (q, x, A_log): the one that picks a kernel's variant."""
        return getattr(self, _field_names(type(self))[0]).dtype

    def tensors(self) -> Iterator[torch.Tensor]:
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                yield value

    def public_result(self, result):
        """A backend's result as the public op returns it (backends compute in the contract's layout)."""
        return result


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# what a call binds each of its op's arguments to, in the spec's order (gdn.op_specs.OpSpec.bind)
Arguments = dict[str, Any]
PREPARE: dict[str, Callable[..., Call]] = {}


# validates a call's bound arguments (its op's spec, the arguments) and makes its call
Build = Callable[[OpSpec, Arguments], Call]
# the built-in ops' specs, in the order they are declared below
SPECS: list[OpSpec] = []


def define(spec: OpSpec, build: Build) -> Callable[..., Call]:
    """The op's prepare, registered in PREPARE: a call bound to its spec's arguments, its refused peer
    features checked, then `build` validates them and makes the call."""

    def prepare(*args: Any, **kwargs: Any) -> Call:
        arguments = spec.bind(args, kwargs)
        if len(arguments) != spec.kept:
            _refuse_features(spec, arguments)
        return build(spec, arguments)

    functools.update_wrapper(prepare, build)
    prepare.__name__ = prepare.__qualname__ = spec.name
    prepare.__signature__ = spec.signature()  # type: ignore[attr-defined]
    PREPARE[spec.name] = prepare
    return prepare


def builtin(spec: OpSpec, probe_cases: ProbeCases) -> Callable[[Build], Callable[..., Call]]:
    """Declares a built-in op: its spec, its build and its numeric probe's cases; the decorated build
    becomes the op's prepare (define), named like the op."""

    def declare(build: Build) -> Callable[..., Call]:
        op_specs.register(spec, built_in=True)
        SPECS.append(spec)
        CASES[spec.name] = probe_cases
        return define(spec, build)

    return declare


def _refuse_features(spec: OpSpec, arguments: Arguments) -> None:
    """The refused peer features a call names (OpSpec.bind), in the spec's order: each passes at its
    default and leaves the arguments; anything else is refused by name."""
    for arg in spec.refused:
        value = arguments.pop(arg.name, arg.default)
        if value is not arg.default:
            check.Checker(spec.name).unsupported(arg.name, value, arg.default, arg.refused)


def _dense(spec: OpSpec, arguments: Arguments) -> Arguments:
    """The small tensors (offsets, slot indices, flags, bias, conv weight, gate parameters) are read by
    the kernels as dense buffers without strides; one copy here serves every backend. The large
    operands and the state pools keep their strides: the kernels take those, and a pool is written in
    place."""
    for name in spec.dense:
        t = arguments[name]
        if t is not None:
            arguments[name] = t.contiguous()
    return arguments


def _made(cls: type[Call], arguments: Arguments) -> Call:
    """The call of type `cls` from the validated arguments (the call's own binding, free to change),
    to which validation added the fields it computed."""
    return cls(*_fields_of(cls)(arguments))


@functools.cache
def _fields_of(cls: type) -> Callable[[Arguments], tuple]:
    """A call type's fields, in its order, out of the arguments (one C call: every op call makes one)."""
    names = _field_names(cls)
    getter = operator.itemgetter(*names)
    return getter if len(names) > 1 else lambda arguments: (getter(arguments),)


def _key_first(state: torch.Tensor | None, state_v_first: bool) -> torch.Tensor | None:
    """A state in the contract's [.., K, V] layout: a [.., V, K] one (state_v_first) as its transposed
    view, no copy (the kernels take strides, and a pool is written in place through the view)."""
    return state.transpose(-1, -2) if state_v_first and state is not None else state


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _gdn_inputs(gen: torch.Generator, cls: ProbeClass, B: int, T: int) -> dict[str, torch.Tensor]:
    """The token tensors of a gated-delta probe case in the asking call's class."""
    H, HV, K, V = cls.H, cls.HV, cls.K, cls.V
    q, k = _randn(gen, B, T, H, K), _randn(gen, B, T, H, K)
    if not cls.l2norm:
        # a call that does not normalise in the kernel has normalised q and k before it (the state
        # of the delta rule grows without bound for |k| > 1: at K = 128 the outputs overflow)
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    return dict(
        q=q,
        k=k,
        v=_randn(gen, B, T, HV, V),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen),
    )


def _gdn_cases(grads: tuple[str, ...], decode_step: bool) -> ProbeCases:
    """The chunk and recurrent ops' probe cases: dense, packed, packed without the final state, and
    (`decode_step`) a decode step; `grads`: the inputs whose gradients are compared."""

    def cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
        HV, K, V = cls.HV, cls.K, cls.V
        dense = _gdn_inputs(gen, cls, 2, 80)
        if cls.initial_state:
            dense["initial_state"] = _randn(gen, 2, HV, K, V, scale=0.1)
        yield Case(
            "dense",
            dict(**dense, output_final_state=cls.final_state, use_qk_l2norm_in_kernel=cls.l2norm),
            tuple(name for name in grads if name in dense),
        )
        # Packed sequences in the same class: whether a call is packed is a runtime argument of a
        # compiled kernel, so these cases compile nothing the class's own call would not launch.
        lens = torch.tensor([0, 17, 17, 90, 130])
        varlen = dict(**_gdn_inputs(gen, cls, 1, 130), cu_seqlens=lens, use_qk_l2norm_in_kernel=cls.l2norm)
        states = {"initial_state": _randn(gen, 4, HV, K, V)} if cls.initial_state else {}
        yield Case(
            "varlen",
            dict(**varlen, **states, output_final_state=cls.final_state),
            tuple(name for name in grads if name in varlen or name in states),
        )
        if cls.final_state:
            # without the final state: the call a backend that cannot return the final state's gradient
            # still takes, where it refused the two above
            yield Case(
                "varlen_state_in",
                dict(
                    **_gdn_inputs(gen, cls, 1, 130),
                    cu_seqlens=lens,
                    initial_state=_randn(gen, 4, HV, K, V, scale=0.1),
                    use_qk_l2norm_in_kernel=cls.l2norm,
                ),
                grads,
                fallback=True,
            )
        if decode_step:
            # one token per sequence: a decode step, which a backend may serve by a path of its own
            yield Case(
                "step",
                dict(
                    **_gdn_inputs(gen, cls, 3, 1),
                    initial_state=_randn(gen, 3, HV, K, V, scale=0.1),
                    output_final_state=True,
                    use_qk_l2norm_in_kernel=cls.l2norm,
                ),
            )

    return cases


# the gated-delta ops

_GATED_TOKENS = (Arg("q"), Arg("k"), Arg("v"), Arg("g"))
_FLA_REFUSED = (
    refused_feature("use_beta_sigmoid_in_kernel", "bool", "beta = sigmoid(beta) in the kernel"),
    refused_feature("allow_neg_eigval", "bool", "beta scaled to (0, 2)"),
)
_IN_KERNEL_GATE = "the gate computed in the kernel"
_GDN_OUTPUTS = (Output("o", like="v"), Output("final_state", None, "float32", asked_by="output_final_state"))
_GDN_GRADS = ("q", "k", "v", "g", "beta", "initial_state")


_CHUNK_ARGS = (
    *_GATED_TOKENS,
    Arg("beta"),
    Arg("scale", "float", None),
    Arg("initial_state", "Tensor", None),
    Arg("output_final_state", "bool", False),
    Arg("cu_seqlens", "Tensor", None, True, dense=True),
    Arg("use_qk_l2norm_in_kernel", "bool", False, True),
    Arg("head_first", "bool", False, True, carried=False),
    *_FLA_REFUSED,
    Arg("state_v_first", "bool", False, True),
    refused_feature("cu_seqlens_cpu", "Tensor", "a host copy of cu_seqlens; pass cu_seqlens only"),
    refused_feature("chunk_indices", "Tensor", "precomputed chunk indices; they follow from cu_seqlens"),
    refused_feature("cp_context", "object", "context parallelism"),
)
_RECURRENT_ARGS = (
    *_GATED_TOKENS,
    Arg("beta", keyword_only=True),
    Arg("scale", "float", None, True),
    Arg("initial_state", "Tensor", None, True),
    Arg("output_final_state", "bool", False, True),
    Arg("cu_seqlens", "Tensor", None, True, dense=True),
    Arg("use_qk_l2norm_in_kernel", "bool", False, True),
    Arg("head_first", "bool", False, True, carried=False),
    refused_feature("gk", "Tensor", "a per-key gate"),
    refused_feature("gv", "Tensor", "a per-value gate"),
    refused_feature("use_gate_in_kernel", "bool", f"{_IN_KERNEL_GATE} (gdn.fused_gdn_gating computes g)"),
    refused_feature("A_log", "Tensor", f"{_IN_KERNEL_GATE} (gdn.fused_gdn_gating takes A_log)"),
    refused_feature("dt_bias", "Tensor", f"{_IN_KERNEL_GATE} (gdn.fused_gdn_gating takes dt_bias)"),
    *_FLA_REFUSED,
    Arg("state_v_first", "bool", False, True),
)


@dataclass(slots=True)
class _Tokens(Call):
    """What the gated-delta ops share: the token tensors, their validated shapes and the scale."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    shapes: GdnShapes
    scale: float

    # q read directly: every call reads its device and dtype, and these calls are the hot ones
    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype


@dataclass(slots=True)
class GdnCall(_Tokens):
    """chunk_gated_delta_rule and fused_recurrent_gated_delta_rule. initial_state is [N, HV, K, V]
    whatever the user's layout: with state_v_first it is the transposed view of the user's
    [N, HV, V, K] tensor, and the final state goes back to the user in that layout (a backend that
    writes it in that storage to begin with saves the copy)."""

    initial_state: torch.Tensor | None = None
    output_final_state: bool = False
    cu_seqlens: torch.Tensor | None = None
    use_qk_l2norm_in_kernel: bool = False
    state_v_first: bool = False

    def public_result(self, result):
        o, final = result
        if not self.state_v_first or final is None:
            return result
        return o, final.transpose(-1, -2).contiguous()


@dataclass(slots=True)
class PoolDecodeCall(_Tokens):
    """fused_recurrent_gated_delta_rule_update: sequence n reads and writes ssm_pool[ssm_indices[n]].
    ssm_pool is [slots, HV, K, V] whatever the user's layout: with state_v_first it is the transposed
    view of the user's [slots, HV, V, K] pool, written in place through that view."""

    ssm_pool: torch.Tensor
    ssm_indices: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    use_qk_l2norm_in_kernel: bool = False


def _gdn_call(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """The shared contract of the chunk and recurrent ops, validated."""
    arguments["shapes"], arguments["scale"] = check.check_gdn_inputs(spec.name, arguments)
    arguments = _dense(spec, arguments)
    arguments["initial_state"] = _key_first(arguments["initial_state"], arguments["state_v_first"])
    return _made(GdnCall, arguments)


@builtin(
    OpSpec(
        "chunk_gated_delta_rule",
        _CHUNK_ARGS,
        _GDN_OUTPUTS,
        _GDN_GRADS,
        peer_positional=("fla", "use_qk_l2norm_in_kernel"),
        transformers=("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"),
    ),
    probe_cases=_gdn_cases(grads=_GDN_GRADS, decode_step=False),
)
def chunk_gated_delta_rule(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """Chunked gated delta rule (training and prefill). Returns (o [B, T, HV, V], final_state | None).

    scale defaults to K**-0.5; with cu_seqlens [N + 1] the N sequences are packed along T (B = 1);
    initial_state and the final state are [N, HV, K, V] fp32 ([N, HV, V, K] with state_v_first, fla's
    value-first layout); differentiable in q, k, v, g, beta and initial_state. The positions are fla's
    up to output_final_state; the rest are keyword-only. fla's arguments for features gdn lacks are
    refused (TypeError) unless they hold their defaults."""
    return _gdn_call(spec, arguments)


@builtin(
    OpSpec(
        "fused_recurrent_gated_delta_rule",
        _RECURRENT_ARGS,
        _GDN_OUTPUTS,
        _GDN_GRADS,
        peer_positional=("fla", "gk"),
        transformers=("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    ),
    probe_cases=_gdn_cases(grads=(), decode_step=True),
)
def fused_recurrent_gated_delta_rule(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """The same contract as chunk_gated_delta_rule, computed token by token (decode). fla puts gk and
    gv at positions 5-6, so beta and everything after g are keyword-only; fla's arguments for features
    gdn lacks are refused (TypeError) unless they hold their defaults."""
    return _gdn_call(spec, arguments)


def _pool_decode_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    for name, T in (("pool", 2), ("pool_step", 1)):  # several tokens, and a decode step's one
        yield Case(
            name,
            dict(
                **_gdn_inputs(gen, cls, 3, T),
                ssm_pool=_randn(gen, 5, 4, cls.K, cls.V, scale=0.1),
                ssm_indices=torch.tensor([3, -1, 0], dtype=torch.int32),
                use_qk_l2norm_in_kernel=True,
            ),
        )


@builtin(
    OpSpec(
        "fused_recurrent_gated_delta_rule_update",
        (
            *_GATED_TOKENS,
            Arg("beta"),
            Arg("ssm_pool"),
            Arg("ssm_indices", dense=True),
            Arg("scale", "float", None),
            Arg("cu_seqlens", "Tensor", None, dense=True),
            Arg("use_qk_l2norm_in_kernel", "bool", False),
            Arg("state_v_first", "bool", False, True),
        ),
        (Output("o", like="v"),),
        mutates=("ssm_pool",),
        step_tensors=7,  # q, k, v, g, beta, ssm_pool, ssm_indices
    ),
    probe_cases=_pool_decode_cases,
)
def fused_recurrent_gated_delta_rule_update(spec: OpSpec, arguments: Arguments) -> PoolDecodeCall:
    """Decode against a state pool: sequence n reads and writes ssm_pool[ssm_indices[n]] in place
    (ssm_pool [max_slots, HV, K, V], or [max_slots, HV, V, K] with state_v_first, in fp32, bf16 or
    fp16: the recurrence runs in fp32 and the state is rounded to the pool's dtype when written back,
    so a half-precision pool halves the state traffic). Index -1 skips the sequence: its output is zero
    and the pool is untouched. Returns o [B, T, HV, V]."""
    arguments["shapes"], arguments["scale"] = check.check_pool_decode_inputs(spec.name, arguments)
    arguments = _dense(spec, arguments)
    arguments["ssm_pool"] = _key_first(arguments["ssm_pool"], arguments["state_v_first"])
    return _made(PoolDecodeCall, arguments)


# the causal conv ops

_CONV_FN_ARGS = (
    Arg("x"),
    Arg("weight", dense=True),
    Arg("bias", "Tensor", None, dense=True),
    Arg("activation", "str", None, True),
    Arg("seq_idx", "Tensor", None, True, dense=True),
    Arg("initial_states", "Tensor", None, True),
    Arg("return_final_states", "bool", False, True),
    refused_feature("final_states_out", "Tensor", "a preallocated final-state output"),
    Arg("query_start_loc", "Tensor", None, True, dense=True),
    Arg("conv_states", "Tensor", None, True),
    Arg("cache_indices", "Tensor", None, True, dense=True),
    Arg("has_initial_state", "Tensor", None, True, dense=True),
)
_CONV_OUTPUTS = (Output("out", like="x"), Output("final_states", None, asked_by="return_final_states", dropped=True))
_CONV_GRADS = ("x", "weight", "bias", "initial_states")


@dataclass(slots=True)
class ConvCall(Call):
    """causal_conv1d_fn, dense (x [B, D, T]) or varlen (x [D, total_T] with query_start_loc)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = None
    seq_idx: torch.Tensor | None = None
    initial_states: torch.Tensor | None = None
    return_final_states: bool = False
    query_start_loc: torch.Tensor | None = None
    conv_states: torch.Tensor | None = None
    cache_indices: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None


@dataclass(slots=True)
class ConvUpdateCall(Call):
    """causal_conv1d_update: conv_state rows (picked by conv_state_indices) updated in place."""

    x: torch.Tensor
    conv_state: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = None
    conv_state_indices: torch.Tensor | None = None


def _conv_fn_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    yield Case(
        "dense",
        dict(
            x=_randn(gen, 2, 64, 37),
            weight=_randn(gen, 64, 4),
            bias=_randn(gen, 64),
            activation="silu",
            initial_states=_randn(gen, 2, 64, 3),
        ),
        ("x", "weight", "bias", "initial_states"),
    )
    yield Case(
        "varlen",
        dict(
            x=_randn(gen, 64, 40),
            weight=_randn(gen, 64, 4),
            bias=_randn(gen, 64),
            activation="silu",
            query_start_loc=torch.tensor([0, 2, 2, 40], dtype=torch.int32),
            conv_states=_randn(gen, 4, 64, 3),
            cache_indices=torch.tensor([2, 0, 1]),
            has_initial_state=torch.tensor([True, False, True]),
        ),
    )


@builtin(
    OpSpec(
        "causal_conv1d_fn",
        _CONV_FN_ARGS,
        _CONV_OUTPUTS,
        _CONV_GRADS,
        mutates=("conv_states",),
        forms=(
            CustomOp(
                "causal_conv1d_fn",
                ("x", "weight", "bias", "activation", "seq_idx", "initial_states", "return_final_states"),
                _CONV_OUTPUTS,
                _CONV_GRADS,
            ),
            # the varlen form writes its conv-state pool: an inference op of its own (no autograd with a mutation)
            CustomOp(
                "causal_conv1d_fn_varlen",
                (
                    "x",
                    "weight",
                    "bias",
                    "activation",
                    "query_start_loc",
                    "conv_states",
                    "cache_indices",
                    "has_initial_state",
                ),
                (Output("out", like="x"),),
                required=("query_start_loc",),
                selected_by="query_start_loc",
            ),
        ),
        peer_positional=("causal-conv1d", "seq_idx"),
        transformers=("causal_conv1d_fn", "causal_conv1d_fn"),
    ),
    probe_cases=_conv_fn_cases,
)
def causal_conv1d_fn(spec: OpSpec, arguments: Arguments) -> ConvCall:
    """Depthwise causal conv1d for prefill (call-compatible with causal-conv1d and transformers).

    Dense: x [B, D, T], weight [D, W]; optional seq_idx [B, T] (packed sequences never mix) and
    initial_states [B, D, W - 1]; returns out [B, D, T], or (out, final_states) with
    return_final_states. Varlen: x [D, total_T] with query_start_loc [N + 1]; conv_states
    [slots, D, W - 1] is a pool read where has_initial_state [N] is set and written with each sequence's
    last W - 1 inputs at cache_indices [N] (default 0..N-1; -1 skips). Only x, weight and bias are
    positional: causal-conv1d's releases put seq_idx or activation at position 4."""
    check.check_conv_fn_inputs(spec.name, arguments)
    return _made(ConvCall, _dense(spec, arguments))


def _conv_update_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    yield Case(
        "pool",
        dict(
            x=_randn(gen, 3, 64),
            conv_state=_randn(gen, 4, 64, 4),
            weight=_randn(gen, 64, 4),
            bias=_randn(gen, 64),
            activation="silu",
            conv_state_indices=torch.tensor([1, -1, 3], dtype=torch.int32),
        ),
    )


@builtin(
    OpSpec(
        "causal_conv1d_update",
        (
            Arg("x"),
            Arg("conv_state"),
            Arg("weight", dense=True),
            Arg("bias", "Tensor", None, dense=True),
            Arg("activation", "str", None),
            Arg("conv_state_indices", "Tensor", None, True, dense=True),
            refused_feature("cache_seqlens", "Tensor", "a circular conv-state buffer"),
        ),
        (Output("out", like="x"),),
        mutates=("conv_state",),
        peer_positional=("causal-conv1d", "cache_seqlens"),
        transformers=("causal_conv1d_update", "causal_conv1d_update"),
    ),
    probe_cases=_conv_update_cases,
)
def causal_conv1d_update(spec: OpSpec, arguments: Arguments) -> ConvUpdateCall:
    """Decode step: x [B, D] or [B, D, L] new tokens; conv_state [slots, D, state_len >= W - 1] is
    updated in place (rows picked by conv_state_indices [B], -1 skips a row). causal-conv1d's
    position 6 is cache_seqlens (a circular state buffer, which gdn lacks and refuses), so
    conv_state_indices is keyword-only."""
    check.check_conv_update_inputs(spec.name, arguments)
    return _made(ConvUpdateCall, _dense(spec, arguments))


# the pointwise ops


@dataclass(slots=True)
class L2NormCall(Call):
    x: torch.Tensor
    eps: float = 1e-6


def _l2norm_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    yield Case("rows", dict(x=_randn(gen, 3, 70, 128)), ("x",))


@builtin(
    OpSpec("l2norm", (Arg("x"), Arg("eps", "float", 1e-6)), (Output("y", like="x"),), ("x",)),
    probe_cases=_l2norm_cases,
)
def l2norm(spec: OpSpec, arguments: Arguments) -> L2NormCall:
    """x / sqrt(sum(x^2, -1) + eps), computed in fp32, returned in x's dtype."""
    check.check_l2norm_inputs(spec.name, arguments)
    return L2NormCall(arguments["x"], float(arguments["eps"]))


@dataclass(slots=True)
class GatingCall(Call):
    """fused_gdn_gating's four inputs."""

    A_log: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    dt_bias: torch.Tensor


def _gating_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    yield Case(
        "tokens",
        dict(
            A_log=_randn(gen, 8, scale=0.5),
            a=_randn(gen, 70, 8),
            b=_randn(gen, 70, 8),
            dt_bias=_randn(gen, 8, scale=0.5),
        ),
        ("a", "b", "A_log", "dt_bias"),
    )


@builtin(
    OpSpec(
        "fused_gdn_gating",
        (Arg("A_log", dense=True), Arg("a"), Arg("b"), Arg("dt_bias", dense=True)),
        (Output("g", like="a", dtype="float32"), Output("beta", like="b")),
        ("A_log", "a", "b", "dt_bias"),
    ),
    probe_cases=_gating_cases,
)
def fused_gdn_gating(spec: OpSpec, arguments: Arguments) -> GatingCall:
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32) and beta = sigmoid(b) (b's dtype)."""
    check.check_gating_inputs(spec.name, arguments)
    return _made(GatingCall, _dense(spec, arguments))
