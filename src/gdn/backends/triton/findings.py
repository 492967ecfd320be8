"""The triton backend's section of the probe's manifest: which Triton distributions are installed,
whether `triton` imports, whether it interprets, and the target its active driver reports (or why there
is none)."""

from __future__ import annotations

import os

from gdn.backends.base import describe_error
from gdn.backends.findings import Section, distribution, imported

TRITON_DISTRIBUTIONS = ("triton", "triton-ascend")
NO_DRIVER = "no GPU driver: none of Triton's backends finds a device here"


def _triton_target(section: Section) -> None:
    try:
        from triton.backends import backends
        from triton.runtime import driver

        # Triton says "0 active drivers ... There should only be one" where there is no GPU at all
        if not any(backend.driver.is_active() for backend in backends.values()):
            section.update(active_backend=None, arch=None, active_backend_error=NO_DRIVER)
            return
        target = driver.active.get_current_target()
    except Exception as exc:  # no GPU or NPU, no driver, or one that fails to initialise
        section.update(active_backend=None, arch=None, active_backend_error=describe_error(exc))
        return
    section.update(active_backend=target.backend, arch=str(target.arch))


def triton_section() -> Section:
    installed = {name: dist["version"] for name in TRITON_DISTRIBUTIONS if (dist := distribution(name))}
    triton, import_found = imported("triton")
    section: Section = {
        # both flavours install the same `triton` package directory, so "triton+triton-ascend" means
        # whichever was installed last won
        "flavour": "+".join(installed) or None,
        "distributions": installed,
        "import": import_found,
        # the values triton itself accepts for its boolean knobs
        "interpret": os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on"),
    }
    if triton is None:
        section.update(active_backend=None, arch=None, active_backend_error="triton is not importable")
    else:
        _triton_target(section)
    return section
