"""One way to add a backend: a module dropped into the gdn.backends package, declaring a Backend subclass
(its REGISTRATION, read from its source by gdn.backends.registry), is resolved, named by matrix.yaml's
validation, versioned, probed and benchmarked, with no other file touched; and the table it joins is the
one list every reader has."""

from __future__ import annotations

import copy
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import gdn
import gdn.backends
from gdn import resolve
from gdn.backends import registry
from gdn.backends.base import Backend
from gdn.matrix import bench, config, probe, versions
from repo_paths import ROOT, TESTS
from toy_backend import TOY_VERSION, ToyBackend, toy_l2norm

pytestmark = pytest.mark.tooling

TOY_SOURCE = (TESTS / "toy_backend.py").read_text()
BUILT_IN = ("eager", "ascendc", "triton", "fla", "flashqla", "torch_npu")


def drop_into_package(monkeypatch: pytest.MonkeyPatch, directory: Path, modules: dict[str, str]) -> None:
    """Each module (name -> source) written into `directory`, which joins the gdn.backends package's path:
    the package as it would be with those files added to it."""
    for name, source in modules.items():
        (directory / f"{name}.py").write_text(source)
    monkeypatch.setattr(gdn.backends, "__path__", [*gdn.backends.__path__, str(directory)])
    importlib.invalidate_caches()
    for name in modules:  # imported by the test (the resolver loads them): gone with the directory
        monkeypatch.delitem(sys.modules, f"gdn.backends.{name}", raising=False)
        monkeypatch.delattr(gdn.backends, name, raising=False)


@pytest.fixture
def fresh_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A resolver that loads its registry from the table afresh, and forgets it afterwards."""
    monkeypatch.setattr(resolve, "_backends", {})
    monkeypatch.setattr(resolve, "_builtins_loaded", False)
    monkeypatch.delenv(resolve.MODE_ENV, raising=False)
    resolve.reset()
    yield
    resolve.reset()


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fresh_resolver: None) -> None:
    """The package with the toy's one file dropped into it."""
    drop_into_package(monkeypatch, tmp_path, {"toy": TOY_SOURCE})


def matrix_with(**changes: Any) -> dict:
    raw = copy.deepcopy(yaml.safe_load((ROOT / "matrix.yaml").read_text()))
    cell = next(c for c in raw["cells"] if c["name"] == "cpu")
    cell.update(changes)
    return raw


def test_a_backend_of_one_file_is_resolved_named_by_the_config_versioned_and_probed(with_toy) -> None:
    # listed from its source, never imported for it: the table stays free of torch
    assert registry.names() == (*BUILT_IN, "toy")
    assert "gdn.backends.toy" not in sys.modules

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

    # benchmarked: the cell's bench times it on the host, after gdn's own backends (it is a peer)
    assert "toy" in bench.serving("cpu")
    assert bench.timing_order(["toy", "triton", "eager"]) == ["triton", "eager", "toy"]


def test_without_its_entry_the_toy_is_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(config.MatrixConfigError, match="unknown compute mode 'toy'"):
        config.parse_matrix(matrix_with(compute_mode="toy"))
    assert "toy" not in versions.versions({})


def test_every_reader_lists_the_backends_of_the_table() -> None:
    names = registry.names()
    assert names == BUILT_IN
    assert list(resolve.backends()) == list(names)
    assert config.compute_modes() == ("auto", *names)
    for registration in registry.registrations():
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


def test_a_backends_order_not_its_file_decides_its_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    drop_into_package(monkeypatch, tmp_path, {"toy": TOY_SOURCE.replace("order=60", "order=15")})
    assert registry.names() == ("eager", "ascendc", "toy", "triton", "fla", "flashqla", "torch_npu")


def test_two_backends_of_one_name_are_refused_with_both_modules_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    second = TOY_SOURCE.replace('name="toy"', 'name="triton"')
    drop_into_package(monkeypatch, tmp_path, {"second_triton": second})
    message = re.escape("two backends named 'triton': gdn.backends.triton and gdn.backends.second_triton")
    with pytest.raises(registry.RegistrationError, match=message):
        registry.names()
    with pytest.raises(registry.RegistrationError, match=message):
        config.compute_modes()


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ('NAME = "toy"\nREGISTRATION = Registration(name=NAME, backend="ToyBackend", order=60)', "literal arguments"),
        ('REGISTRATION = Registration(name="toy", order=60)', "literal arguments.*backend"),
        ('REGISTRATION = dict(name="toy", backend="ToyBackend", order=60)', r"must be a call of Registration"),
    ],
)
def test_a_declaration_the_registry_cannot_read_is_an_error_naming_its_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, declaration: str, message: str
) -> None:
    drop_into_package(monkeypatch, tmp_path, {"unread": declaration + "\n"})
    with pytest.raises(registry.RegistrationError, match=f"gdn.backends.unread: REGISTRATION .*{message}"):
        registry.names()


def test_a_declaration_under_another_name_than_its_backends_is_refused_on_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    drop_into_package(monkeypatch, tmp_path, {"toy": TOY_SOURCE.replace('name="toy", backend', 'name="tay", backend')})
    [registration] = [r for r in registry.registrations() if r.name == "tay"]
    with pytest.raises(
        registry.RegistrationError, match=re.escape("gdn.backends.toy.ToyBackend is named 'toy', registered as 'tay'")
    ):
        registration.load()


def test_the_table_and_the_matrix_config_import_no_backend_and_no_torch() -> None:
    """matrix.yaml is validated, and the CLI lists its choices, on machines without torch."""
    code = (
        "import sys\n"
        "from gdn.backends import registry\n"
        "from gdn.matrix import cli, config, versions\n"
        "assert config.compute_modes()[1:] == registry.names() and versions.VERSION_KEYS\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton') or m in "
        f"{[registration.module for registration in registry.registrations()]!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
