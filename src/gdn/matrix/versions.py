"""The versions a probe manifest (gdn.matrix.probe.collect_manifest) records, and how they compare with a
cell's pins (matrix.yaml `versions`): the report shows the first, the cell runner records the second,
since a cell run outside its image (the host runtime) runs whatever the environment has."""

from __future__ import annotations

from typing import Any

from packaging.specifiers import InvalidSpecifier, Specifier
from packaging.version import InvalidVersion, Version

from gdn.backends import registry
from gdn.matrix.config import Versions
from gdn.matrix.schema import PinDifference

# The order the report lists versions in; a version key a backend records (gdn.backends.registry) that
# this order does not name comes last.
ORDER = (
    "python",
    "torch",
    "cuda",
    "triton",
    "triton_flavour",
    "torch_npu",
    "cann",
    "driver",
    "fla_npu",
    "fla_npu_generation",
    "fla",
    "flash_qla",
    "tilelang",
    "transformers",
)
# where each of the platform's versions lives in a probe manifest (the probe's own sections); the
# backends' are their version sources (gdn.backends.registry), and "triton" is read apart (_triton_version)
PLATFORM_PATHS: dict[str, tuple[str, ...]] = {
    "python": ("python", "version"),
    "torch": ("torch", "version"),
    "cuda": ("torch", "cuda"),
    "cann": ("cann", "toolkit", "version"),
    "driver": ("cann", "driver", "version"),
    "transformers": ("transformers", "distribution", "version"),
}


def version_paths() -> dict[str, tuple[str, ...]]:
    """Where the manifest has each version the matrix records, the report's order first."""
    paths = {**PLATFORM_PATHS, **registry.version_paths()}
    return {key: paths.get(key, ()) for key in (*ORDER, *(key for key in paths if key not in ORDER))}


VERSION_PATHS = version_paths()
VERSION_KEYS = tuple(VERSION_PATHS)
# Where the manifest has each pin. triton and triton-ascend install the same `triton` module, so their
# pins are read from the installed distributions, not from what imports.
SAME_PATH_PINS = (
    "python",
    "cann",
    "cuda",
    "torch",
    "torch_npu",
    "fla_npu",
    "fla",
    "flash_qla",
    "tilelang",
    "transformers",
)
PIN_PATHS: dict[str, tuple[str, ...]] = {
    **{key: VERSION_PATHS[key] for key in SAME_PATH_PINS},
    "triton": ("triton", "distributions", "triton"),
    "triton_ascend": ("triton", "distributions", "triton-ascend"),
}
# Pins that name a series, not a release: python 3.12 is every 3.12.x, CUDA 13.0 every 13.0.x.
SERIES_PINS = ("python", "cuda")
NOT_INSTALLED = "not installed"


def dig(data: Any, *keys: str) -> Any:
    """data[k0][k1]...; None where a section is missing or is a probe error ({"error": ...})."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _triton_version(manifest: dict[str, Any]) -> str | None:
    imported = dig(manifest, "triton", "import", "version")
    if imported:
        return imported
    # not importable (e.g. no driver): the installed distribution still says which version it is
    distributions = dig(manifest, "triton", "distributions")
    if isinstance(distributions, dict) and distributions:
        return next(iter(distributions.values()))
    return None


def versions(manifest: dict[str, Any] | None) -> dict[str, str | None]:
    found = {key: dig(manifest, *path) for key, path in version_paths().items()}
    found["triton"] = _triton_version(manifest or {})
    return {key: (str(value) if value is not None else None) for key, value in found.items()}


def matches(package: str, pinned: str, found: str) -> bool:
    """Whether `found` is the pinned release: a local label is a build of it (2.11.0+cu130 is 2.11.0),
    a post release is not; a series pin takes any release of the series. Versions that packaging
    cannot read match only themselves."""
    spec = f"=={pinned}.*" if package in SERIES_PINS else f"=={pinned}"
    try:
        return Specifier(spec).contains(Version(found), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return pinned == found


def _found(manifest: dict[str, Any], path: tuple[str, ...]) -> str:
    section = manifest.get(path[0])
    if isinstance(section, dict) and "error" in section:
        return f"unknown (the probe's {path[0]} section failed: {section['error']})"
    value = dig(manifest, *path)
    return NOT_INSTALLED if value is None else str(value)


def pin_differences(pins: Versions, manifest: dict[str, Any]) -> list[PinDifference]:
    """Every pin of the cell that the manifest's environment does not have, in the pins' order."""
    differences = []
    for package, pinned in pins.model_dump().items():
        if pinned is None:
            continue
        found = _found(manifest, PIN_PATHS[package])
        if found == NOT_INSTALLED or not matches(package, pinned, found):
            differences.append(PinDifference(package=package, pinned=pinned, found=found))
    return differences
