"""gdn as a drop-in for fla's chunk_gated_delta_rule / fused_recurrent_gated_delta_rule and for
causal-conv1d's causal_conv1d_fn / causal_conv1d_update: a call written against the peer's signature,
positional or keyword, either computes on gdn what the peer's binding means or raises a TypeError
that names the argument at issue; it never binds a value to a different parameter.

The peers' signatures are written out below as plain functions (fla 0.6 and causal-conv1d 1.4+)
so the test binds against them without importing either library.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import pytest
import torch

import gdn
from gdn.resolve import compute_mode_override

# ---------------------------------------------------------------------------------------------------
# the peers' signatures


def fla_chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    cp_context=None,
    **kwargs,
): ...


def fla_fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    **kwargs,
): ...


def dao_causal_conv1d_fn(
    x,
    weight,
    bias=None,
    seq_idx=None,
    initial_states=None,
    return_final_states=False,
    final_states_out=None,
    activation=None,
): ...


def dao_causal_conv1d_update(
    x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None
): ...


# ---------------------------------------------------------------------------------------------------
# the values a call passes; "supported" holds the defaults of what gdn lacks, "everything" asks for it


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _gdn_values(gen: torch.Generator, everything: bool) -> dict[str, object]:
    B, T, H, HV, K, V = 1, 6, 1, 2, 8, 4
    values = dict(
        q=_randn(gen, B, T, H, K),
        k=_randn(gen, B, T, H, K, scale=K**-0.5),
        v=_randn(gen, B, T, HV, V),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen),
        scale=0.4,
        initial_state=_randn(gen, 1, HV, K, V, scale=0.1),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.tensor([0, 6]),  # one sequence: initial_state fits with and without it
        state_v_first=False,  # the value-first layout itself: tests/test_state_layout.py
        # fla features gdn does not implement
        use_beta_sigmoid_in_kernel=everything,
        allow_neg_eigval=everything,
        use_gate_in_kernel=everything,
        gk=-torch.rand(B, T, HV, K, generator=gen) if everything else None,
        gv=-torch.rand(B, T, HV, V, generator=gen) if everything else None,
        A_log=_randn(gen, HV) if everything else None,
        dt_bias=_randn(gen, HV) if everything else None,
        cu_seqlens_cpu=torch.tensor([0, 6]) if everything else None,
        chunk_indices=torch.tensor([[0, 0]]) if everything else None,
        cp_context=object() if everything else None,
    )
    return values


def _conv_fn_values(gen: torch.Generator, everything: bool) -> dict[str, object]:
    B, D, T, W = 2, 3, 5, 4
    return dict(
        x=_randn(gen, B, D, T),
        weight=_randn(gen, D, W),
        bias=_randn(gen, D),
        seq_idx=torch.tensor([[0, 0, 1, 1, 1], [2, 2, 2, 2, 2]], dtype=torch.int32),
        initial_states=_randn(gen, B, D, W - 1),
        return_final_states=True,
        final_states_out=torch.zeros(B, D, W - 1) if everything else None,
        activation="silu",
    )


def _conv_update_values(gen: torch.Generator, everything: bool) -> dict[str, object]:
    B, D, W = 2, 3, 4
    return dict(
        x=_randn(gen, B, D),
        conv_state=_randn(gen, B, D, W),
        weight=_randn(gen, D, W),
        bias=_randn(gen, D),
        activation="silu",
        cache_seqlens=torch.tensor([1, 3], dtype=torch.int32) if everything else None,
        conv_state_indices=torch.tensor([1, 0], dtype=torch.int32),
    )


# peer signature, gdn op, values, tensors the op updates in place, arguments every form passes
PEERS: dict[str, tuple[Callable, Callable, Callable, tuple[str, ...], tuple[str, ...]]] = {
    "fla-chunk": (fla_chunk_gated_delta_rule, gdn.chunk_gated_delta_rule, _gdn_values, (), ()),
    "fla-recurrent": (
        fla_fused_recurrent_gated_delta_rule,
        gdn.fused_recurrent_gated_delta_rule,
        _gdn_values,
        (),
        ("g", "beta"),
    ),
    "dao-conv-fn": (dao_causal_conv1d_fn, gdn.causal_conv1d_fn, _conv_fn_values, (), ()),
    "dao-conv-update": (
        dao_causal_conv1d_update,
        gdn.causal_conv1d_update,
        _conv_update_values,
        ("conv_state",),
        (),
    ),
}


def _parameters(stub: Callable) -> list[str]:
    return [p.name for p in inspect.signature(stub).parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]


def _positional_count(op: Callable) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in inspect.signature(op).parameters.values())


def _forms(stub: Callable, essential: tuple[str, ...]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(positional names, keyword names): every positional prefix of the peer's parameters, every
    optional parameter by keyword, and all by keyword; the essential ones by keyword where a form
    would leave them out (fla's recurrent op lets g and beta default, gdn needs them)."""
    names = _parameters(stub)
    required = [n for n in names if inspect.signature(stub).parameters[n].default is inspect.Parameter.empty]
    forms = [(tuple(names[:n]), ()) for n in range(len(required), len(names) + 1)]
    forms += [(tuple(required), (name,)) for name in names[len(required) :] if name not in essential]
    forms.append(((), tuple(names)))
    return [(pos, tuple(n for n in essential if n not in pos + kw) + kw) for pos, kw in forms]


def _params() -> list:
    params = []
    for label, (stub, _op, _make, _in_place, essential) in PEERS.items():
        for positional, keywords in _forms(stub, essential):
            form = f"{len(positional)}pos" + "".join(f"+{k}" for k in keywords)
            for everything in (False, True):
                case = "everything" if everything else "supported"
                params.append(pytest.param(label, positional, keywords, everything, id=f"{label}-{form}-{case}"))
    return params


def _outcome(op: Callable, args: list, kwargs: dict) -> list | Exception:
    """The op's outputs, or the exception it raised."""
    try:
        with compute_mode_override("eager"), torch.no_grad():
            out = op(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return exc
    return list(out) if isinstance(out, tuple) else [out]


def _named(exc: BaseException) -> set[str]:
    return set(re.findall(r"'(\w+)'", str(exc)))


@pytest.mark.single_op
@pytest.mark.parametrize(("label", "positional", "keywords", "everything"), _params())
def test_a_peer_call_means_the_same_or_is_refused_by_name(label, positional, keywords, everything):
    stub, op, make, in_place, _essential = PEERS[label]

    def values() -> dict[str, object]:
        return make(torch.Generator().manual_seed(0), everything)

    given = values()
    args, kwargs = [given[n] for n in positional], {n: given[n] for n in keywords}
    meaning = inspect.signature(stub).bind(*args, **kwargs).arguments
    # What the peer's binding asks of gdn, every argument by its name.
    fresh = values()
    expected = _outcome(op, [], {name: fresh[name] for name in meaning})
    got = _outcome(op, args, kwargs)
    if isinstance(expected, Exception) and type(got) is type(expected) and str(got) == str(expected):
        return  # refused alike, e.g. a required argument the peer lets default

    beyond_gdn = set(positional[_positional_count(op) :])
    if isinstance(got, TypeError) and (beyond_gdn or isinstance(expected, TypeError)):
        at_issue = beyond_gdn | (_named(expected) & set(meaning) if isinstance(expected, TypeError) else set())
        assert _named(got) & at_issue, f"{got} names none of {sorted(at_issue)}"
        return
    assert not beyond_gdn, f"gdn took {sorted(beyond_gdn)} by position, where the peer binds them: {got}"
    assert not isinstance(expected, Exception), f"the peer's meaning is refused ({expected}), the call is not: {got}"
    assert not isinstance(got, Exception), got
    got += [given[name] for name in in_place]
    expected += [fresh[name] for name in in_place]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def _dao_update_with_cache_seqlens() -> tuple:
    conv = _conv_update_values(torch.Generator().manual_seed(0), True)
    return conv["x"], conv["conv_state"], conv["weight"], None, None, conv["cache_seqlens"]


def _fla_chunk_with_l2norm_at_9() -> tuple:
    v = _gdn_values(torch.Generator().manual_seed(0), False)
    return v["q"], v["k"], v["v"], v["g"], v["beta"], None, None, False, True


def _fla_recurrent_with_gk_at_5() -> tuple:
    v = _gdn_values(torch.Generator().manual_seed(0), True)
    return v["q"], v["k"], v["v"], v["g"], v["gk"]


@pytest.mark.single_op
@pytest.mark.parametrize(
    ("op", "make", "name"),
    [
        ("causal_conv1d_update", _dao_update_with_cache_seqlens, "cache_seqlens"),
        ("chunk_gated_delta_rule", _fla_chunk_with_l2norm_at_9, "use_qk_l2norm_in_kernel"),
        ("fused_recurrent_gated_delta_rule", _fla_recurrent_with_gk_at_5, "gk"),
    ],
)
def test_the_known_misbindings_are_refused_by_name(op, make, name):
    with pytest.raises(TypeError, match=f"'{name}'"):
        getattr(gdn, op)(*make())
