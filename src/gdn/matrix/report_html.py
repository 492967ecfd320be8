"""report.html: the matrix report as one self-contained page (templates/report.html.j2, autoescaped),
with each cell's benchmark bars, speed table and accuracy plot built here from escaped parts."""

from __future__ import annotations

import math
from typing import Any

from gdn.matrix import accuracy_report, kernel_report, speed
from gdn.matrix.accuracy.table import case_text, error_text, kernels_text
from gdn.matrix.report_parts import (
    accelerator_missing,
    card_text,
    cell_primary_device,
    duration_text,
    expectation_state,
    family_state,
    family_text,
    hardware_note,
    interrupted_text,
    lock_text,
    not_candidates_text,
    pin_text,
    report_families,
    resolution_state,
    route_text,
    runtime_text,
    status_text,
    version_columns,
)
from gdn.matrix.report_text import bench_label, label_text
from gdn.matrix.schema import Report

# the page has room for more than a job summary, but a broken stack can fail thousands of grid tests
HTML_FAILURES_SHOWN = 200
TEMPLATE = "report.html.j2"


def _timed(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    timed = []
    for row in rows:
        ms = row.get("ms")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms >= 0:
            timed.append((bench_label(row), float(ms)))
    return timed


def bench_svg(rows: list[dict[str, Any]] | None) -> str | None:
    """Horizontal bars of each benchmark row's time, labelled, on one linear ms scale."""
    from markupsafe import escape

    timed = _timed(rows or [])
    if not timed:
        return None
    bar_h, gap, label_w, plot_w, value_w = 18, 6, 380, 420, 90
    longest = max(ms for _, ms in timed) or 1.0
    height = len(timed) * (bar_h + gap) + gap
    width = label_w + plot_w + value_w
    parts = [
        f'<svg class="bench" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="op timings in ms">'
    ]
    for i, (label, ms) in enumerate(timed):
        y = gap + i * (bar_h + gap)
        bar = max(1.0, plot_w * ms / longest)
        text_y = y + bar_h - 5
        parts += [
            f'<text x="{label_w - 8}" y="{text_y}" text-anchor="end">{escape(label)}</text>',
            f'<rect x="{label_w}" y="{y}" width="{bar:.1f}" height="{bar_h}"><title>{escape(label)}: {ms:.4g} ms'
            "</title></rect>",
            f'<text x="{label_w + bar + 6:.1f}" y="{text_y}">{ms:.3g} ms</text>',
        ]
    parts.append("</svg>")
    return "".join(parts)


def html_environment():
    """The pages' jinja2 environment: the package's templates, autoescaped, with the report's helpers."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gdn.matrix", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["route_text"] = route_text
    env.filters["duration"] = duration_text
    env.globals.update(
        family_text=family_text,
        family_state=family_state,
        resolution_state=resolution_state,
        hardware_note=hardware_note,
        interrupted_text=interrupted_text,
        expectation_state=expectation_state,
        label_text=label_text,
        card_text=card_text,
        status_text=status_text,
        not_candidates_text=not_candidates_text,
        runtime_text=runtime_text,
        lock_text=lock_text,
        pin_text=pin_text,
        primary_device=cell_primary_device,
        accelerator_missing=accelerator_missing,
        shown_kernels=kernel_report.shown,
        kernel_line=kernel_report.kernel_line,
        comparison_text=kernel_report.comparison_text,
        peer_dispatch=kernel_report.peer_dispatch,
        accuracy_case=case_text,
        accuracy_peers=kernels_text,
        accuracy_worst=accuracy_report.worst_name,
        error_text=error_text,
    )
    return env


def render_html(report: Report) -> str:
    from markupsafe import Markup

    template = html_environment().get_template(TEMPLATE)
    # built from escaped parts in bench_svg, speed.html and accuracy_report.svg, so marked safe here and nowhere else
    plots = {c.name: Markup(svg) for c in report.cells if (svg := bench_svg(c.bench))}
    speed_tables = {c.name: Markup(table) for c in report.cells if (table := speed.html(c))}
    accuracy_plots = {c.name: Markup(svg) for c in report.cells if (svg := accuracy_report.svg(c))}
    counts: dict[str, int] = {}
    for cell in report.cells:
        counts[cell.status] = counts.get(cell.status, 0) + 1
    return template.render(
        report=report,
        families=report_families(report),
        version_columns=version_columns(report),
        plots=plots,
        speed_tables=speed_tables,
        accuracy_plots=accuracy_plots,
        status_counts=counts,
        failures_shown=HTML_FAILURES_SHOWN,
    )
