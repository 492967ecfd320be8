"""Tiny random-init models of the GDN model families, built from their configs (nothing downloaded).

Sizes are the smallest that keep every code path: grouped value heads (2 value heads per key head,
which 5.24 hands to the kernels unrepeated), a full-attention layer between GDN layers (so packed
sequences also need transformers' block-diagonal attention mask), and a routed MoE."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator

import torch

KINDS = ("dense", "moe", "next")
VOCAB = 64
PAD = 0

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    max_position_embeddings=128,
    pad_token_id=PAD,
    bos_token_id=None,
    eos_token_id=None,
    tie_word_embeddings=False,
    # 10x transformers' default: at 0.02 the tiny model is near uniform and its GDN layers move the
    # logits by 3%; at 0.2 they move them by more than their own size, so GDN errors reach every metric.
    initializer_range=0.2,
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
GDN_CLASS = {"dense": "Qwen3_5GatedDeltaNet", "moe": "Qwen3_5MoeGatedDeltaNet", "next": "Qwen3NextGatedDeltaNet"}
LAYERS = {
    "dense": ["linear_attention", "full_attention", "linear_attention"],
    "moe": ["linear_attention", "full_attention"],
    "next": ["linear_attention", "full_attention"],
}


def _config(kind: str):
    import transformers

    layers = dict(layer_types=LAYERS[kind], num_hidden_layers=len(LAYERS[kind]))
    if kind == "dense":
        return transformers.Qwen3_5TextConfig(**_COMMON, **layers, intermediate_size=64)
    if kind == "moe":
        return transformers.Qwen3_5MoeTextConfig(**_COMMON, **layers, **_MOE)
    return transformers.Qwen3NextConfig(**_COMMON, **layers, **_MOE, intermediate_size=64)


# Where transformers' GDN layers find their kernels: fla's and causal-conv1d's functions imported into
# the modeling module (up to 5.14, None when absent), or transformers' torch functions wrapped to call
# those packages when they import (5.15 on; from 5.25 for inputs on a device the package serves, and
# with the wrapper held in an `nn.Module` where the `kernels` package is installed).
KERNEL_NAMES = (
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "FusedRMSNormGated",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
)
EXTERNAL_PACKAGES = ("fla", "causal_conv1d")


@contextlib.contextmanager
def transformers_torch_code() -> Iterator[None]:
    """transformers' own torch GDN code, also where fla or causal-conv1d is importable (a GPU machine):
    the unpatched baseline is the readable reference gdn's eager ops are held to, not whatever kernels
    transformers would hand the work to. Models must be built inside (up to 5.14 `__init__` picks the
    kernels)."""
    from gdn.integrations.transformers import CLASSES, torch_function

    saved = []
    for path in CLASSES.values():
        try:
            modeling = importlib.import_module(f"transformers.models.{path}")
        except ImportError:
            continue
        for name in KERNEL_NAMES:
            found = getattr(modeling, name, None)
            if found is None:
                continue
            if getattr(found, "__module__", "").split(".")[0] in EXTERNAL_PACKAGES:
                replacement = None
            else:
                replacement = torch_function(found)
            if replacement is not found:
                saved.append((modeling, name, found))
                setattr(modeling, name, replacement)
    try:
        yield
    finally:
        for modeling, name, found in reversed(saved):
            setattr(modeling, name, found)


def build(kind: str, seed: int, device: torch.device) -> torch.nn.Module:
    """A causal LM of `kind` in fp32, its weights a function of `seed` alone."""
    import transformers

    classes = {
        "dense": transformers.Qwen3_5ForCausalLM,
        "moe": transformers.Qwen3_5MoeForCausalLM,
        "next": transformers.Qwen3NextForCausalLM,
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classes[kind](_config(kind))
    return model.to(device=device, dtype=torch.float32)


def gdn_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The model's GatedDeltaNet layers by qualified name."""
    from gdn.integrations.transformers import CLASSES

    names = set(CLASSES)
    return {
        name: module for name, module in model.named_modules() if any(c.__name__ in names for c in type(module).__mro__)
    }


def device() -> torch.device:
    """The accelerator when there is one (the H200 and Ascend cells), else the host."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if importlib.util.find_spec("torch_npu") is not None:
        import torch_npu  # noqa: F401 - registers torch.npu

        if torch.npu.is_available():
            return torch.device("npu")
    return torch.device("cpu")
