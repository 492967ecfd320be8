"""The per-cell speed table of the report: every backend's time per (op, shape, pass), fastest first,
with its ratio to the fastest, peak memory, what actually ran, and the reason where nothing was timed.
Built from the typed rows of the cells' bench.json (gdn.matrix.schema)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gdn.matrix.markdown import md_table
from gdn.matrix.report_text import bench_label
from gdn.matrix.schema import BenchRow, Report, ReportCell, shape_text

HEADER = ["op", "shape", "pass", "backend", "ran", "ms", "× fastest", "peak GiB", "first call s", "note"]


def parse_rows(raw: Any) -> tuple[list[BenchRow], list[str]]:
    """The typed rows of a list of bench rows, and a problem per row that does not validate. Rows of
    the older untyped form (impl, no backend) are not speed-table rows: they are skipped."""
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(BenchRow)
    rows, problems = [], []
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict) or "backend" not in item:
            continue
        try:
            rows.append(adapter.validate_python(item, strict=False))
        except ValidationError as exc:
            problems.append(f"bench.json row #{i} is not a bench row: {exc.errors()[0]['msg']}")
    return rows, problems


def cell_rows(cell: ReportCell) -> list[BenchRow]:
    rows, _ = parse_rows(cell.bench)
    return rows


def bench_index(cell: ReportCell, backend: str | None = None) -> dict[str, tuple[str, float]]:
    """(label, ms) per benchmark row (of that backend only, if one is named), keyed on op + backend +
    shape + pass. The rows are bench.json's as written, older untyped ones among them."""
    index = {}
    for row in cell.bench or []:
        ms = row.get("ms") if isinstance(row, dict) else None
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
            row_backend = row.get("backend") or row.get("impl")
            if backend is not None and row_backend != backend:
                continue
            fields = [row.get("op"), row_backend, row.get("shape"), row.get("pass")]
            key = json.dumps(fields, sort_keys=True, default=str)
            index[key] = (bench_label(row), float(ms))
    return index


def row_problems(rows: list[dict[str, Any]]) -> list[str]:
    return parse_rows(rows)[1]


def _order(row: BenchRow) -> tuple:
    timed = row.ms is not None
    return (row.op, shape_text(row.shape), row.pass_, not timed, row.ms if timed else 0.0, row.backend)


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(rows: Iterable[BenchRow]) -> list[list[str]]:
    """The table's rows as text, grouped by (op, shape, pass), fastest first, untimed rows last."""
    out = []
    for row in sorted(rows, key=_order):
        fastest = row.ratio_to_fastest == 1.0
        note = row.reason or row.note or ""
        if row.reason and row.note:
            note = f"{row.reason} ({row.note})"
        elif row.ms is not None and row.note:
            note = row.note
        out.append(
            [
                row.op,
                shape_text(row.shape),
                row.pass_,
                f"**{row.backend}**" if fastest else row.backend,
                row.implementation or "—",
                _num(row.ms, 3),
                "—" if row.ratio_to_fastest is None else f"{row.ratio_to_fastest:.2f}×",
                _num(row.peak_gib, 2),
                _num(row.first_call_s, 1),
                note,
            ]
        )
    return out


def markdown(report: Report) -> list[str]:
    """The '## Speed' section: one table per cell that has typed bench rows."""

    lines: list[str] = []
    for cell in report.cells:
        rows = cell_rows(cell)
        if rows:
            lines += [f"### {cell.name}", "", *md_table(HEADER, table(rows))]
    if not lines:
        return []
    legend = "Fastest of each (op, shape, pass) in bold; × fastest is the time over the fastest's."
    return ["## Speed", "", legend, "", *lines]


def html(cell: ReportCell) -> str | None:
    """The cell's speed table as an HTML table built from escaped parts (None without rows)."""
    from markupsafe import escape

    rows = cell_rows(cell)
    if not rows:
        return None
    parts = ['<table class="speed">', "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in HEADER) + "</tr>"]
    for cells in table(rows):
        fastest = cells[3].startswith("**")
        cells[3] = cells[3].strip("*")
        attrs = ' class="fastest"' if fastest else ""
        parts.append(f"<tr{attrs}>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    return "".join(parts)
