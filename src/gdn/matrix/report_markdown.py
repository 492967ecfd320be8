"""report.md: the matrix report sized for a GitHub job summary (gdn.matrix.markdown.fit_summary cuts
what does not fit, naming where the whole is)."""

from __future__ import annotations

import re

from gdn.matrix import accuracy_report, kernel_report, peers, speed
from gdn.matrix.markdown import cut, fit_summary, md_cell, md_table
from gdn.matrix.report_build import NOT_RAN
from gdn.matrix.report_parts import (
    accelerator_missing,
    card_text,
    cell_primary_device,
    duration_text,
    family_state,
    family_text,
    hardware_note,
    interrupted_text,
    lock_text,
    not_candidates_text,
    pin_text,
    report_families,
    route_text,
    runtime_text,
    status_text,
    version_columns,
)
from gdn.matrix.report_text import expectation_text, label_text
from gdn.matrix.schema import Report

FAILURES_SHOWN = 20
# a cell's problems and notes in report.md (report.json has them all)
NOTES_SHOWN = 20
LOG_LINE_CHARS = 500
LOG_LINES_SHOWN = 40

STATUS_ICONS = {
    "passed": "✅",
    "flaky": "🔁",
    "failed": "❌",
    "error": "💥",
    "timeout": "⏱️",
    "build_failed": "🧱",
    "not_run": "⚪",
    "interrupted": "⏹️",
}


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks inside the text."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _md_summary(report: Report) -> list[str]:
    rows = [
        [
            c.name,
            f"{STATUS_ICONS.get(c.status, '')} {status_text(c.status)}",
            c.device,
            card_text(c),
            runtime_text(c),
            lock_text(c),
            duration_text(c.duration_s),
            c.reason,
        ]
        for c in report.cells
    ]
    header = ["cell", "status", "device", "card", "runtime", "lock", "duration", "reason"]
    return ["## Cells", "", *md_table(header, rows)]


def _md_resolution(report: Report) -> list[str]:
    rows, off_device = [], False
    for cell in report.cells:
        device = cell_primary_device(cell)
        marker = ""
        if accelerator_missing(cell):
            marker, off_device = " †", True
        routes = [route_text(cell.resolution.get(op, {}).get(device)) for op in report.ops]
        rows.append([f"{cell.name} ({device}){marker}", *routes, not_candidates_text(cell) or None])
    lines = ["## Resolved backends", "", *md_table(["cell", *report.ops, "not candidates"], rows)]
    if off_device:
        lines += ["† the cell's accelerator was not visible: these are its cpu resolutions.", ""]
    return lines


def _md_families(report: Report) -> list[str]:
    families = report_families(report)
    icons = {"passed": " ✅", "failed": " ❌"}
    rows = []
    for cell in report.cells:
        counts = cell.families
        row = [cell.name]
        for family in families:
            state = family_state(counts.get(family), cell.status)
            row.append(family_text(counts.get(family), cell.status) + icons.get(state, ""))
        rows.append(row)
    return ["## Tests", "", *md_table(["cell", *families], rows)]


def _md_versions(report: Report) -> list[str]:
    columns = version_columns(report)
    if not columns:
        return []
    rows = [[c.name, *(c.versions.get(k) for k in columns)] for c in report.cells]
    return ["## Versions", "", *md_table(["cell", *columns], rows)]


def _md_pins(report: Report) -> list[str]:
    """Cells that ran outside their image, or whose environment lacked a pin: what they ran is not what
    the cell pins, and their results are read with that in mind."""
    lines = []
    for cell in report.cells:
        differences = cell.pin_differences
        outside = cell.matrix_runtime not in (None, cell.runtime) and cell.status not in NOT_RAN
        if not (differences or outside):
            continue
        head = f"- **{cell.name}**" + (f" (runtime {runtime_text(cell)})" if outside else "")
        if differences is None:
            text = "pins not compared: no manifest"
        else:
            text = "; ".join(pin_text(cell, d) for d in differences) or "every pin matches"
        lines.append(f"{head}: {md_cell(text)}")
    return ["## Differences from the pins", "", *lines, ""] if lines else []


def _md_not_run(report: Report) -> list[str]:
    cells = [c for c in report.cells if c.status == "not_run"]
    if not cells:
        return []
    return ["## Not run", "", *(f"- **{c.name}**: {md_cell(c.reason)}" for c in cells), ""]


def _md_notes(report: Report) -> list[str]:
    """Per cell: problems, unmet expectations, stand-in hardware."""
    lines = []
    for cell in report.cells:
        notes = [f"problem: {p}" for p in cell.problems]
        if cell.status != "not_run":
            unmet = [e for e in cell.expectations if e.ok is False]
            notes += [f"expectation not met: {expectation_text(e)}" for e in unmet]
        if note := hardware_note(cell):
            notes.append(note)
        if cell.status != "interrupted" and (note := interrupted_text(cell)):
            notes.append(note)
        lines += [f"- **{cell.name}**: {md_cell(n)}" for n in notes[:NOTES_SHOWN]]
        if len(notes) > NOTES_SHOWN:
            lines.append(f"- **{cell.name}**: … and {len(notes) - NOTES_SHOWN} more (see report.json)")
    return ["## Problems", "", *lines, ""] if lines else []


def _md_failures(report: Report) -> list[str]:
    lines = []
    for cell in report.cells:
        failed = cell.failures
        if not failed:
            continue
        lines += [f"### {cell.name}: {len(failed)} failing", ""]
        for f in failed[:FAILURES_SHOWN]:
            message = f": {md_cell(f.message)[:300]}" if f.message else ""
            lines.append(f"- `{f.test}` ({f.outcome}{label_text(f)}){message}")
            ran = kernel_report.shown(f.kernels)
            lines += [f"  - ran: {md_cell(kernel_report.kernel_line(k))}" for k in ran]
        if len(failed) > FAILURES_SHOWN:
            lines.append(f"- … and {len(failed) - FAILURES_SHOWN} more (see report.json)")
        lines.append("")
    return ["## Failures", "", *lines] if lines else []


def _md_logs(report: Report) -> list[str]:
    lines = []
    for cell in report.cells:
        tail = cell.log_tail
        if not tail or cell.status == "passed":
            continue
        text = "\n".join(cut(line, LOG_LINE_CHARS) for line in tail.splitlines()[-LOG_LINES_SHOWN:])
        fence = _fence(text)
        lines += [f"<details><summary>{cell.name}: log tail</summary>", "", fence, text, fence, "", "</details>", ""]
    return ["## Logs", "", *lines] if lines else []


def _md_comparisons(report: Report) -> list[str]:
    return kernel_report.comparisons_markdown(report.cells)


def _md_kernels(report: Report) -> list[str]:
    return kernel_report.peers_markdown(report.cells)


def _md_accuracy(report: Report) -> list[str]:
    return accuracy_report.markdown(report.cells)


def render_markdown(report: Report) -> str:
    lines = ["# gdn-matrix report", "", f"Generated {report.generated_at}.", ""]
    for section in (
        _md_summary,
        _md_resolution,
        peers.markdown,
        _md_families,
        _md_comparisons,
        _md_versions,
        speed.markdown,
        _md_accuracy,
        _md_pins,
        _md_not_run,
        _md_notes,
        _md_failures,
        _md_kernels,
        _md_logs,
    ):
        lines += section(report)
    return fit_summary("\n".join(lines).rstrip() + "\n", "report is in report.json and report.html")
