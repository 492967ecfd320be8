"""The fla_npu ops' contracts, as data read from fla_npu's source, one set per route.

Each contract holds what the source says about one op: its signature (in the dispatcher's schema
grammar, which also states keyword-only arguments and host `int[]` lists against tensors), the dtype
and layout of each tensor argument and output, the shapes the kernels accept, the device / host
argument pairs of which exactly one may be given, and the inputs the kernel accepts but ignores or the
outputs it leaves uninitialised. The adapters read their limits and layouts from here; the stand-ins
under tests/standins derive every argument check and their output conventions from the same data,
so neither can drift from the source or from each other.

Routes and the builds they follow (no v26.10 tag exists; the "26.10" stand-ins follow main):

- legacy (torch.ops.npu): fla_npu v26.6.0 (39bbde7c, 2026-07-17), npu_custom.yaml and
  FLANpuOpApi.cpp; main's legacy extension keeps these schemas.
- stable (fla_npu.ops.ascendc): main 17e24fdd (2026-08-22) `_aclnn_ctypes.py` and the op READMEs,
  plus what a later `_aclnn_ctypes.py` (commit not pinned) adds: npu_causal_conv1d_fn with its
  mutually exclusive device / `_cpu` metadata, the composite forward, h laid out [B, NT, HV, K, V],
  and Dk = Dv = 128 for the recurrent op. Both predate fla_npu #312 (closed 2026-08-27), so
  npu_chunk_gated_delta_rule_bwd_dhu gives no state gradient on either route.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn.backends.ascendc.raw import LEGACY, STABLE

REPO = "flashserve/flash-linear-attention-npu"
V26_6 = "39bbde7c55f2d9c4777a50552ae42a5e67bdc295"  # tag v26.6.0
MAIN = "17e24fddc6afa399f47026739984dfc11831424d"  # main, 2026-08-22
LATER = None  # a later main whose commit could not be pinned

YAML = "torch_custom/fla_npu/npu_custom.yaml"
OPAPI = "torch_custom/fla_npu/op_plugin/ops/opapi/FLANpuOpApi.cpp"
CTYPES = "torch_custom/fla_npu/fla_npu/ops/ascendc/_aclnn_ctypes.py"
GDN = "fla/ops/ascendc/gdn"


@dataclass(frozen=True)
class Source:
    path: str
    commit: str | None  # None: read from a build whose commit could not be pinned

    def cite(self) -> str:
        return f"{REPO}@{(self.commit or 'unpinned')[:8]}:{self.path}"


@dataclass(frozen=True)
class Output:
    name: str
    layout: str | None = None  # space-separated dimension symbols; None: not constrained
    dtype: str | None = None  # a dtype rule (see allowed_dtypes); None: not constrained
    when: str | None = None  # the argument whose presence makes the op return this output


@dataclass(frozen=True)
class Contract:
    """One op on one route. `layouts` and `dtypes` name tensor arguments; layouts are dimension
    symbols that must agree across arguments (NT and N are derived from the chunk metadata), and
    `limits` restricts a symbol's values. `ignored` inputs are accepted and have no effect;
    `uninitialised` outputs come back with whatever the memory held."""

    op: str
    schema: str
    sources: tuple[Source, ...]
    layouts: Mapping[str, str] = field(default_factory=dict)
    dtypes: Mapping[str, str] = field(default_factory=dict)
    returns: tuple[Output, ...] = ()
    limits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    divisible: Mapping[str, int] = field(default_factory=dict)
    exclusive: tuple[tuple[str, str], ...] = ()  # (device argument, its host twin): exactly one
    ignored: tuple[str, ...] = ()
    uninitialised: tuple[str, ...] = ()
    notes: str = ""

    @functools.cached_property
    def arguments(self) -> list[Any]:
        return list(torch._C.parse_schema(self.schema).arguments)

    def output(self, name: str) -> Output:
        return next(o for o in self.returns if o.name == name)

    def cite(self) -> str:
        return ", ".join(s.cite() for s in self.sources)


class ContractError(RuntimeError):
    """A call that the op's contract refuses."""


# ---------------------------------------------------------------- shared pieces

HALF_CHAIN = {"k": "half", "v": "half", "q": "half", "w": "half", "u": "half", "A": "half", "g": "fp32"}
K128 = {"K": (128,), "V": (128, 256)}  # the decomposed chain's READMEs
HEAD_FIRST = {"q": "B H T K", "k": "B H T K", "g": "B HV T", "beta": "B HV T"}
CHUNK_LISTS = "int[]? cu_seqlens=None, int[]? chunk_indices=None"


def _readme(op_dir: str) -> Source:
    return Source(f"{GDN}/{op_dir}/README.md", MAIN)


LEGACY_SOURCES = (Source(YAML, V26_6), Source(OPAPI, V26_6))
STABLE_SOURCES = (Source(CTYPES, MAIN),)


def _chain(route: str, h_layout: str) -> dict[str, Contract]:
    """The decomposed chunk chain; its schemas are the same on both routes except fwd_h's."""
    sources = LEGACY_SOURCES if route == LEGACY else STABLE_SOURCES
    value = {"v": "B HV T V", "u": "B HV T V", "w": "B HV T K", "A": "B HV T C"}
    if route == LEGACY:
        fwd_h_schema = (
            "npu_chunk_gated_delta_rule_fwd_h(Tensor k, Tensor w, Tensor u, Tensor? g=None, *, Tensor? gk=None, "
            "Tensor? initial_state=None, bool? output_final_state=False, int? chunk_size=None, "
            f"bool? save_new_value=True, {CHUNK_LISTS}, bool? use_exp2=False, "
            "bool? transpose_state_layout=False) -> (Tensor, Tensor, Tensor)"
        )
        # FLANpuOpApi.cpp: the final state takes initial_state's options, else h's (k's dtype)
        final_dtype = "initial_state|k"
        dhu_state = {"h0": "B HV NT K V", "dht": "B HV NT K V"}
        dhu_notes = "h0 / dht must be 5-D (FLANpuOpApi.cpp) and the kernel reads neither"
    else:
        fwd_h_schema = (
            "npu_chunk_gated_delta_rule_fwd_h(Tensor k, Tensor w, Tensor u, Tensor? g=None, *, Tensor? gk=None, "
            "Tensor? initial_state=None, bool? output_final_state=False, int? chunk_size=None, "
            f"{CHUNK_LISTS}, bool? state_v_first=False) -> (Tensor, Tensor, Tensor)"
        )
        final_dtype = "initial_state|fp32"
        dhu_state = {}
        dhu_notes = "dh0 comes back [B, HV, NT, K, V] and uninitialised; dht is ignored; h0 / dht in q's dtype only"
    state = "N HV K V"
    return {
        "npu_recompute_w_u_fwd": Contract(
            "npu_recompute_w_u_fwd",
            "npu_recompute_w_u_fwd(Tensor k, Tensor v, Tensor beta, Tensor A, int chunk_size, *, Tensor? g=None, "
            f"Tensor? gk=None, {CHUNK_LISTS}) -> (Tensor, Tensor)",
            (*sources, _readme("chunk_gdn_fwd/recompute_w_u_fwd")),
            layouts=HEAD_FIRST | value,
            dtypes=HALF_CHAIN,
            returns=(Output("w", "B HV T K", "k"), Output("u", "B HV T V", "v")),
            limits=K128,
        ),
        "npu_chunk_gated_delta_rule_fwd_h": Contract(
            "npu_chunk_gated_delta_rule_fwd_h",
            fwd_h_schema,
            (*sources, _readme("chunk_gdn_fwd/chunk_gated_delta_rule_fwd_h")),
            layouts=HEAD_FIRST | value | {"initial_state": state},
            dtypes=HALF_CHAIN,
            returns=(
                Output("h", h_layout, "k"),
                Output("v_new", "B HV T V", "u"),
                Output("final_state", state, final_dtype, when="output_final_state"),
            ),
            limits=K128,
        ),
        "npu_chunk_fwd_o": Contract(
            "npu_chunk_fwd_o",
            "npu_chunk_fwd_o(Tensor q, Tensor k, Tensor v, Tensor h, float scale, *, Tensor? g=None, "
            f"Tensor? g_gamma=None, {CHUNK_LISTS}, int? chunk_size=None, "
            "bool? transpose_state_layout=False) -> Tensor",
            (*sources, _readme("chunk_gdn_fwd/chunk_fwd_o")),
            layouts=HEAD_FIRST | value | {"h": h_layout},
            dtypes=HALF_CHAIN | {"h": "half"},
            returns=(Output("o", "B HV T V", "v"),),
            limits=K128,
        ),
        "npu_chunk_bwd_dv_local": Contract(
            "npu_chunk_bwd_dv_local",
            "npu_chunk_bwd_dv_local(Tensor q, Tensor k, Tensor d_o, Tensor g, float scale, int chunk_size, *, "
            f"Tensor? g_gamma=None, Tensor? A=None, {CHUNK_LISTS}) -> Tensor",
            (*sources, _readme("chunk_gdn_bwd/chunk_bwd_dv_local")),
            layouts=HEAD_FIRST | value | {"d_o": "B HV T V"},
            dtypes=HALF_CHAIN | {"d_o": "half"},
            returns=(Output("dv", "B HV T V", "d_o"),),
            limits=K128,
        ),
        "npu_chunk_gated_delta_rule_bwd_dhu": Contract(
            "npu_chunk_gated_delta_rule_bwd_dhu",
            "npu_chunk_gated_delta_rule_bwd_dhu(Tensor q, Tensor k, Tensor w, Tensor d_o, Tensor dv, float scale, "
            "int chunk_size, *, Tensor? g=None, Tensor? gK=None, Tensor? h0=None, Tensor? dht=None, "
            f"{CHUNK_LISTS}, bool? use_exp2=False, bool? transpose_state_layout=False) -> (Tensor, Tensor, Tensor)",
            (*sources, _readme("chunk_gdn_bwd/chunk_gated_delta_rule_bwd_dhu")),
            layouts=HEAD_FIRST | value | {"d_o": "B HV T V", "dv": "B HV T V"} | dhu_state,
            dtypes=HALF_CHAIN | {"d_o": "half", "dv": "half", "h0": "q", "dht": "q"},
            returns=(
                Output("dh", h_layout, "q"),
                Output("dh0", "B HV NT K V", "q", when="h0"),
                Output("dv2", "B HV T V", "dv"),
            ),
            limits=K128,
            ignored=("h0", "dht"),
            uninitialised=("dh0",),
            notes=dhu_notes,
        ),
        "npu_chunk_bwd_dqkwg": Contract(
            "npu_chunk_bwd_dqkwg",
            "npu_chunk_bwd_dqkwg(Tensor q, Tensor k, Tensor v, Tensor g, Tensor h, Tensor dox, Tensor dh, "
            f"Tensor dv, int chunk_size, *, {CHUNK_LISTS}, Tensor? w=None, Tensor? g_gamma=None, "
            "float? scale=None, bool? use_exp2=None, bool? transpose_state_layout=None) "
            "-> (Tensor, Tensor, Tensor, Tensor)",
            (*sources, Source(f"{GDN}/chunk_gdn_bwd/chunk_bwd_dqkwg/README.md", MAIN)),
            layouts=HEAD_FIRST | value | {"h": h_layout, "dh": h_layout, "dox": "B HV T V", "dv": "B HV T V"},
            dtypes=HALF_CHAIN | {"h": "half", "dh": "half", "dox": "half", "dv": "half"},
            returns=(
                Output("dq", "B H T K", "q"),
                Output("dk", "B H T K", "k"),
                Output("dw", "B HV T K", "q"),
                Output("dg", "B HV T", "fp32"),
            ),
            limits=K128,
        ),
        "npu_prepare_wy_repr_bwd_da": Contract(
            "npu_prepare_wy_repr_bwd_da",
            "npu_prepare_wy_repr_bwd_da(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dw, Tensor du, "
            f"Tensor g, *, int chunk_size, {CHUNK_LISTS}) -> Tensor",
            sources,
            layouts=HEAD_FIRST | value | {"dw": "B HV T K", "du": "B HV T V"},
            dtypes=HALF_CHAIN | {"dw": "half", "du": "half"},
            returns=(Output("dA", "B HV T C", "A"),),
            limits=K128,
        ),
        "npu_prepare_wy_repr_bwd_full": Contract(
            "npu_prepare_wy_repr_bwd_full",
            "npu_prepare_wy_repr_bwd_full(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dA, Tensor dw, "
            f"Tensor du, Tensor g, int chunk_size, *, {CHUNK_LISTS}) -> (Tensor dk, Tensor dv, Tensor dbeta, "
            "Tensor dg)",
            sources,
            layouts=HEAD_FIRST | value | {"dA": "B HV T C", "dw": "B HV T K", "du": "B HV T V"},
            dtypes=HALF_CHAIN | {"dA": "half", "dw": "half", "du": "half"},
            returns=(
                Output("dk", "B H T K", "k"),
                Output("dv", "B HV T V", "v"),
                Output("dbeta", "B HV T", "beta"),
                Output("dg", "B HV T", "g"),
            ),
            limits=K128,
        ),
    }


# the raw conv's tiling (causal_conv1d README and aclnnCausalConv1d.md): W in {2, 3, 4}, D a
# multiple of 16, conv_states [slots, state_len >= W - 1, D]
CONV_LIMITS = {"W": (2, 3, 4)}
CONV_DIVISIBLE = {"D": 16}
CONV_SOURCE = Source(f"{GDN}/gdn_preprocess/causal_conv1d/README.md", MAIN)
CONV_BWD_SCHEMA = (
    "npu_causal_conv1d_bwd(Tensor x, Tensor? y, Tensor weight, Tensor dy, Tensor? initial_state=None, "
    'Tensor? dht=None, *, int[]? query_start_loc=None, int activation=0, str input_layout="BSND") '
    "-> (Tensor dx, Tensor dw, Tensor db, Tensor dh0)"
)
CONV_RAW_ARGS = (
    "*, int[]? query_start_loc=None, int[]? cache_indices=None, int[]? initial_state_mode=None, "
    "int[]? num_accepted_tokens=None, int activation_mode=0, int pad_slot_id=-1, int run_mode=0, "
    "int head_num=0) -> Tensor"
)
CONV_LAYOUTS = {"x": "TOK D", "weight": "W D", "bias": "D", "conv_states": "S L D"}
CONV_DTYPES = {"x": "half", "weight": "x", "bias": "x", "conv_states": "x"}


def _conv(route: str) -> dict[str, Contract]:
    sources = LEGACY_SOURCES if route == LEGACY else STABLE_SOURCES
    head = "Tensor? bias=None, Tensor? conv_states=None" if route == STABLE else "Tensor? bias, Tensor conv_states"
    bwd = Contract(
        "npu_causal_conv1d_bwd",
        CONV_BWD_SCHEMA,
        (*sources, Source(f"{GDN}/gdn_preprocess/causal_conv1d_bwd/README.md", MAIN)),
        layouts={"x": "TOK D", "weight": "W D", "dy": "1 TOK D", "initial_state": "N W D"},
        dtypes={"x": "half", "weight": "x", "dy": "x", "initial_state": "x"},
        returns=(Output("dx", "TOK D", "x"), Output("dw", "W D"), Output("db", "D"), Output("dh0", "N W D", "x")),
        limits=CONV_LIMITS,
        divisible=CONV_DIVISIBLE,
    )
    contracts = {
        "npu_causal_conv1d": Contract(
            "npu_causal_conv1d",
            f"npu_causal_conv1d(Tensor x, Tensor weight, {head}, {CONV_RAW_ARGS}",
            (*sources, CONV_SOURCE),
            layouts=CONV_LAYOUTS,
            dtypes=CONV_DTYPES,
            returns=(Output("y", "TOK D", "x"),),
            limits=CONV_LIMITS,
            divisible=CONV_DIVISIBLE,
        ),
        "npu_causal_conv1d_bwd": bwd,
    }
    if route == STABLE:
        contracts["npu_causal_conv1d_fn"] = Contract(
            "npu_causal_conv1d_fn",
            "npu_causal_conv1d_fn(Tensor x, Tensor weight, Tensor? bias, Tensor? conv_states=None, "
            "Tensor? query_start_loc=None, Tensor? cache_indices=None, Tensor? has_initial_state=None, "
            'str? activation="silu", int pad_slot_id=-1, *, int[]? query_start_loc_cpu=None, '
            "int[]? cache_indices_cpu=None, int[]? has_initial_state_cpu=None, int head_num=0) -> Tensor",
            (Source(CTYPES, LATER), CONV_SOURCE),
            layouts=CONV_LAYOUTS | {"query_start_loc": "NQ", "cache_indices": "NS", "has_initial_state": "NS"},
            dtypes=CONV_DTYPES | {"query_start_loc": "int32", "cache_indices": "int32", "has_initial_state": "bool"},
            returns=(Output("y", "TOK D", "x"),),
            limits=CONV_LIMITS,
            divisible=CONV_DIVISIBLE,
            exclusive=(
                ("query_start_loc", "query_start_loc_cpu"),
                ("cache_indices", "cache_indices_cpu"),
                ("has_initial_state", "has_initial_state_cpu"),
            ),
            notes='ValueError "X and X_cpu are mutually exclusive" on the ctypes path',
        )
    return contracts


def _stable_extras() -> dict[str, Contract]:
    recurrent = Contract(
        "npu_recurrent_gated_delta_rule",
        "npu_recurrent_gated_delta_rule(Tensor query, Tensor key, Tensor value, Tensor state, *, Tensor beta, "
        "float scale=1.0, Tensor actual_seq_lengths, Tensor ssm_state_indices, Tensor? num_accepted_tokens=None, "
        "Tensor? g=None, Tensor? gk=None) -> Tensor",
        (Source(CTYPES, MAIN), Source(CTYPES, LATER), _readme("recurrent_gdn/recurrent_gated_delta_rule")),
        layouts={
            "query": "TOK NK DK",
            "key": "TOK NK DK",
            "value": "TOK NV DV",
            "state": "BLK NV DV DK",
            "beta": "TOK NV",
            "g": "TOK NV",
            "actual_seq_lengths": "NQ",
            "ssm_state_indices": "TOK",
        },
        dtypes={
            "query": "bf16",
            "key": "bf16",
            "value": "bf16",
            "beta": "bf16",
            "state": "bf16|fp32",
            "g": "fp32",
            "actual_seq_lengths": "int32",
            "ssm_state_indices": "int32",
        },
        returns=(Output("out", "TOK NV DV", "value"),),
        limits={"DK": (128,), "DV": (128,)},
        notes="updates state in place",
    )
    composite = Contract(
        "npu_chunk_gated_delta_rule_fwd",
        "npu_chunk_gated_delta_rule_fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, *, "
        "Tensor? initial_state=None, bool output_final_state=False, int chunk_size=64, "
        f'{CHUNK_LISTS}, float? scale=None, str layout="BNSD", bool use_exp2=False, '
        "bool use_qk_l2norm_in_kernel=False, bool use_gate_in_kernel=False, "
        "bool use_beta_sigmoid_in_kernel=False, bool allow_neg_eigval=False, bool disable_recompute=False, "
        "bool return_intermediate_states=False, bool state_v_first=False) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        (Source(CTYPES, LATER),),
        layouts={"q": "B T H K", "k": "B T H K", "v": "B T HV V", "g": "B T HV", "beta": "B T HV"},
        dtypes={"q": "half", "k": "q", "v": "q", "g": "fp32", "initial_state": "fp32"},
        returns=(
            Output("o", "B T HV V", "v"),
            Output("final_state", "N HV K V"),
            Output("g_cumsum", "B T HV", "fp32"),
            Output("A", "B HV T C", "k"),
            *(Output(name) for name in ("beta_eff", "h", "q_hat", "k_hat", "q_rstd", "k_rstd")),
        ),
        limits=K128,
    )
    return {recurrent.op: recurrent, composite.op: composite}


CONTRACTS: dict[str, dict[str, Contract]] = {
    LEGACY: _chain(LEGACY, "B HV NT K V") | _conv(LEGACY),
    STABLE: _chain(STABLE, "B NT HV K V") | _conv(STABLE) | _stable_extras(),
}


def contract(route: str, op: str) -> Contract:
    return CONTRACTS[route][op]


def permute(t: torch.Tensor, source: str, target: str) -> torch.Tensor:
    """t laid out as the symbols `source` -> laid out as `target` (the same symbols, reordered)."""
    src, dst = source.split(), target.split()
    return t if src == dst else t.permute([src.index(s) for s in dst]).contiguous()


# ---------------------------------------------------------------- checking a call


def _kind(arg: Any) -> str:
    text = str(arg.type)
    return text.removeprefix("Optional[").removesuffix("]") if text.startswith("Optional[") else text


def _optional(arg: Any) -> bool:
    return str(arg.type).startswith("Optional[")


def bind(c: Contract, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults filled in, as the schema binds them (names, positions,
    keyword-only arguments); ContractError when the schema refuses the call."""
    params = c.arguments
    positional = [a for a in params if not a.kwarg_only]
    if len(args) > len(positional):
        raise ContractError(f"{c.op}: takes {len(positional)} positional arguments, got {len(args)}")
    bound = {a.name: v for a, v in zip(positional, args, strict=False)}
    names = {a.name for a in params}
    for name, value in kwargs.items():
        if name not in names:
            raise ContractError(f"{c.op}: unexpected argument {name!r}")
        if name in bound:
            raise ContractError(f"{c.op}: argument {name!r} given twice")
        bound[name] = value
    for a in params:
        if a.name not in bound:
            if not a.has_default_value() and not _optional(a):
                raise ContractError(f"{c.op}: missing required argument {a.name!r}")
            bound[a.name] = a.default_value if a.has_default_value() else None
    return bound


def _type_error(op: str, arg: Any, value: Any) -> str | None:
    kind = _kind(arg)
    if value is None:
        return None if _optional(arg) else f"{op}: {arg.name} must not be None ({arg.type})"
    if kind == "Tensor":
        return (
            None
            if isinstance(value, torch.Tensor)
            else f"{op}: {arg.name} must be a tensor, got {type(value).__name__}"
        )
    if kind == "List[int]":
        if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
            return f"{op}: {arg.name} must be a host list of ints (int[]), got {type(value).__name__}"
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return f"{op}: {arg.name} must hold Python ints, got {[type(v).__name__ for v in value]}"
        return None
    expected = {"int": int, "float": (int, float), "bool": bool, "str": str}[kind]
    if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
        return f"{op}: {arg.name} must be {kind}, got {type(value).__name__}"
    return None


DTYPES = {
    "half": (torch.bfloat16, torch.float16),
    "bf16": (torch.bfloat16,),
    "fp32": (torch.float32,),
    "int32": (torch.int32,),
    "bool": (torch.bool,),
}


def allowed_dtypes(rule: str, bound: Mapping[str, Any]) -> tuple[torch.dtype, ...] | None:
    """The dtypes a rule admits: named classes, or another argument's dtype ("q"); alternatives
    separated by "|"; an alternative naming an absent argument does not apply. For outputs, the
    first alternative that applies is the dtype the op returns."""
    allowed: list[torch.dtype] = []
    for part in rule.split("|"):
        if part in DTYPES:
            allowed += DTYPES[part]
        elif isinstance(bound.get(part), torch.Tensor):
            allowed.append(bound[part].dtype)
    return tuple(allowed) or None


def output_dtype(rule: str, bound: Mapping[str, Any]) -> torch.dtype | None:
    allowed = allowed_dtypes(rule, bound)
    return None if allowed is None else allowed[0]


def chunk_symbols(bound: Mapping[str, Any]) -> dict[str, int]:
    """NT (h's chunk axis) and N (sequences) from the chunk metadata, as the ops derive them."""
    ref = next((bound[n] for n in ("k", "q") if isinstance(bound.get(n), torch.Tensor)), None)
    if ref is None or "chunk_size" not in bound or ref.ndim != 4:
        return {}
    size = bound["chunk_size"] or 64
    cu, indices = bound.get("cu_seqlens"), bound.get("chunk_indices")
    if indices is not None:
        nt = len(indices) // 2
    elif cu is not None:
        nt = sum(math.ceil((b - a) / size) for a, b in itertools.pairwise(cu))
    else:
        nt = math.ceil(ref.shape[2] / size)
    return {"NT": nt, "N": len(cu) - 1 if cu is not None else ref.shape[0], "C": size}


def unify(op: str, layouts: Mapping[str, str], tensors: Mapping[str, Any], dims: dict[str, int]) -> list[str]:
    """Bind each tensor's dimensions to its layout's symbols (digits are fixed sizes); the
    disagreements as messages. `dims` is extended in place."""
    problems = []
    for name, layout in layouts.items():
        t = tensors.get(name)
        if not isinstance(t, torch.Tensor):
            continue
        symbols = layout.split()
        if t.ndim != len(symbols):
            problems.append(f"{op}: {name} must be {len(symbols)}-D [{', '.join(symbols)}], got {list(t.shape)}")
            continue
        for symbol, size in zip(symbols, t.shape, strict=True):
            want = int(symbol) if symbol.isdigit() else dims.setdefault(symbol, size)
            if want != size:
                problems.append(
                    f"{op}: {name} must be [{', '.join(symbols)}] with {symbol} = {want}, got {list(t.shape)}"
                )
                break
    return problems


def limit_problems(c: Contract, dims: Mapping[str, int]) -> list[str]:
    problems = [
        f"{c.op}: {symbol} = {dims[symbol]} is outside its limits {list(values)}"
        for symbol, values in c.limits.items()
        if symbol in dims and dims[symbol] not in values
    ]
    problems += [
        f"{c.op}: {symbol} = {dims[symbol]} must be a multiple of {d}"
        for symbol, d in c.divisible.items()
        if symbol in dims and dims[symbol] % d
    ]
    if "L" in dims and "W" in dims and dims["L"] < dims["W"] - 1:
        problems.append(f"{c.op}: conv state length {dims['L']} must be at least W - 1 = {dims['W'] - 1}")
    return problems


def refusal(route: str, ops: Iterable[str], dims: Mapping[str, int]) -> str | None:
    """Why a call whose dimensions are `dims` is outside the limits of the route's `ops` (None: inside)."""
    problems = [p for op in ops for p in limit_problems(contract(route, op), dims)]
    return "; ".join(problems) or None


def violations(c: Contract, args: tuple, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """(the bound call, every way it breaks the contract); the call is None when the schema
    cannot bind it."""
    try:
        bound = bind(c, args, kwargs)
    except ContractError as exc:
        return None, [str(exc)]
    problems = [p for a in c.arguments if (p := _type_error(c.op, a, bound[a.name]))]
    for device, host in c.exclusive:
        if bound.get(device) is not None and bound.get(host) is not None:
            problems.append(f"{c.op}: {device} and {host} are mutually exclusive")
    for name, rule in c.dtypes.items():
        t = bound.get(name)
        allowed = allowed_dtypes(rule, bound)
        if isinstance(t, torch.Tensor) and allowed is not None and t.dtype not in allowed:
            problems.append(f"{c.op}: {name} must be {rule} ({', '.join(map(str, allowed))}), got {t.dtype}")
    dims = chunk_symbols(bound)
    problems += unify(c.op, c.layouts, bound, dims)
    problems += limit_problems(c, dims)
    return bound, problems


def check(c: Contract, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    bound, problems = violations(c, args, kwargs)
    if problems:
        raise ContractError("; ".join(problems))
    assert bound is not None
    return bound
