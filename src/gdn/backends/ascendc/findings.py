"""The ascendc backend's sections of the probe's manifest: what the installed fla_npu exposes (its
distribution, whether it imports, its API generation) and the routes the backend resolved from it."""

from __future__ import annotations

from types import ModuleType

from gdn.backends.findings import Section, distribution, guarded, imported, mark_stand_in, section_of


def fla_npu_api(fla_npu: ModuleType) -> Section:
    """What the installed fla_npu exposes as imported, before anything is loaded from it."""
    from gdn.backends.ascendc import surface
    from gdn.backends.ascendc.raw import COMPOSITE_FWD

    has_loader = callable(getattr(fla_npu, "load_legacy_torch_ops", None))
    ascendc, stable = imported(surface.STABLE_MODULE)
    api: Section = {"load_legacy_torch_ops": has_loader, "legacy_torch_ops_loaded": None}
    is_loaded = getattr(fla_npu, "is_legacy_torch_ops_loaded", None)
    if callable(is_loaded):
        guarded(api, "legacy_torch_ops_loaded", lambda: bool(is_loaded()))
    api["stable_module"] = stable
    api["composite_fwd"] = ascendc is not None and hasattr(ascendc, COMPOSITE_FWD)
    guarded(api, "legacy_ops_registered", surface.legacy_registered)
    api["generation"] = surface.generation(has_loader, ascendc is not None, api["legacy_ops_registered"] is True)
    return api


def fla_npu_section() -> Section:
    from gdn.backends.ascendc import surface

    fla_npu, import_found = imported("fla_npu")
    section: Section = {"distribution": distribution(*surface.DISTRIBUTIONS), "import": import_found}
    if fla_npu is not None:
        mark_stand_in(section, fla_npu)
        section["api"] = section_of(lambda: fla_npu_api(fla_npu))
    return section


def ascendc_section() -> Section:
    """The ascendc backend's routes: fla_npu loaded as the backend loads it (legacy extension included),
    each op's route and why every other route was not taken, the conv probe, strict-mode violations."""
    from gdn.backends.ascendc import device, routes

    npu = device.locate()
    if npu.device is None:
        return {"reason": npu.error}
    return routes.plan().record()
