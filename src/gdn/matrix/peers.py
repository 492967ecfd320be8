"""The kernels the peers themselves run, per cell, from the manifest's fla section (gdn.backends.fla): whether
fla imports, per dtype of the call (bf16 and fp32) the kernel its own dispatch takes for the chunk op and
for the chunk_bwd_dqkwg its backward dispatches again, whether its Hopper guard blocks the gated
backward, and the versions of the packages that decide it. The report shows them beside gdn's own
resolution; diff reports a change of them as a change of kernel."""

from __future__ import annotations

from gdn.backends.fla_choices import kernel_text
from gdn.matrix.markdown import md_table
from gdn.matrix.schema import Report


def markdown(report: Report) -> list[str]:
    rows = []
    for cell in report.cells:
        # fla's section as the probe wrote it (gdn.backends.fla_choices reads it)
        entry = cell.peer_kernels.get("fla")
        if entry is None:
            continue
        packages = ", ".join(f"{k} {v}" for k, v in entry["peer_packages"].items()) or "—"
        stand_in = f" [stand-in: {entry['stand_in']}]" if entry.get("stand_in") else ""
        rows.append([cell.name, f"fla {entry['version']}{stand_in}", kernel_text(entry), packages])
    if not rows:
        return []
    return ["## Peer kernels", "", *md_table(["cell", "peer", "kernel it runs", "beside"], rows)]
