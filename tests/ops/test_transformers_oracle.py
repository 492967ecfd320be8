"""The eager ops against transformers' own torch implementations of the Qwen3.5 GDN block.

transformers routes these names to fla / causal-conv1d kernels when those are importable, so each
function is unwrapped to its torch body first. q/k are handed over already repeated to the value
heads, which every transformers version accepts (up to 5.17 the module repeats them itself)."""

from __future__ import annotations

import inspect

import pytest
import torch

import gdn
from gdn.integrations.transformers import torch_function
from reference import rel_err

transformers = pytest.importorskip("transformers", reason="transformers is the oracle of this module")
pytestmark = pytest.mark.single_op

MODELING = ["qwen3_5", "qwen3_next"]
# Up to about 5.14 the conv names are the causal-conv1d package's CUDA kernels, None without that
# package, and the layer runs torch code of its own instead: `torch_causal_conv1d_update`, and for the
# whole-sequence conv an inline nn.Conv1d call that no function exposes.
TORCH_FALLBACKS = {"causal_conv1d_update": "torch_causal_conv1d_update"}


def reference_of(model: str, name: str):
    """transformers' own torch function `name` of `model`'s modeling module (skips where there is none)."""
    module = pytest.importorskip(f"transformers.models.{model}.modeling_{model}")
    if not hasattr(module, name):
        pytest.skip(f"transformers {transformers.__version__} has no {model}.{name}")
    fn = getattr(module, name)
    if fn is None or torch_function(fn).__module__ != module.__name__:  # not transformers' torch code
        fallback = TORCH_FALLBACKS.get(name)
        if fallback is None or not hasattr(module, fallback):
            pytest.skip(
                f"transformers {transformers.__version__}: {model}.{name} is "
                f"{'None' if fn is None else fn.__module__ + '.' + fn.__qualname__}, and the layer's torch "
                "fallback is inline code, not a function to compare with"
            )
        fn = getattr(module, fallback)
    reference = torch_function(fn)
    # a plain function of the modeling module: no wrapper left that could hand the work to a kernel
    # package (fla on a GPU machine) instead of transformers' torch code
    assert inspect.isfunction(reference) and reference.__module__ == module.__name__, reference
    return reference


def gdn_inputs(gen, B=2, T=100, H=2, HV=4, K=32, V=48):
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen) * 0.1
    return q, k, v, g, beta, h0


def repeated(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[2], dim=2)


@pytest.mark.parametrize("model", MODELING)
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (gdn.chunk_gated_delta_rule, "torch_chunk_gated_delta_rule"),
        (gdn.fused_recurrent_gated_delta_rule, "torch_recurrent_gated_delta_rule"),
    ],
    ids=["chunk", "recurrent"],
)
def test_gated_delta_rule_matches_transformers(model, ours, theirs, gen):
    reference = reference_of(model, theirs)
    q, k, v, g, beta, h0 = gdn_inputs(gen)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, final = ours(
        *leaves[:4], beta=leaves[4], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    rq, rk, rv, rg, rb, rh = ref_leaves
    ro, rfinal = reference(
        repeated(rq, 4),
        repeated(rk, 4),
        rv,
        g=rg,
        beta=rb,
        initial_state=rh,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert rel_err(o, ro) < 1e-5 and rel_err(final, rfinal) < 1e-5
    up = torch.randn(o.shape, generator=gen)
    ((o * up).sum() + final.sum()).backward()
    ((ro * up).sum() + rfinal.sum()).backward()
    for name, got, want in zip(("q", "k", "v", "g", "beta", "h0"), leaves, ref_leaves, strict=True):
        assert rel_err(got.grad, want.grad) < 1e-5, name


def test_l2norm_matches_transformers(gen):
    reference = reference_of("qwen3_5", "l2norm")
    x = torch.randn(4, 33, 128, generator=gen)
    assert rel_err(gdn.l2norm(x), reference(x, dim=-1, eps=1e-6)) < 1e-6


def test_causal_conv1d_fn_matches_transformers(gen):
    reference = reference_of("qwen3_5", "causal_conv1d_fn")
    x, w = torch.randn(2, 40, 23, generator=gen), torch.randn(40, 4, generator=gen)
    assert rel_err(gdn.causal_conv1d_fn(x, w, None, activation="silu"), reference(x, w, None, activation="silu")) < 1e-6


@pytest.mark.parametrize("state_len", [3, 4])
def test_causal_conv1d_update_matches_transformers(state_len, gen):
    reference = reference_of("qwen3_5", "causal_conv1d_update")
    x, w = torch.randn(3, 40, 1, generator=gen), torch.randn(40, 4, generator=gen)
    state = torch.randn(3, 40, state_len, generator=gen)
    ref_state = state.clone()
    out = gdn.causal_conv1d_update(x, state, w, None, "silu")
    ref = reference(x, ref_state, w, None, "silu")
    assert rel_err(out, ref) < 1e-6
    assert torch.equal(state, ref_state)
