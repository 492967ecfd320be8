"""The accuracy table as the report shows it and the diff gates it: each cell's accuracy.json rows
(every backend's error per op, dtype, gate regime, layout and quantity against fp64 references), the
worst quantity of each row marked, a plot for report.html, and the regressions between two reports.

An error regresses when it grows past `factor` times its old value (default 2) and past a floor per
dtype, below which a change is rounding, not a finding; an error that becomes non-finite, and a row that
was measured and no longer is, regress too. Each regression names op, backend, dtype, regime, layout and
quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gdn.matrix.accuracy.table import case_text, error_text, kernels_text, outcome_text
from gdn.matrix.markdown import md_cell, md_table
from gdn.matrix.schema import AccuracyRow, ReportCell

DEFAULT_FACTOR = 2.0
# errors under these are rounding whatever their ratio: fp32 kernels sit at 1e-7-1e-6, bf16 at 1e-3-5e-3
FLOORS = {"float32": 1e-5, "bfloat16": 5e-3, "float16": 5e-3}


def _row_key(row: AccuracyRow) -> tuple[str, str, str, str | None, str | None]:
    return (row.op, row.backend, row.dtype, row.regime, row.layout)


def worst(row: AccuracyRow) -> tuple[str, float | None] | None:
    if not row.errors:
        return None
    return max(row.errors.items(), key=lambda item: math.inf if item[1] is None else item[1])


# ---------------------------------------------------------------- report.md and report.html


def markdown(cells: list[ReportCell]) -> list[str]:
    lines: list[str] = []
    for cell in cells:
        found = cell.accuracy
        if found is None:
            continue
        shape = " ".join(f"{k}={v}" for k, v in found.shape.items())
        rows = [
            [
                r.op,
                md_cell(r.route or r.backend),
                case_text(r),
                md_cell(marked(r, "**")),
                md_cell(kernels_text(r) or "—"),
            ]
            for r in found.rows
        ]
        lines += [f"### Accuracy: {cell.name} ({found.device}, {shape})", ""]
        lines += [*md_table(["op", "backend", "case", "||out - ref|| / ||ref|| (worst in bold)", "peer kernels"], rows)]
        lines += [f"- {name}: not measured here: {md_cell(why)}" for name, why in found.unavailable.items()]
        lines.append("")
    return ["## Accuracy (against fp64 references)", "", *lines] if lines else []


def marked(row: AccuracyRow, mark: str) -> str:
    """The row's errors with its worst between `mark`s (markdown's **), or why it has none."""
    found = worst(row)
    if found is None:
        return outcome_text(row)
    name, _ = found
    texts = {q: f"{q} {error_text(e)}" for q, e in row.errors.items()}
    return ", ".join(f"{mark}{text}{mark}" if q == name else text for q, text in texts.items())


LOG_MIN, LOG_MAX = -8, 0  # the plot's decades: 1e-8 .. 1


def worst_name(row: AccuracyRow) -> str | None:
    found = worst(row)
    return None if found is None else found[0]


def svg(cell: ReportCell) -> str | None:
    """Each measured row's worst error as a bar on a log scale (1e-8 .. 1), labelled; None without rows.
    Built from escaped parts (report.html marks it safe)."""
    from markupsafe import escape

    bars = []
    for row in cell.accuracy.rows if cell.accuracy else []:
        found = worst(row)
        if found is not None:
            bars.append((f"{row.op} · {row.route or row.backend} · {case_text(row)} · {found[0]}", found[1]))
    if not bars:
        return None
    bar_h, gap, label_w, plot_w, value_w = 16, 4, 560, 400, 90
    height = len(bars) * (bar_h + gap) + gap + 18
    width = label_w + plot_w + value_w

    def x(value: float | None) -> float:
        if value is None:
            return float(plot_w)
        decade = min(max(math.log10(max(value, 1e-300)), LOG_MIN), LOG_MAX)
        return max(1.0, plot_w * (decade - LOG_MIN) / (LOG_MAX - LOG_MIN))

    parts = [
        f'<svg class="accuracy" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="worst relative error per row, log scale">'
    ]
    for decade in range(LOG_MIN, LOG_MAX + 1):
        gx = label_w + plot_w * (decade - LOG_MIN) / (LOG_MAX - LOG_MIN)
        parts += [
            f'<line x1="{gx:.1f}" x2="{gx:.1f}" y1="0" y2="{height - 18}" class="grid"/>',
            f'<text x="{gx:.1f}" y="{height - 4}" text-anchor="middle">1e{decade}</text>',
        ]
    for i, (label, value) in enumerate(bars):
        y = gap + i * (bar_h + gap)
        width_bar, text_y = x(value), y + bar_h - 4
        kind = ' class="nonfinite"' if value is None else ""
        parts += [
            f'<text x="{label_w - 8}" y="{text_y}" text-anchor="end">{escape(label)}</text>',
            f'<rect x="{label_w}" y="{y}" width="{width_bar:.1f}" height="{bar_h}"{kind}>'
            f"<title>{escape(label)}: {error_text(value)}</title></rect>",
            f'<text x="{label_w + width_bar + 6:.1f}" y="{text_y}">{error_text(value)}</text>',
        ]
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- diff


@dataclass
class AccuracyRegression:
    cell: str
    op: str
    backend: str
    dtype: str
    regime: str | None
    layout: str | None
    quantity: str | None
    old: float | None
    new: float | None
    why: str

    def text(self) -> str:
        case = " ".join(p for p in (self.dtype, self.regime, self.layout) if p)
        what = f"{self.op} · {self.backend} · {case}" + (f" · {self.quantity}" if self.quantity else "")
        return f"{self.cell}: {what}: {self.why}"


def regressions(name: str, old: ReportCell, new: ReportCell, factor: float) -> list[AccuracyRegression]:
    """The errors of `new` that grew past `factor` times `old`'s and past the dtype's floor, became
    non-finite, or are no longer measured."""
    before = {_row_key(r): r for r in (old.accuracy.rows if old.accuracy else [])}
    found = []
    for row in new.accuracy.rows if new.accuracy else []:
        previous = before.get(_row_key(row))
        if previous is None or previous.status != "measured":
            continue
        base = (name, row.op, row.backend, row.dtype, row.regime, row.layout)
        if row.status != "measured":
            why = f"no longer measured ({row.status}: {row.reason})"
            found.append(AccuracyRegression(*base, None, None, None, why))
            continue
        floor = FLOORS.get(row.dtype, 0.0)
        for quantity, was in previous.errors.items():
            if quantity not in row.errors:
                continue
            now = row.errors[quantity]
            if was is None:
                continue  # it was not finite before: no growth to measure
            if now is None:
                found.append(AccuracyRegression(*base, quantity, was, None, f"{error_text(was)} → not finite"))
            elif now > floor and now > factor * was:
                ratio = now / was if was > 0 else math.inf
                why = f"{error_text(was)} → {error_text(now)} ({ratio:.3g}x, over {factor:g}x and the floor {floor:g})"
                found.append(AccuracyRegression(*base, quantity, was, now, why))
    return found


def regression_rows(items: list[AccuracyRegression]) -> list[list[str]]:
    return [
        [r.cell, r.op, r.backend, r.dtype, r.regime or "—", r.layout or "—", r.quantity or "—", r.why] for r in items
    ]


REGRESSION_COLUMNS = ["cell", "op", "backend", "dtype", "regime", "layout", "quantity", "error"]


def regression_markdown(items: list[AccuracyRegression]) -> list[str]:
    return md_table(REGRESSION_COLUMNS, regression_rows(items)) if items else []
