"""The kernels the peers themselves run, per cell, from the manifest's fla section (gdn.manifest): whether
fla imports, the kernel its own dispatch takes for the chunk op, whether its Hopper guard blocks the
gated backward, and the versions of the packages that decide it. The report shows them beside gdn's own
resolution; diff reports a change of them as a change of kernel."""

from __future__ import annotations

from typing import Any

from gdn.matrix.markdown import md_table


def fla_kernel(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    """None when the cell has no fla installed (or no manifest)."""
    fla = (manifest or {}).get("fla")
    if not isinstance(fla, dict) or "error" in fla:
        return None
    imported = fla.get("import") or {}
    if fla.get("distribution") is None and not imported.get("ok"):
        return None
    dispatch = fla.get("dispatch") or {}
    chunk = dispatch.get("chunk") or {}
    guard = dispatch.get("hopper_guard") or {}
    return {
        "version": (fla.get("distribution") or {}).get("version"),
        "import_error": None if imported.get("ok") else imported.get("error"),
        "chunk": chunk.get("chosen"),
        "hopper_guard_blocks": bool(guard.get("blocks_gated_backward")),
        "peer_packages": {k: v for k, v in (fla.get("peer_packages") or {}).items() if v},
        "stand_in": fla.get("stand_in"),
    }


def kernel_text(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not installed"
    if entry["import_error"]:
        return f"does not import: {entry['import_error']}"
    text = f"chunk -> {entry['chunk'] or 'unknown'}"
    if entry["hopper_guard_blocks"]:
        text += " (Hopper guard blocks the gated backward)"
    return text


def markdown(report: dict[str, Any]) -> list[str]:

    rows = []
    for cell in report["cells"]:
        entry = (cell.get("peer_kernels") or {}).get("fla")
        if entry is None:
            continue
        packages = ", ".join(f"{k} {v}" for k, v in entry["peer_packages"].items()) or "—"
        stand_in = f" [stand-in: {entry['stand_in']}]" if entry.get("stand_in") else ""
        rows.append([cell["name"], f"fla {entry['version']}{stand_in}", kernel_text(entry), packages])
    if not rows:
        return []
    return ["## Peer kernels", "", *md_table(["cell", "peer", "kernel it runs", "beside"], rows)]
