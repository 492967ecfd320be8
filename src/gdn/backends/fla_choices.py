"""fla's own kernel choices as the manifest records them (gdn.backends.fla_dispatch.describe, under the
manifest's fla section), read back into one entry per cell and written as one line of text: per dtype of
the call (bf16 and fp32), the kernel its dispatch takes for the chunk op and for the chunk_bwd_dqkwg its
backward dispatches again, and whether its Hopper guard blocks the gated backward. Torch-free: the
report and the manifest's summary both read it."""

from __future__ import annotations

from typing import Any

DQKWG = "chunk_bwd_dqkwg"  # the sub-function fla's chunk backward dispatches again (its common registry)


def fla_kernel(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """None when the cell has no fla installed (or no manifest)."""
    fla = (manifest or {}).get("fla")
    if not isinstance(fla, dict) or "error" in fla:
        return None
    imported = fla.get("import") or {}
    if fla.get("distribution") is None and not imported.get("ok"):
        return None
    calls = (fla.get("dispatch") or {}).get("calls") or {}
    return {
        "version": (fla.get("distribution") or {}).get("version"),
        "import_error": None if imported.get("ok") else imported.get("error"),
        "calls": {dtype: _choices(found) for dtype, found in calls.items() if isinstance(found, dict)},
        "peer_packages": {k: v for k, v in (fla.get("peer_packages") or {}).items() if v},
        "stand_in": fla.get("stand_in"),
    }


def _choices(found: dict[str, Any]) -> dict[str, Any]:
    """One dtype's choices: the chunk op's and chunk_bwd_dqkwg's kernels, the guard's verdict."""
    return {
        "chunk": (found.get("chunk") or {}).get("chosen"),
        DQKWG: (found.get(DQKWG) or {}).get("chosen"),
        "hopper_guard_blocks": bool((found.get("hopper_guard") or {}).get("blocks_gated_backward")),
        "error": found.get("error"),
    }


def choices_text(dtype: str, choices: dict[str, Any]) -> str:
    """ "float32: chunk -> triton, chunk_bwd_dqkwg -> tilelang" (the guard's verdict where it blocks)."""
    if choices.get("error"):
        return f"{dtype}: unknown ({choices['error']})"
    text = f"{dtype}: chunk -> {choices['chunk'] or 'unknown'}"
    if choices["chunk"] == "triton":  # fla's own function: its backward dispatches chunk_bwd_dqkwg
        text += f", {DQKWG} -> {choices[DQKWG] or 'unknown'}"
    if choices["hopper_guard_blocks"]:
        text += " (Hopper guard blocks the gated backward)"
    return text


def kernel_text(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not installed"
    if entry.get("import_error"):
        return f"does not import: {entry['import_error']}"
    if "calls" not in entry:
        # a report written before fla was asked per dtype: its one choice is that of a bf16 call
        older = _choices({"chunk": {"chosen": entry.get("chunk")}})
        older["hopper_guard_blocks"] = bool(entry.get("hopper_guard_blocks"))
        return f"{choices_text('bfloat16', older)} (asked of a bf16 call only)"
    return "; ".join(choices_text(dtype, choices) for dtype, choices in entry["calls"].items()) or "unknown"
