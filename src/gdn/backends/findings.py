"""What the probe's manifest (gdn.matrix.probe) finds about an installed package, for the sections the
backends describe (Backend.describe) and the probe's own: a missing or broken package is a finding,
never a failure. Standard library only."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import Any

from gdn.backends.base import describe_error

Section = dict[str, Any]


def section_of(build: Callable[[], Any]) -> Any:
    """What `build` returns, or {"error": "<ExcType>: <msg>"}: one broken section never stops the others."""
    try:
        return build()
    except Exception as exc:  # a broken package is what the manifest reports, never why it stops
        return {"error": describe_error(exc)}


def guarded(section: Section, key: str, compute: Callable[[], Any]) -> None:
    """Set section[key]; on failure set it to None and record the cause under `<key>_error`."""
    try:
        section[key] = compute()
    except Exception as exc:
        section[key] = None
        section[f"{key}_error"] = describe_error(exc)


def distribution(*names: str) -> dict[str, str] | None:
    """The first installed distribution among `names` (a package may be published under several)."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return {"name": dist.metadata["Name"] or name, "version": dist.version}
    return None


def imported(module: str) -> tuple[ModuleType | None, Section]:
    """The module, or None, and what importing it found: its version, or the exact error."""
    try:
        found = importlib.import_module(module)
    except Exception as exc:
        return None, {"ok": False, "error": describe_error(exc)}
    return found, {"ok": True, "version": getattr(found, "__version__", None)}


def mark_stand_in(section: Section, module: ModuleType) -> None:
    """The test stand-ins for torch_npu and fla_npu (tests/standins) carry a label: results they
    produced are marked as stand-in results in the manifest."""
    from gdn.backends.ascendc.surface import STAND_IN_ATTR

    label = getattr(module, STAND_IN_ATTR, None)
    if label is not None:
        section["stand_in"] = label
