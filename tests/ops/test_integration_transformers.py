"""gdn.integrations.transformers: patched tiny Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models compute what
transformers' own torch code computes, models built before and after the patch alike, prefill and
cached decode; the record names every GDN module; patching is idempotent, reversible, scoped to its
mode, and refuses what it cannot patch."""

from __future__ import annotations

import functools
import importlib
import json
import types

import pytest
import torch

import gdn
import gdn.backends.eager
import gdn.resolve
from gdn.backends.base import Backend
from gdn.integrations import transformers as gdn_transformers
from grpo.backends import ACTOR_OPS
from grpo.compare import FORWARD_FLOOR
from grpo.models import KINDS, PAD, build, device, gdn_modules, transformers_torch_code
from grpo.run import exact_fp32
from reference import rel_err

transformers = pytest.importorskip("transformers", reason="the integration patches transformers")
pytestmark = pytest.mark.grpo

# The names a patch replaces, per class: what must come back after unpatching.
_NAMES = ("forward", *(attribute for attribute, _ in gdn_transformers.KERNELS.values()))


@pytest.fixture(autouse=True)
def _unpatched_and_exact():
    """Each test starts and ends unpatched, whatever it did, and runs in exact fp32."""
    assert not gdn_transformers.is_patched()
    with exact_fp32():
        yield
    gdn_transformers.unpatch()


def prompts(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts, the shorter left-padded, as a batch of generation prompts is."""
    ids = torch.tensor([[7, 21, 3, 40, 11, 9, 30], [PAD, PAD, PAD, 15, 2, 60, 8]], device=dev)
    return ids, (ids != PAD).long()


def forward_and_decode(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill logits of a padded batch, then 4 greedy tokens through the cache (recurrent decode and
    conv update) with the logits of each step."""
    ids, mask = prompts(next(model.parameters()).device)
    model.eval()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, use_cache=False).logits
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=4,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
        )
    real = mask.bool()  # logits at padding positions carry no meaning
    return logits[real], out.sequences, torch.stack(out.logits)


def snapshot() -> dict[tuple[str, str], object]:
    """What the patch may replace: the classes' own attributes and the modeling modules' functions."""
    taken: dict[tuple[str, str], object] = {}
    for name, where in gdn_transformers.CLASSES.items():
        modeling = importlib.import_module(f"transformers.models.{where}")
        cls = getattr(modeling, name)
        for attribute in _NAMES:
            taken[(name, attribute)] = vars(cls).get(attribute)
        for _, function in gdn_transformers.KERNELS.values():
            taken[(where, function)] = getattr(modeling, function, None)
    return taken


@pytest.mark.parametrize("kind", KINDS)
def test_patched_models_compute_what_transformers_computes(kind):
    with transformers_torch_code():
        patched_vs_transformers_torch_code(kind)


def patched_vs_transformers_torch_code(kind: str) -> None:
    dev = device()
    before = build(kind, 0, dev)  # built before the patch
    reference = forward_and_decode(before)
    with gdn_transformers.patch(mode="eager") as handle:
        after = build(kind, 0, dev)  # built while patched
        for model in (before, after):
            logits, tokens, steps = forward_and_decode(model)
            assert rel_err(logits, reference[0]) < FORWARD_FLOOR
            assert torch.equal(tokens, reference[1])
            assert rel_err(steps, reference[2]) < FORWARD_FLOOR
        record = handle.record()
    json.dumps(record)  # the matrix report stores it
    ran = {m["id"]: m for m in record["modules"]}
    for model in (before, after):
        modules = gdn_modules(model)
        assert modules
        for name, module in modules.items():
            assert set(ran[id(module)]["calls"]) == set(ACTOR_OPS), name
            assert all(set(routes) == {"eager"} for routes in ran[id(module)]["calls"].values()), name
    # Unpatched again: transformers' own code, bit for bit, also in the model built while patched.
    for model in (before, after):
        assert torch.equal(forward_and_decode(model)[0], reference[0])


def test_the_record_names_what_was_replaced_for_this_transformers():
    with gdn_transformers.patch() as handle:
        record = handle.record()
    api = record["classes"]["Qwen3_5GatedDeltaNet"]["api"]
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    # transformers moved the kernels from instance attributes to module functions in 5.15.
    assert api == (gdn_transformers.API_FUNCTIONS if version >= (5, 15) else gdn_transformers.API_ATTRIBUTES)
    assert record["transformers"] == transformers.__version__ and record["mode"] is None
    assert record["active"] and not record["modules"]
    for name, entry in record["classes"].items():
        assert entry["api"] == api
        if version >= (5, 12):  # the layers take the packed-sequence offsets
            assert entry["packed_sequences"], name
        elif version <= (5, 8):  # they never see them (5.9-5.11 not checked)
            assert not entry["packed_sequences"], name
        assert sorted(entry["replaced"].values()) == sorted(
            ["wrapped: names the calling module", *(f"gdn.{op}" for op in gdn_transformers.KERNELS)]
        )
        assert all(target.startswith(entry["module"]) for target in entry["replaced"]), name
    assert handle.record()["active"] is False


def test_patch_and_unpatch_are_idempotent_and_restore_everything():
    untouched = snapshot()
    first = gdn_transformers.patch(mode="eager")
    patched = snapshot()
    assert patched != untouched
    again = gdn_transformers.patch(mode="eager")  # no second layer of wrapping
    assert snapshot() == patched and again.record()["classes"] == first.record()["classes"]
    with gdn_transformers.patch(mode="eager"):  # a nested use does not unpatch the outer one
        pass
    assert gdn_transformers.is_patched()
    gdn_transformers.unpatch()
    gdn_transformers.unpatch()
    assert all(snapshot()[key] is value for key, value in untouched.items())
    assert gdn_transformers.patch_record() is None


def test_the_context_manager_unpatches_on_error():
    untouched = snapshot()
    with pytest.raises(KeyError), gdn_transformers.patch(mode="eager"):
        raise KeyError("boom")
    assert not gdn_transformers.is_patched()
    assert all(snapshot()[key] is value for key, value in untouched.items())


def test_patching_again_with_other_arguments_is_an_error():
    gdn_transformers.patch(mode="eager")
    with pytest.raises(RuntimeError, match="already patched with mode='eager'"):
        gdn_transformers.patch(mode="auto")
    with pytest.raises(RuntimeError, match="already patched"):
        gdn_transformers.patch(mode="eager", classes=["Qwen3_5GatedDeltaNet"])


class _Tracer:
    """A backend that serves every GDN op the models use with the eager implementation, counting."""

    def __init__(self):
        self.calls: dict[str, int] = dict.fromkeys(ACTOR_OPS, 0)

    def backend(self) -> Backend:
        return Backend("tracer", ops={op: self._counted(op) for op in ACTOR_OPS}, needs_probe=False)

    def _counted(self, op: str):
        eager = gdn.backends.eager.EAGER.implementation(op)

        def fn(*args, **kwargs):
            self.calls[op] += 1
            return eager(*args, **kwargs)

        return fn


@pytest.fixture
def tracer():
    traced = _Tracer()
    gdn.register_backend(traced.backend())
    yield traced
    gdn.unregister_backend("tracer")


def test_an_explicit_mode_applies_to_the_patched_calls_only(tracer):
    gdn.set_compute_mode("eager")
    model = build("dense", 0, device())
    with gdn_transformers.patch(mode="tracer") as handle:
        forward_and_decode(model)
        assert all(n > 0 for n in tracer.calls.values()), tracer.calls
        counted = dict(tracer.calls)
        x, w = torch.randn(1, 8, 5), torch.randn(8, 4)
        gdn.causal_conv1d_fn(x, w, None, activation="silu")  # a direct call: the process-wide mode
        assert tracer.calls == counted
        record = handle.record()
    routes = {route for m in record["modules"] for calls in m["calls"].values() for route in calls}
    assert routes == {"tracer"}
    modes = {(r["op"], r["requested_mode"]) for r in gdn.resolutions()}
    assert ("causal_conv1d_fn", "tracer") in modes and ("causal_conv1d_fn", "eager") in modes


def test_without_a_mode_the_patched_calls_follow_the_process_wide_mode(tracer):
    model = build("moe", 0, device())
    with gdn_transformers.patch():
        gdn.set_compute_mode("tracer")
        forward_and_decode(model)
    assert all(n > 0 for n in tracer.calls.values()), tracer.calls


def test_unknown_modes_and_classes_are_errors():
    with pytest.raises(ValueError, match="mode expected one of"):
        gdn_transformers.patch(mode="fast")
    with pytest.raises(ValueError, match="classes expected a non-empty subset"):
        gdn_transformers.patch(classes=["LlamaAttention"])
    with pytest.raises(ValueError, match="classes expected a non-empty subset"):
        gdn_transformers.patch(classes=[])
    assert not gdn_transformers.is_patched()


def test_a_transformers_without_qwen3_5_is_refused(monkeypatch):
    # transformers' lazy loading may have replaced the module object this file imported.
    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", "5.1.0")
    with pytest.raises(gdn_transformers.UnsupportedTransformersError, match=r"5\.1\.0 is not supported"):
        gdn_transformers.patch()
    assert not gdn_transformers.is_patched()


def test_a_gdn_layer_of_unknown_shape_is_refused_and_nothing_is_patched(monkeypatch):
    """A future transformers whose layer reaches its kernels some third way: a clear error, and the
    classes that could be patched are left alone too."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    untouched = snapshot()
    monkeypatch.setattr(modeling_qwen3_next.Qwen3NextGatedDeltaNet, "forward", lambda self, x: x)
    with pytest.raises(gdn_transformers.UnsupportedTransformersError, match=r"Qwen3NextGatedDeltaNet\.forward reaches"):
        gdn_transformers.patch()
    assert not gdn_transformers.is_patched()
    changed = {key for key, value in snapshot().items() if value is not untouched[key]}
    assert changed == {("Qwen3NextGatedDeltaNet", "forward")}  # only the test's own replacement


# A modeling module shaped like transformers 5.25's with the `kernels` package installed: the kernels
# are module functions turned into `nn.Module` instances by the hub-kernel decorator, and `forward`
# reaches the conv ones only through a module-level helper.
_HELPER_REACHED_MODELING = """
import torch

def _as_module(func):
    class Func(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)
    return Func()

def _kernel(*args, **kwargs):
    return args[0]

torch_chunk_gated_delta_rule = _as_module(_kernel)
torch_recurrent_gated_delta_rule = _as_module(_kernel)
causal_conv1d_fn = _as_module(_kernel)
causal_conv1d_update = _as_module(_kernel)

def _conv_forward(x, state):
    if state is not None:
        return causal_conv1d_update(x, state)
    return causal_conv1d_fn(x)

causal_conv1d_forward = _as_module(_conv_forward)

class Layer(torch.nn.Module):
    def forward(self, x, state=None):
        x = causal_conv1d_forward(x, state)
        if state is not None:
            return torch_recurrent_gated_delta_rule(x)
        return torch_chunk_gated_delta_rule(x)
"""


def test_kernels_reached_through_a_module_helper_are_module_functions():
    modeling = types.ModuleType("gdn_test_modeling")
    exec(compile(_HELPER_REACHED_MODELING, "<gdn_test_modeling>", "exec"), vars(modeling))
    assert gdn_transformers._api_of(modeling.Layer, modeling, "test") == gdn_transformers.API_FUNCTIONS
    # A helper of another module does not count: the patch could not reach its kernels.
    foreign = types.ModuleType("gdn_test_foreign")
    exec(compile(_HELPER_REACHED_MODELING, "<gdn_test_foreign>", "exec"), vars(foreign))
    modeling.causal_conv1d_forward = foreign.causal_conv1d_forward
    with pytest.raises(gdn_transformers.UnsupportedTransformersError, match=r"Layer\.forward reaches neither"):
        gdn_transformers._api_of(modeling.Layer, modeling, "test")


def test_torch_function_sees_through_the_fallback_and_the_kernels_module():
    """What transformers' modeling module holds under a kernel's name, from 5.25 with `kernels`
    installed: an nn.Module whose forward calls a functools wrapper (the fallback to fla) of the torch
    function. `torch_function` finds that function; a module it cannot read is an error, not a guess."""

    def torch_code(x):
        return x

    @functools.wraps(torch_code)
    def fallback(*args, **kwargs):
        raise AssertionError("the fallback handed the work to a kernel package")

    def as_module(func):
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

        return Func()

    assert gdn_transformers.torch_function(as_module(fallback)) is torch_code
    assert gdn_transformers.torch_function(fallback) is torch_code
    assert gdn_transformers.torch_function(torch_code) is torch_code

    class Two(torch.nn.Module):
        def forward(self, x):
            return torch_code(fallback(x))

    with pytest.raises(gdn_transformers.UnsupportedTransformersError, match="2 candidates"):
        gdn_transformers.torch_function(Two())


def test_unpatch_refuses_to_drop_a_later_replacement(monkeypatch):
    gdn_transformers.patch(classes=["Qwen3_5GatedDeltaNet"])
    from transformers.models.qwen3_5 import modeling_qwen3_5

    cls = modeling_qwen3_5.Qwen3_5GatedDeltaNet
    ours = vars(cls)["forward"]
    monkeypatch.setattr(cls, "forward", lambda self, *a, **k: ours(self, *a, **k))
    with pytest.raises(RuntimeError, match=r"Qwen3_5GatedDeltaNet\.forward'\] were replaced"):
        gdn_transformers.unpatch()
    assert gdn_transformers.is_patched()
    monkeypatch.undo()
    gdn_transformers.unpatch()
    assert not gdn_transformers.is_patched()
