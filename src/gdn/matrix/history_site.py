"""The history's static site: one self-contained page (templates/history.html.j2, autoescaped, the
report's stylesheet, no scripts, nothing fetched) showing each cell across the kept reports: its status
over time, the backend resolved per op, the kernels its peers dispatched, speed and accuracy rows
plotted as inline SVG, the lock and version changes between reports, and the last known good stack."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gdn.matrix import schema, speed
from gdn.matrix.accuracy.table import case_text
from gdn.matrix.accuracy_report import worst
from gdn.matrix.diff import lock_change, version_changes
from gdn.matrix.history_store import StoredEntry, read_entries, read_report
from gdn.matrix.jsonio import atomic_write
from gdn.matrix.kernel_report import kernel_line, peer_dispatch
from gdn.matrix.report_html import html_environment
from gdn.matrix.report_parts import cell_primary_device, resolution_state, route_text
from gdn.matrix.schema import Report, ReportCell

TEMPLATE = "history.html.j2"
PAGE = "index.html"


@dataclass
class KeptReport:
    """One kept report as the site reads it: its entry and its report.json (None where that file no
    longer validates: the page says so and shows the entry's column empty)."""

    stored: StoredEntry
    report: Report | None

    @property
    def key(self) -> str:
        return self.stored.entry.key

    @property
    def generated_at(self) -> str:
        return self.stored.entry.generated_at


@dataclass
class Series:
    """One row plotted across the reports: a label and a value per report (None: not measured there)."""

    label: str
    values: list[float | None]
    unit: str
    log: bool

    @property
    def latest(self) -> float | None:
        return next((v for v in reversed(self.values) if v is not None), None)

    def svg(self, dates: list[str]) -> str:
        return series_svg(self.values, dates, self.unit, log=self.log)


@dataclass
class OpRow:
    op: str
    # per report: (route text, resolution state for its colour, changed since the previous report)
    routes: list[tuple[str, str, bool]]


@dataclass
class Change:
    generated_at: str
    lines: list[str]


@dataclass
class KnownGood:
    generated_at: str
    key: str
    versions: dict[str, str]
    lock: str | None


@dataclass
class CellHistory:
    name: str
    # per report, oldest first: the cell's entry there (None: the report has no such cell)
    cells: list[ReportCell | None]
    ops: list[OpRow] = field(default_factory=list)
    peers: list[tuple[str, list[str]]] = field(default_factory=list)
    speed: list[Series] = field(default_factory=list)
    accuracy: list[Series] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    last_good: KnownGood | None = None


def read_reports(history: Path) -> tuple[list[KeptReport], list[str]]:
    entries, problems = read_entries(history)
    reports = []
    for stored in entries:
        try:
            report = read_report(stored)
        except schema.SchemaError as exc:
            problems.append(f"{stored.entry.key}: {exc}")
            report = None
        reports.append(KeptReport(stored, report))
    return reports, problems


def _series(
    cells: list[ReportCell | None],
    points: Callable[[ReportCell], Iterable[tuple[str, float | None]]],
    unit: str,
    log: bool,
) -> list[Series]:
    values: dict[str, list[float | None]] = {}
    for i, cell in enumerate(cells):
        for label, value in points(cell) if cell else ():
            values.setdefault(label, [None] * len(cells))[i] = value
    return [Series(label, row, unit, log) for label, row in sorted(values.items())]


def _speed_points(cell: ReportCell) -> Iterable[tuple[str, float | None]]:
    for row in speed.cell_rows(cell):
        op, backend, shape, pass_ = row.key()
        yield f"{op} · {backend} · {shape} · {pass_}", row.ms


def _accuracy_points(cell: ReportCell) -> Iterable[tuple[str, float | None]]:
    for row in cell.accuracy.rows if cell.accuracy else []:
        found = worst(row)
        if found is not None:  # None: refused, errored or not run; its reason is in that report
            yield f"{row.op} · {row.backend} · {case_text(row)}", found[1]


def _ops(ops: list[str], cells: list[ReportCell | None]) -> list[OpRow]:
    rows = []
    for op in ops:
        routes, before = [], None
        for cell in cells:
            entry = cell.resolution.get(op, {}).get(cell_primary_device(cell)) if cell else None
            text = route_text(entry) if cell else ""
            changed = cell is not None and before is not None and text != before
            routes.append((text, resolution_state(entry) if cell else "none", changed))
            before = text if cell else before
        rows.append(OpRow(op, routes))
    return rows


def _changes(name: str, reports: list[KeptReport], cells: list[ReportCell | None]) -> list[Change]:
    changes, previous = [], None
    for report, cell in zip(reports, cells, strict=True):
        if cell is None:
            continue
        if previous is not None:
            lines = [f"{c.package}: {c.old or '—'} -> {c.new or '—'}" for c in version_changes(name, previous, cell)]
            locked = lock_change(name, previous, cell)
            if locked is not None:
                lines.append(locked.text.removeprefix(f"cell {name}: "))
            if lines:
                changes.append(Change(report.generated_at, lines))
        previous = cell
    return changes


def _last_good(reports: list[KeptReport], cells: list[ReportCell | None]) -> KnownGood | None:
    for report, cell in reversed(list(zip(reports, cells, strict=True))):
        if cell is not None and cell.status == "passed":
            versions = {k: v for k, v in cell.versions.items() if v}
            return KnownGood(report.generated_at, report.key, versions, cell.lock.digest if cell.lock else None)
    return None


def cell_histories(reports: list[KeptReport]) -> list[CellHistory]:
    names = list(dict.fromkeys(c.name for r in reports if r.report for c in r.report.cells))
    ops = list(dict.fromkeys(op for r in reports if r.report for op in r.report.ops))
    histories = []
    for name in names:
        cells = [next((c for c in r.report.cells if c.name == name), None) if r.report else None for r in reports]
        history = CellHistory(name, cells)
        history.ops = _ops(ops, cells)
        history.peers = [
            (r.generated_at, sorted({f"{step}: {kernel_line(k)}" for step, k in peer_dispatch(c)}))
            for r, c in zip(reports, cells, strict=True)
            if c is not None and peer_dispatch(c)
        ]
        history.speed = _series(cells, _speed_points, "ms", log=False)
        history.accuracy = _series(cells, _accuracy_points, "||d||/||ref||", log=True)
        history.changes = _changes(name, reports, cells)
        history.last_good = _last_good(reports, cells)
        histories.append(history)
    return histories


def series_svg(values: list[float | None], dates: list[str], unit: str, *, log: bool) -> str:
    """A small line plot of one row across the reports (x: report, oldest left; y: linear, or log10
    for errors), each point titled with its report's time and value. Built from escaped parts."""
    from markupsafe import escape

    step, height, pad = 36, 40, 8
    width = pad * 2 + step * max(len(values) - 1, 1)
    shown = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v) and (v > 0 or not log)]
    scale = [math.log10(v) if log else v for _, v in shown]
    low, high = (min(scale), max(scale)) if scale else (0.0, 1.0)

    def y(value: float) -> float:
        if high == low:  # one value, or the same in every report: a level line in the middle
            return height / 2
        return pad + (height - 2 * pad) * (1 - ((math.log10(value) if log else value) - low) / (high - low))

    parts = [
        f'<svg class="series" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(unit)} per report">',
        f'<line class="axis" x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}"/>',
    ]
    coords = [(pad + step * i, y(v)) for i, v in shown]
    if len(coords) > 1:
        parts.append(f'<polyline points="{" ".join(f"{x:.1f},{yy:.1f}" for x, yy in coords)}"/>')
    for (i, v), (x, yy) in zip(shown, coords, strict=True):
        title = f"{escape(dates[i])}: {v:.3g} {escape(unit)}"
        parts.append(f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="3"><title>{title}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def render_site(reports: list[KeptReport], problems: list[str]) -> str:
    from markupsafe import Markup

    histories = cell_histories(reports)
    dates = [r.generated_at for r in reports]
    # built from escaped parts in series_svg, so marked safe here and nowhere else
    plots = {
        (h.name, kind, s.label): Markup(s.svg(dates))
        for h in histories
        for kind, rows in (("speed", h.speed), ("accuracy", h.accuracy))
        for s in rows
    }
    template = html_environment().get_template(TEMPLATE)
    return template.render(reports=reports, histories=histories, problems=problems, plots=plots)


def write_site(history: Path, out: Path) -> Path:
    """Render `history` into `out`/index.html; its path."""
    reports, problems = read_reports(history)
    page = out / PAGE
    atomic_write(page, render_site(reports, problems))
    page.chmod(0o644)  # a site is served to readers: atomic writes leave a file 0600
    return page
