"""matrix.yaml: the cells of the test matrix, as one validated, typed configuration that the rest of
the matrix (nox sessions, images, cell runner, report, CI workflow) reads.

Every problem is a MatrixConfigError that names the file, the cell and the key: unknown keys,
duplicate names, missing fields, a docker cell without a Dockerfile, a Dockerfile or wheel that is
not on disk (checked when the cell's files are needed), an expectation naming an unknown op."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gdn.matrix import devices
from gdn.op_names import OP_NAMES

FAMILIES = ("probe", "single_op", "shape_grid", "grpo")
MATRIX_ENV = "GDN_MATRIX"
# The versions keys that are Python distributions, and their names on a package index; python, cann
# and cuda describe the base image instead.
DISTRIBUTIONS = {
    "torch": "torch",
    "torch_npu": "torch-npu",
    "triton": "triton",
    "triton_ascend": "triton-ascend",
    "fla_npu": "flash-linear-attention-npu",
    "fla": "fla-core",
    "transformers": "transformers",
}
# Describe the base image; every package pin reaches the image through the cell's lock instead.
BASE_IMAGE_KEYS = ("python", "cann", "cuda")
WHEELHOUSE_ENV = "GDN_WHEELHOUSE"

Family = Literal["probe", "single_op", "shape_grid", "grpo"]
Runtime = Literal["docker", "host"]


class MatrixConfigError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Versions(_Strict):
    """The software stack of a cell; each set version becomes a build arg (e.g. TORCH_NPU_VERSION)."""

    python: str | None = None
    cann: str | None = None
    cuda: str | None = None
    torch: str | None = None
    torch_npu: str | None = None
    triton: str | None = None
    triton_ascend: str | None = None
    fla_npu: str | None = None
    fla: str | None = None
    transformers: str | None = None

    def build_args(self) -> dict[str, str]:
        """What the Dockerfile checks its base image against (e.g. PYTHON_VERSION); the packages come
        from the lock, which the image tag covers."""
        values = self.model_dump()
        return {f"{key.upper()}_VERSION": values[key] for key in BASE_IMAGE_KEYS if values[key] is not None}

    def packages(self) -> dict[str, str]:
        """{versions key: pinned version} for the keys that are distributions."""
        values = self.model_dump()
        return {key: values[key] for key in DISTRIBUTIONS if values[key] is not None}


class Expectation(_Strict):
    """A resolution the cell must show, e.g. chunk_gated_delta_rule -> ascendc (route optional)."""

    op: str
    backend: str
    route: str | None = None

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        if op not in OP_NAMES:
            raise ValueError(f"unknown op {op!r}; expected one of {list(OP_NAMES)}")
        return op


class Cell(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    # a device kind of gdn.matrix.devices, read when a cell is validated (not frozen into a type)
    device: str
    runtime: Runtime
    dockerfile: str | None = None
    base_image: str | None = None
    versions: Versions = Versions()
    wheels: tuple[str, ...] = ()
    # versions keys whose distribution is on no index: the pin is the wheel file in `wheels`, installed
    # as is with its hash recorded in the lock (fla_npu; a triton-ascend that only vendors publish).
    wheelhouse_pins: tuple[str, ...] = ()
    runner_labels: tuple[str, ...] = ()
    families: tuple[Family, ...] = FAMILIES
    expect: tuple[Expectation, ...] = ()
    compute_mode: str = "auto"
    bench: bool = False
    timeout_s: int = Field(default=3600, gt=0)
    env: dict[str, str] = {}
    privileged: bool = False

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        devices.kind(device)
        return device

    @model_validator(mode="before")
    @classmethod
    def _kind_runner_labels(cls, raw: Any) -> Any:
        """A cell that names no runner labels gets its device kind's; `runner_labels: []` keeps it off CI."""
        if isinstance(raw, dict) and "runner_labels" not in raw and raw.get("device") in devices.KINDS:
            return {**raw, "runner_labels": devices.KINDS[raw["device"]].runner_labels}
        return raw

    @model_validator(mode="after")
    def _docker_needs_image(self) -> Cell:
        if self.runtime == "docker":
            for key in ("dockerfile", "base_image"):
                if not getattr(self, key):
                    raise ValueError(f"{key}: required when runtime is docker")
        if not self.families:
            raise ValueError("families: at least one test family")
        return self

    @model_validator(mode="after")
    def _wheels_match_pins(self) -> Cell:
        """Each wheel is the file of one pinned package, at its pinned version; each wheelhouse pin has
        its wheel. A wheel that is not a wheelhouse pin is resolved from the wheelhouse with its
        dependencies (torch+cpu)."""
        pins = self.versions.packages()
        by_distribution = {canonicalize_name(DISTRIBUTIONS[key]): key for key in pins}
        for wheel in self.wheels:
            try:
                name, version, _, _ = parse_wheel_filename(wheel)
            except InvalidWheelFilename as exc:
                raise ValueError(f"wheels: {wheel!r} is not a wheel file name: {exc}") from None
            key = by_distribution.get(name)
            if key is None:
                raise ValueError(f"wheels: {wheel!r} is {name} {version}, which the cell's versions do not pin")
            if Version(version.public) != Version(pins[key]):
                raise ValueError(f"wheels: {wheel!r} is {name} {version}, the cell pins {key} {pins[key]}")
        for key in self.wheelhouse_pins:
            if key not in pins:
                raise ValueError(f"wheelhouse_pins: {key!r} is not a package version this cell pins")
            if key not in self.wheel_keys().values():
                raise ValueError(f"wheelhouse_pins: {key!r} has no wheel file in `wheels`")
        return self

    def wheel_keys(self) -> dict[str, str]:
        """{wheel file: the versions key it provides}."""
        by_distribution = {canonicalize_name(DISTRIBUTIONS[key]): key for key in self.versions.packages()}
        return {wheel: by_distribution[parse_wheel_filename(wheel)[0]] for wheel in self.wheels}

    @property
    def build_args(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image or "", **self.versions.build_args()}

    @property
    def locked(self) -> bool:
        """Whether the cell has a lock file: a cell that pins no package (the host `local` cell) runs
        whatever its environment has."""
        return bool(self.versions.packages())

    def in_runtime(self, runtime: Runtime) -> Cell:
        """This cell run in another runtime (a docker cell on a GPU box without docker, say), validated
        like any cell: a host cell has no image to run in."""
        try:
            return Cell.model_validate({**self.model_dump(), "runtime": runtime})
        except ValidationError as exc:
            reasons = "; ".join(e["msg"] for e in exc.errors())
            raise MatrixConfigError(f"cell {self.name!r} cannot run in the {runtime} runtime: {reasons}") from None


class Matrix(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    wheelhouse: str = "wheelhouse"
    # Where the cells' lock files lie (locks/<cell>.txt), relative to the checkout.
    locks: str = "locks"
    cells: tuple[Cell, ...]

    @field_validator("cells")
    @classmethod
    def _unique_names(cls, cells: tuple[Cell, ...]) -> tuple[Cell, ...]:
        seen: set[str] = set()
        for cell in cells:
            if cell.name in seen:
                raise ValueError(f"duplicate cell name {cell.name!r}")
            seen.add(cell.name)
        return cells

    def cell(self, name: str) -> Cell:
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise MatrixConfigError(f"no cell named {name!r}; cells: {[c.name for c in self.cells]}")


def _where(raw: Any, loc: tuple) -> str:
    """`cell 'npu-2610': key 'versions.fla_npuu'` from a pydantic error location."""
    if len(loc) >= 2 and loc[0] == "cells" and isinstance(loc[1], int):
        cells = raw.get("cells") if isinstance(raw, dict) else None
        entry = cells[loc[1]] if isinstance(cells, list) and loc[1] < len(cells) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"cell {name!r}" if name else f"cell #{loc[1]}"
        key = ".".join(str(p) for p in loc[2:]) or "(the cell)"
        return f"{label}: key {key!r}"
    return f"key {'.'.join(str(p) for p in loc) or '(top level)'!r}"


def _explain(raw: Any, error: dict) -> str:
    message = {"extra_forbidden": "unknown key", "missing": "missing field"}.get(error["type"], error["msg"])
    return f"{_where(raw, tuple(error['loc']))}: {message}"


def parse_matrix(raw: Any, source: str = "matrix.yaml") -> Matrix:
    if not isinstance(raw, dict):
        raise MatrixConfigError(f"{source}: expected a mapping with 'schema' and 'cells', got {type(raw).__name__}")
    try:
        return Matrix.model_validate(raw)
    except ValidationError as exc:
        lines = [_explain(raw, e) for e in exc.errors()]
        raise MatrixConfigError(f"{source}: " + "; ".join(lines)) from None


def default_matrix_path() -> Path:
    return Path(os.environ.get(MATRIX_ENV) or "matrix.yaml")


def load_matrix(path: str | Path | None = None) -> Matrix:
    path = Path(path) if path is not None else default_matrix_path()
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixConfigError(f"{path}: cannot read the matrix: {exc}") from None
    except yaml.YAMLError as exc:
        raise MatrixConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_matrix(raw, str(path))


def wheelhouse_dir(matrix: Matrix, root: Path) -> Path:
    return Path(os.environ.get(WHEELHOUSE_ENV) or root / matrix.wheelhouse)


def lock_path(matrix: Matrix, cell: Cell, root: Path) -> Path:
    return root / matrix.locks / f"{cell.name}.txt"


def cell_files(matrix: Matrix, cell: Cell, root: Path) -> dict[str, Path]:
    """The files a cell's image is built from, keyed by where they are named; each must exist."""
    files: dict[str, Path] = {}
    if cell.dockerfile:
        files["dockerfile"] = root / cell.dockerfile
    if cell.locked:
        files["lock"] = lock_path(matrix, cell, root)
    house = wheelhouse_dir(matrix, root)
    for i, wheel in enumerate(cell.wheels):
        files[f"wheels[{i}]"] = house / wheel
    for key, path in files.items():
        if not path.is_file():
            hint = f"; make it with `gdn-matrix lock {cell.name}`" if key == "lock" else ""
            raise MatrixConfigError(f"cell {cell.name!r}: key {key!r}: file {path} does not exist{hint}")
    return files
