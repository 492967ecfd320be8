"""What the stand-in kernels refuse beyond their contracts (gdn.backends.ascendc.contracts, applied by
standins.conform): options whose math they do not compute."""

from __future__ import annotations


def not_modelled(op: str, **flags: object) -> None:
    """Options the stand-in does not compute are refused, never silently ignored."""
    for name, value in flags.items():
        if value not in (None, False):
            raise NotImplementedError(f"{op} stand-in: {name}={value!r} is not modelled")
