"""The one table of built-in backends, in registration order (auto's ties and every listing follow it).

Each entry names a backend, the class that is it (imported on first resolution, so reading the table
imports nothing but the standard library: matrix.yaml is checked against it without torch) and its
version source, where the probe's manifest records the versions of what it runs. The resolver, the
matrix's config, versions, probe and bench all read this table; a backend's behaviour is its class
(gdn.backends.base.Backend)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gdn.backends.base import Backend

# a version's place in the probe's manifest: section, then the keys under it
ManifestPath = tuple[str, ...]


@dataclass(frozen=True)
class Registration:
    name: str
    # "module:Class", the Backend subclass that serves under this name, or "module:NAME", the one instance
    # of it that the whole process shares (eager: the oracle every probe compares with)
    backend: str
    # version source: each version key the matrix records for this backend (gdn.matrix.versions), and
    # where the manifest has it (the backend's own manifest sections: Backend.describe)
    versions: Mapping[str, ManifestPath] = field(default_factory=dict)

    def load(self) -> Backend:
        module, _, name = self.backend.partition(":")
        found = getattr(importlib.import_module(module), name)
        return found() if isinstance(found, type) else found


BACKENDS: tuple[Registration, ...] = (
    Registration("eager", "gdn.backends.eager:EAGER"),
    Registration(
        "ascendc",
        "gdn.backends.ascendc.backend:AscendcBackend",
        versions={
            "fla_npu": ("fla_npu", "distribution", "version"),
            "fla_npu_generation": ("fla_npu", "api", "generation"),
        },
    ),
    # triton and triton-ascend install the same `triton` module: its version is what imports, else the
    # installed distribution's (gdn.matrix.versions)
    Registration("triton", "gdn.backends.triton:TritonBackend", versions={"triton_flavour": ("triton", "flavour")}),
    Registration(
        "fla",
        "gdn.backends.fla:FlaBackend",
        versions={
            "fla": ("fla", "distribution", "version"),
            # what fla's own dispatch hands its chunk op to, beside it (fla's section lists them)
            "flash_qla": ("fla", "peer_packages", "flash-qla"),
            "tilelang": ("fla", "peer_packages", "tilelang"),
        },
    ),
    Registration("flashqla", "gdn.backends.flashqla:FlashQLABackend"),
    Registration(
        "torch_npu",
        "gdn.backends.torch_npu_chunk:TorchNpuBackend",
        versions={"torch_npu": ("torch_npu", "distribution", "version")},
    ),
)


def names() -> tuple[str, ...]:
    """The built-in backends' names, in registration order."""
    return tuple(registration.name for registration in BACKENDS)


def version_paths() -> dict[str, ManifestPath]:
    """Every version key the built-in backends record, with its place in the manifest."""
    return {key: path for registration in BACKENDS for key, path in registration.versions.items()}
