"""One way to add a backend: a Backend subclass in one file, registered by one entry of the table
(gdn.backends.registry), is resolved, named by matrix.yaml's validation, versioned and probed, with no
other file touched; and the table is the one list every reader has."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import gdn
from gdn import resolve
from gdn.backends import registry
from gdn.backends.base import Backend, OpTable
from gdn.calls import L2NormCall
from gdn.matrix import config, probe, versions

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[1]
TOY_VERSION = "0.7.1"


def toy_l2norm(call: L2NormCall) -> torch.Tensor:
    x = call.x.double()
    return (x / torch.sqrt((x * x).sum(-1, keepdim=True) + call.eps)).to(call.x.dtype)


@dataclass(eq=False)
class ToyBackend(Backend):
    """A peer of one op on the host, first in auto there."""

    name: str = "toy"
    devices: tuple[str, ...] = ("cpu",)
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cpu": 0})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: {"l2norm": 1e-5})
    peer: bool = True

    def loader(self) -> OpTable:
        return {"l2norm": toy_l2norm}

    def route(self, op: str) -> str:
        return f"toy:{TOY_VERSION}"

    def describe(self) -> dict[str, Callable[[], Any]]:
        return {"toy": lambda: {"distribution": {"name": "toy-kernels", "version": TOY_VERSION}}}


TOY = registry.Registration("toy", f"{__name__}:ToyBackend", versions={"toy": ("toy", "distribution", "version")})


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The table with the toy's entry, and a resolver that loads its registry from the table afresh."""
    monkeypatch.setattr(registry, "BACKENDS", (*registry.BACKENDS, TOY))
    monkeypatch.setattr(resolve, "_backends", {})
    monkeypatch.setattr(resolve, "_builtins_loaded", False)
    monkeypatch.delenv(resolve.MODE_ENV, raising=False)
    resolve.reset()
    yield
    resolve.reset()


def matrix_with(**changes: Any) -> dict:
    raw = copy.deepcopy(yaml.safe_load((ROOT / "matrix.yaml").read_text()))
    cell = next(c for c in raw["cells"] if c["name"] == "cpu")
    cell.update(changes)
    return raw


def test_a_backend_of_one_file_is_resolved_named_by_the_config_versioned_and_probed(with_toy) -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float32)
    # resolved: first in auto on the host, after passing its numeric probe against eager
    out = gdn.l2norm(x)
    assert resolve.last_route() == f"toy:{TOY_VERSION}"
    decision = resolve.resolve("l2norm", "cpu")
    assert decision.backend == "toy" and decision.probe is not None and decision.probe["passed"]
    expected = x.double() / torch.sqrt((x.double() ** 2).sum(-1, keepdim=True) + 1e-6)
    assert torch.linalg.vector_norm(out.double() - expected) / torch.linalg.vector_norm(expected) < 1e-6
    assert "toy" in gdn.modes()

    # named by matrix.yaml's validation: a cell may run under it and expect it
    expect = [{"op": "l2norm", "backend": "toy", "route": f"toy:{TOY_VERSION}"}]
    cell = config.parse_matrix(matrix_with(compute_mode="toy", expect=expect)).cell("cpu")
    assert cell.compute_mode == "toy" and cell.expect[0].backend == "toy"

    # probed: its own section in the manifest, its name in gdn's, its resolution on record
    manifest = probe.collect_manifest()
    assert manifest["toy"] == {"distribution": {"name": "toy-kernels", "version": TOY_VERSION}}
    assert list(manifest)[-3:] == ["toy", "checks", "resolution"]
    assert "toy" in manifest["gdn"]["backends"]
    [record] = [r for r in manifest["resolution"] if r["op"] == "l2norm" and r["device"] == "cpu"]
    assert record["route"] == f"toy:{TOY_VERSION}"

    # versioned: the version its entry names is among the versions the matrix records
    assert versions.versions(manifest)["toy"] == TOY_VERSION


def test_without_its_entry_the_toy_is_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(config.MatrixConfigError, match="unknown compute mode 'toy'"):
        config.parse_matrix(matrix_with(compute_mode="toy"))
    assert "toy" not in versions.versions({})


def test_every_reader_lists_the_backends_of_the_table() -> None:
    names = registry.names()
    assert names == ("eager", "ascendc", "triton", "fla", "flashqla", "torch_npu")
    assert list(resolve.backends()) == list(names)
    assert config.compute_modes() == ("auto", *names)
    for registration in registry.BACKENDS:
        loaded = registration.load()
        assert loaded.name == registration.name
        # each entry's version keys are read from sections its backend describes (the probe's manifest)
        sections = loaded.describe()
        assert {path[0] for path in registration.versions.values()} <= set(sections)


def test_a_plain_backend_takes_as_functions_what_a_subclass_defines_as_methods() -> None:
    plain = Backend(
        name="plain",
        ops={"l2norm": toy_l2norm},
        check=lambda device_type: "needs a GPU" if device_type == "cpu" else None,
        route=lambda op: "plain:1",
    )
    assert plain.why_unavailable("cpu") == "needs a GPU" and plain.why_unavailable("cuda") is None
    assert plain.route_of("l2norm") == "plain:1"
    assert Backend(name="bare", ops={}).route_of("l2norm") == "bare"
    # a copy keeps the functions given, and a subclass's copy its own methods
    assert replace(plain, name="copy").route_of("l2norm") == "plain:1"
    toy = replace(ToyBackend(), devices=("cpu", "cuda"))
    assert toy.route_of("l2norm") == f"toy:{TOY_VERSION}" and toy.implementation("l2norm") is toy_l2norm
    # an instance's function stands in for its class's method
    assert ToyBackend(route=lambda op: "toy:pinned").route_of("l2norm") == "toy:pinned"


def test_the_manifest_keeps_its_sections_in_their_order() -> None:
    """The sections the backends now describe come where the manifest always had them: the order they
    are written in is the order they are computed in (triton's driver before torch_npu's import, fla_npu
    before the ascendc routes)."""
    manifest = probe.collect_manifest(include_resolution=False)
    assert list(manifest) == ["schema", "generated_at", "hostname", *probe.LAYOUT, "checks"]
    layout = probe.LAYOUT
    assert layout.index("triton") < layout.index("torch_npu") and layout.index("fla_npu") < layout.index("ascendc")
