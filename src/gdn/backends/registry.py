"""The table of built-in backends, found in the gdn.backends package itself.

Every module of the package (its subpackages' included) that declares, at top level,

    REGISTRATION = Registration(name=..., backend=..., order=..., versions=...)

registers the backend it names: a new backend is one module dropped into the package. The declaration
is read from the module's source (its arguments are literals), never by importing the module, so reading
the table imports nothing but the standard library (matrix.yaml is checked against it on machines
without torch); the backend itself is imported on first resolution. The table is in `order` (auto's ties
and every listing follow it), and two declarations of one name are an error. The resolver, the matrix's
config, versions, probe and bench all read this table; a backend's behaviour is its class
(gdn.backends.base.Backend)."""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gdn.backends.base import Backend

PACKAGE = "gdn.backends"
# the top-level name a backend's module declares itself under
DECLARATION = "REGISTRATION"
# a version's place in the probe's manifest: section, then the keys under it
ManifestPath = tuple[str, ...]


class RegistrationError(ValueError):
    """A declaration the registry cannot take: two backends of one name, or one it cannot read."""


@dataclass(frozen=True)
class Registration:
    name: str
    # the declaring module's attribute that serves under this name: a Backend subclass, or the one
    # instance of it that the whole process shares (eager: the oracle every probe compares with)
    backend: str
    # the backend's place in the table, lower first: auto's ties and every listing follow it
    order: int
    # version source: each version key the matrix records for this backend (gdn.matrix.versions), and
    # where the manifest has it (the backend's own manifest sections: Backend.describe)
    versions: Mapping[str, ManifestPath] = field(default_factory=dict)
    # the module that declares it, which the registry fills in from where it found the declaration
    module: str = ""

    def load(self) -> Backend:
        found = getattr(importlib.import_module(self.module), self.backend)
        backend = found() if isinstance(found, type) else found
        if backend.name != self.name:
            raise RegistrationError(
                f"{self.module}.{self.backend} is named {backend.name!r}, registered as {self.name!r}"
            )
        return backend


def registrations() -> tuple[Registration, ...]:
    """The built-in backends' declarations, in the table's order."""
    return _found(tuple(importlib.import_module(PACKAGE).__path__))


def names() -> tuple[str, ...]:
    """The built-in backends' names, in the table's order."""
    return tuple(registration.name for registration in registrations())


def version_paths() -> dict[str, ManifestPath]:
    """Every version key the built-in backends record, with its place in the manifest."""
    return {key: path for registration in registrations() for key, path in registration.versions.items()}


@functools.cache
def _found(path: tuple[str, ...]) -> tuple[Registration, ...]:
    declared: dict[str, Registration] = {}
    for module, source in _modules(list(path), f"{PACKAGE}."):
        registration = _declaration(module, source)
        if registration is None:
            continue
        if registration.name in declared:
            raise RegistrationError(
                f"two backends named {registration.name!r}: {declared[registration.name].module} and {module}"
            )
        declared[registration.name] = registration
    return tuple(sorted(declared.values(), key=lambda registration: (registration.order, registration.name)))


def _modules(path: list[str], prefix: str) -> Iterator[tuple[str, Path]]:
    """Every module under `path` with its source file, subpackages walked through their directories
    (pkgutil.walk_packages would import each subpackage)."""
    for info in pkgutil.iter_modules(path, prefix):
        spec = info.module_finder.find_spec(info.name, None)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        yield info.name, Path(spec.origin)
        if info.ispkg and spec.submodule_search_locations:
            yield from _modules(list(spec.submodule_search_locations), f"{info.name}.")


def _declaration(module: str, source: Path) -> Registration | None:
    text = source.read_text(encoding="utf-8")
    if DECLARATION not in text:  # most modules: no need to parse them
        return None
    for statement in ast.parse(text, str(source)).body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == DECLARATION for target in statement.targets
        ):
            return replace(_registration(statement.value, module), module=module)
    return None


def _registration(value: ast.expr, module: str) -> Registration:
    where = f"{module}: {DECLARATION}"
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Registration"):
        raise RegistrationError(f"{where} must be a call of Registration(...), got {ast.unparse(value)}")
    try:
        args = [ast.literal_eval(arg) for arg in value.args]
        kwargs = {keyword.arg: ast.literal_eval(keyword.value) for keyword in value.keywords}
        return Registration(*args, **kwargs)
    except (ValueError, TypeError, SyntaxError) as exc:
        raise RegistrationError(f"{where} takes literal arguments of Registration only: {exc}") from None
