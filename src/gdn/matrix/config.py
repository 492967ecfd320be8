"""matrix.yaml: the cells of the test matrix, as one validated, typed configuration that the rest of
the matrix (nox sessions, images, cell runner, report, CI workflow) reads.

Every problem is a MatrixConfigError that names the file, the cell and the key (or the line): a file
that is not UTF-8 YAML, a duplicate key, an anchor or alias, nesting deeper than a matrix needs,
unknown keys, a value of another type than the key's (never converted: `timeout_s: true` is refused),
duplicate names, missing fields, a docker cell without a Dockerfile, a Dockerfile or wheel that is
not on disk or lies outside the checkout / wheelhouse (checked when the cell's files are needed), an
expectation naming an unknown op or backend, a version that is not a version, a name that is no image
reference, runner labels that cannot reach a runner of the cell's device kind, an environment variable
that steers a loader or an interpreter, a directory out of the checkout or in its .git.

matrix.yaml comes with a pull request, so nothing in it is trusted: versions reach image builds (they
must never be able to carry code), paths name files copied into build contexts."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gdn.backends import registry
from gdn.matrix import devices
from gdn.matrix.jsonio import UnreadableFileError, read_capped
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
    # FlashQLA and the TileLang it compiles with: fla hands its chunk op to them when they import
    "flash_qla": "flash-qla",
    "tilelang": "tilelang",
    "transformers": "transformers",
}
# Describe the base image; every package pin reaches the image through the cell's lock instead.
BASE_IMAGE_KEYS = ("python", "cann", "cuda")
WHEELHOUSE_ENV = "GDN_WHEELHOUSE"

Family = Literal["probe", "single_op", "shape_grid", "grpo"]
Runtime = Literal["docker", "host"]


def compute_modes() -> tuple[str, ...]:
    """gdn_compute_mode inside a cell: auto or a built-in backend (gdn.resolve.modes() without torch)."""
    return ("auto", *registry.names())


# The base-image keys are what the image's own tools report: Python's and CUDA's major.minor (3.12,
# 13.0), CANN's release (8.5.0) or release candidate (8.0.RC1, 8.0.RC2.beta1).
BASE_IMAGE_VERSION = {
    "python": re.compile(r"3\.[0-9]{1,2}"),
    "cuda": re.compile(r"[0-9]{1,2}\.[0-9]{1,2}"),
    "cann": re.compile(r"[0-9]{1,2}\.[0-9]{1,2}\.(?:[0-9]{1,3}|RC[0-9]{1,2})(?:\.(?:alpha|beta)[0-9]{1,3})?"),
}
# Docker's reference grammar (distribution/reference): a cell's name is one path component of its
# image's repository (gdn-matrix/<name>), its base image a whole reference.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:]+\])"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?"
)
CELL_NAME = re.compile(_COMPONENT)
# A repository name may have 255 characters; gdn-matrix/ takes 11 of them.
CELL_NAME_MAX = 128
# A matrix is a few kilobytes; nothing in one is nested more than 5 levels.
MATRIX_MAX_BYTES = 1 << 20
MATRIX_MAX_DEPTH = 32
# A cell's `env` reaches the cell's processes, and in the host runtime the runner's own environment:
# plain variable names only, and none that decides what code a process loads (the dynamic loader's,
# Python's, glibc's iconv modules) or what a shell runs before its command.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
LOADER_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
LOADER_ENV_NAMES = frozenset({"PATH", "GCONV_PATH", "BASH_ENV", "ENV"})


class MatrixConfigError(ValueError):
    pass


class _Refused(yaml.YAMLError):
    """What the matrix loader refuses where yaml would accept it; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


class _MatrixLoader(yaml.SafeLoader):
    """yaml's safe loader without what it resolves silently or at any cost: a duplicate key (yaml keeps
    the last: a second `cells: []` dropped every cell), an anchor or alias (a few lines can stand for
    millions of values), nesting past MATRIX_MAX_DEPTH (yaml composes recursively: 20,000 brackets
    exhaust Python's stack)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark.line + 1, "anchors and aliases are not used in a matrix")
        self._depth += 1
        try:
            if self._depth > MATRIX_MAX_DEPTH:
                raise _Refused(event.start_mark.line + 1, f"nested deeper than {MATRIX_MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in first:
                    raise _Refused(line, f"duplicate key {key!r} (first at line {first[key]})")
                first[key] = line
            except TypeError:  # an unhashable key: yaml's own construction refuses it
                continue
        return super().construct_mapping(node, deep)


class _Strict(BaseModel):
    # strict: a value of another type is refused, never converted (`timeout_s: true` is not 1)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
    flash_qla: str | None = None
    tilelang: str | None = None
    transformers: str | None = None

    @field_validator("python", "cuda", "cann")
    @classmethod
    def _base_image_version(cls, value: str | None, info: ValidationInfo) -> str | None:
        pattern = BASE_IMAGE_VERSION[info.field_name]
        if value is not None and not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not a {info.field_name} version (expected {pattern.pattern})")
        return value

    @field_validator(*DISTRIBUTIONS)
    @classmethod
    def _package_version(cls, value: str | None) -> str | None:
        """A PEP 440 version in its normal form, so a pin carries nothing but a version (no specifier,
        marker, URL or option) wherever it is written."""
        if value is None:
            return None
        try:
            normal = str(Version(value))
        except InvalidVersion:
            raise ValueError(f"{value!r} is not a PEP 440 version") from None
        if normal != value:
            raise ValueError(f"{value!r} is not a version in normal form; write {normal!r}")
        return value

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

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        if backend not in registry.names():
            raise ValueError(f"unknown backend {backend!r}; expected one of {list(registry.names())}")
        return backend


class Limits(_Strict):
    """What a cell's container may use; the engine stops it there (a runaway test, a fork bomb)."""

    # docker's --memory: a number with a unit (k, m, g)
    memory: str = Field(default="64g", pattern=r"^[1-9][0-9]*[kmg]$")
    # processes and threads together: pytest-xdist workers, their torch threads, Triton's compilers
    pids: int = Field(default=8192, gt=0)


def _in_git(parts: tuple[str, ...]) -> bool:
    return any(part.casefold() == ".git" for part in parts)


def _checkout_relative(value: str, what: str) -> str:
    """A path inside the checkout, as matrix.yaml may name one: relative, never through `..`, never in
    .git. Symlinks are followed, and checked, where the file is used."""
    path = PurePosixPath(value)
    if path.is_absolute() or "\\" in value or ".." in path.parts or not path.parts:
        raise ValueError(f"{value!r} is not a relative path inside the {what} (no absolute path, no '..')")
    if _in_git(path.parts):
        raise ValueError(f"{value!r} lies in .git, which holds the repository, not the matrix's files")
    return value


class Cell(_Strict):
    name: str = Field(max_length=CELL_NAME_MAX)
    description: str = ""
    # a device kind of gdn.matrix.devices, read when a cell is validated (not frozen into a type)
    device: str
    runtime: Runtime
    dockerfile: str | None = None
    base_image: str | None = None
    versions: Versions = Versions()
    wheels: Annotated[tuple[str, ...], Field(strict=False)] = ()
    # versions keys whose distribution is on no index: the pin is the wheel file in `wheels`, installed
    # as is with its hash recorded in the lock (fla_npu; a triton-ascend that only vendors publish).
    wheelhouse_pins: Annotated[tuple[str, ...], Field(strict=False)] = ()
    runner_labels: Annotated[tuple[str, ...], Field(strict=False)] = ()
    families: Annotated[tuple[Family, ...], Field(strict=False)] = FAMILIES
    expect: Annotated[tuple[Expectation, ...], Field(strict=False)] = ()
    compute_mode: str = "auto"
    # the mode the probe (the manifest's resolution of every op) runs under, when it is not compute_mode
    probe_mode: str | None = None
    bench: bool = False
    timeout_s: int = Field(default=3600, gt=0)
    limits: Limits = Limits()
    env: dict[str, str] = {}
    privileged: bool = False

    @field_validator("name")
    @classmethod
    def _image_name(cls, name: str) -> str:
        if not CELL_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} cannot name an image (gdn-matrix/<name>): lowercase letters and digits, joined by"
                " single '.' or '_', '__' or runs of '-', neither first nor last"
            )
        return name

    @field_validator("base_image")
    @classmethod
    def _image_reference(cls, image: str | None) -> str | None:
        if image is not None and not IMAGE_REFERENCE.fullmatch(image):
            raise ValueError(f"{image!r} is not an image reference ([registry/]repository[:tag][@digest])")
        return image

    @field_validator("dockerfile")
    @classmethod
    def _dockerfile_in_checkout(cls, dockerfile: str | None) -> str | None:
        return None if dockerfile is None else _checkout_relative(dockerfile, "checkout")

    @field_validator("wheels")
    @classmethod
    def _wheels_are_file_names(cls, wheels: tuple[str, ...]) -> tuple[str, ...]:
        for wheel in wheels:
            if wheel != PurePosixPath(wheel).name or "\\" in wheel or wheel in (".", ".."):
                raise ValueError(f"{wheel!r} is not a file name: wheels are files in the wheelhouse")
        return wheels

    @field_validator("env")
    @classmethod
    def _plain_environment(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name ({ENV_NAME.pattern})")
            if name.startswith(LOADER_ENV_PREFIXES) or name in LOADER_ENV_NAMES:
                raise ValueError(
                    f"{name!r} is not an environment variable a cell may set: it decides what code a loader, "
                    "the interpreter or a shell runs"
                )
            if "\0" in value:
                raise ValueError(f"the value of {name!r} holds a NUL, which no environment variable can carry")
        return env

    @field_validator("compute_mode", "probe_mode")
    @classmethod
    def _known_mode(cls, mode: str | None) -> str | None:
        if mode is not None and mode not in compute_modes():
            raise ValueError(f"unknown compute mode {mode!r}; expected one of {list(compute_modes())}")
        return mode

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        devices.kind(device)
        return device

    @model_validator(mode="before")
    @classmethod
    def _kind_runner_labels(cls, raw: Any) -> Any:
        """A cell that names no runner labels gets its device kind's; `runner_labels: []` keeps it off CI."""
        device = raw.get("device") if isinstance(raw, dict) else None
        if isinstance(device, str) and "runner_labels" not in raw and device in devices.KINDS:
            return {**raw, "runner_labels": devices.KINDS[raw["device"]].runner_labels}
        return raw

    @model_validator(mode="after")
    def _labels_reach_the_device(self) -> Cell:
        """An accelerator cell's job must be able to land on a runner of its kind: not on a GitHub-hosted
        runner (none has an NPU or our GPUs) and not only on another kind's runners (devices.KINDS)."""
        kind = devices.kind(self.device)
        labels = set(self.runner_labels)
        if not kind.accelerator or not labels:
            return self
        hosted = sorted(label for label in labels if label.lower() in devices.GITHUB_HOSTED_LABELS)
        if hosted:
            raise ValueError(f"runner_labels: {hosted} name GitHub-hosted runners, which have no {self.device} device")
        for other in devices.KINDS.values():
            foreign = sorted(labels & set(other.runner_labels) - set(kind.runner_labels))
            if other.name != self.device and (foreign or labels <= set(other.runner_labels)):
                raise ValueError(
                    f"runner_labels: {sorted(labels)} reach {other.name} runners (labels"
                    f" {list(other.runner_labels)}), not only {self.device} ones ({list(kind.runner_labels)})"
                )
        return self

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
    cells: Annotated[tuple[Cell, ...], Field(strict=False)]

    @field_validator("wheelhouse", "locks")
    @classmethod
    def _in_checkout(cls, path: str) -> str:
        return _checkout_relative(path, "checkout")

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


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MatrixConfigError(
            f"{path}: line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x}); a matrix is a UTF-8 file"
        ) from None


def load_matrix(path: str | Path | None = None) -> Matrix:
    path = Path(path) if path is not None else default_matrix_path()
    try:
        data = read_capped(path, MATRIX_MAX_BYTES, follow_symlinks=True)
    except (OSError, UnreadableFileError) as exc:
        raise MatrixConfigError(f"{path}: cannot read the matrix: {exc}") from None
    try:
        raw = yaml.load(_text(path, data), Loader=_MatrixLoader)  # a SafeLoader, stricter still
    except _Refused as exc:
        raise MatrixConfigError(f"{path}: line {exc.line}: {exc}") from None
    except yaml.YAMLError as exc:
        raise MatrixConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_matrix(raw, str(path))


def wheelhouse_dir(matrix: Matrix, root: Path) -> Path:
    """$GDN_WHEELHOUSE (the operator's choice), else matrix.yaml's `wheelhouse` in the checkout."""
    chosen = os.environ.get(WHEELHOUSE_ENV)
    return Path(chosen) if chosen else _confined(root, "wheelhouse", matrix.wheelhouse)


def lock_path(matrix: Matrix, cell: Cell, root: Path) -> Path:
    return _confined(root, "locks", matrix.locks) / f"{cell.name}.txt"


def _confined(root: Path, key: str, relative: str) -> Path:
    """root / relative, which must stay in the checkout and out of its .git with every symlink followed
    (matrix.yaml names it; the load refused absolute paths, `..` and .git as written)."""
    path = root / relative
    resolved, top = path.resolve(), root.resolve()
    if not resolved.is_relative_to(top):
        raise MatrixConfigError(f"key {key!r}: {path} leads to {resolved}, outside {top}")
    if _in_git(resolved.relative_to(top).parts):
        raise MatrixConfigError(f"key {key!r}: {path} leads to {resolved}, inside the repository's .git")
    return path


def _inside(path: Path, top: Path) -> bool:
    """Whether `path`, every symlink followed, lies under `top` (itself resolved)."""
    return path.resolve().is_relative_to(top.resolve())


def cell_files(matrix: Matrix, cell: Cell, root: Path) -> dict[str, Path]:
    """The files a cell's image is built from, keyed by where they are named; each must exist and lie
    where it is named: the Dockerfile and lock in the checkout, the wheels in the wheelhouse (a symlink
    out of either is refused, as it would carry a file of the host into a build context)."""
    house = wheelhouse_dir(matrix, root)
    files: dict[str, tuple[Path, Path]] = {}
    if cell.dockerfile:
        files["dockerfile"] = (root / cell.dockerfile, root)
    if cell.locked:
        files["lock"] = (lock_path(matrix, cell, root), root)
    for i, wheel in enumerate(cell.wheels):
        files[f"wheels[{i}]"] = (house / wheel, house)
    for key, (path, top) in files.items():
        if not path.is_file():
            hint = f"; make it with `gdn-matrix lock {cell.name}`" if key == "lock" else ""
            raise MatrixConfigError(f"cell {cell.name!r}: key {key!r}: file {path} does not exist{hint}")
        if not _inside(path, top):
            raise MatrixConfigError(
                f"cell {cell.name!r}: key {key!r}: {path} leads to {path.resolve()}, outside {top.resolve()}"
            )
    return {key: path for key, (path, _) in files.items()}
